-- 0006: read receipts (persist/postgres/migrations/0009 mirrored). How many
-- users read up to a seq (ReadCounts) is one range of read_position_by_seq;
-- listing a conversation's positions by uid (ReadPositionsPage) one range
-- of read_position_by_conv (the primary key leads with uid).
ALTER TABLE read_position
  ADD INDEX read_position_by_seq (conv_id, read_seq),
  ADD INDEX read_position_by_conv (conv_id, uid);
