-- 0007: read_position loses read_position_by_seq (0005), as on PostgreSQL
-- (persist/postgres/migrations/0011): every raise of a position (MarkRead,
-- and the own-send rule in each commit) rewrote its entry there too. The
-- table is WITHOUT ROWID, keyed (conv_id, uid), so ReadCounts reads one
-- conversation's positions, read_seq with them, from the primary key.
DROP INDEX IF EXISTS read_position_by_seq;
