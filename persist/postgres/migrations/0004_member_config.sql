-- 0004: each member row says which ring it builds (partition count) and
-- which inter-node protocol it speaks, so a node that disagrees with the
-- live members refuses to join instead of computing another ring.
-- version is the build a member runs (sequencer version), for operators.
ALTER TABLE cluster_member
  ADD COLUMN partitions INT  NOT NULL DEFAULT 0,
  ADD COLUMN protocol   INT  NOT NULL DEFAULT 0,
  ADD COLUMN version    TEXT NOT NULL DEFAULT '';
