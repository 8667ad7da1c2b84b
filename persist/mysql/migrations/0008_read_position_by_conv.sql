-- 0008: read_position clustered by (conv_id, uid), with no secondary index
-- (persist/postgres/migrations/0011 mirrored: the own-send rule writes a
-- position in every commit, and each index was a further B-tree insert).
-- InnoDB keeps every column in the primary key's leaves, so ReadCounts
-- scans the conversation's range of the primary key and reads read_seq
-- there; ReadPositionsPage is the same range in uid order; a user's
-- position (MarkRead, ReadStates) is one lookup of the key either way.
-- ONE statement (MySQL's DDL is not transactional: a failure leaves
-- nothing half done); it rebuilds the table (its size: a row per reader
-- per conversation).
ALTER TABLE read_position
  DROP PRIMARY KEY,
  ADD PRIMARY KEY (conv_id, uid),
  DROP INDEX read_position_by_seq,
  DROP INDEX read_position_by_conv;
