-- 0009 on Citus: migrations/0009 (the read-receipt index on
-- (conv_id, read_seq)), built shard by shard in this transaction.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
CREATE INDEX read_position_by_seq ON read_position (conv_id, read_seq);
