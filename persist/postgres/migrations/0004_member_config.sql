-- 0004: each member row says which ring it builds (partition count) and
-- which inter-node protocol it speaks, so a node that disagrees with the
-- live members refuses to join instead of computing another ring.
ALTER TABLE cluster_member
  ADD COLUMN partitions INT NOT NULL DEFAULT 0,
  ADD COLUMN protocol   INT NOT NULL DEFAULT 0;
