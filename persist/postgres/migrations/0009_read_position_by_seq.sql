-- 0009: read receipts. How many users read up to a seq (GetReadReceipts)
-- is one range read of this index (ReadCounts: the positions of one
-- conversation at or above the lowest seq asked, in read_seq order);
-- listing a conversation's positions by uid uses the primary key
-- (conv_id, uid). Every write of a position (MarkRead, and a Send's own-send
-- rule) maintains it.
CREATE INDEX read_position_by_seq ON read_position (conv_id, read_seq);
