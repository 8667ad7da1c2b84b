-- 0011: read_position loses read_position_by_seq (0009). Every write of a
-- position (MarkRead, and the own-send rule in each commit) maintained it,
-- and an index on read_seq kept those updates from being HOT: the own-send
-- rule's statement took about 15 us a row at the bench's many, 7 at hot
-- (docs/BENCHMARKS.md). Read receipts (ReadCounts) now read one
-- conversation's positions by the primary key (conv_id, uid), once per call
-- whatever the number of seqs asked. Room on each page for the updates of
-- read_seq to stay HOT.
DROP INDEX IF EXISTS read_position_by_seq;
ALTER TABLE read_position SET (fillfactor = 80);
