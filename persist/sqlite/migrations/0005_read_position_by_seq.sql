-- 0005: read receipts (persist/postgres/migrations/0009 mirrored). How many
-- users read up to a seq is one range read of this index (ReadCounts);
-- listing a conversation's positions by uid uses the primary key.
CREATE INDEX read_position_by_seq ON read_position (conv_id, read_seq);
