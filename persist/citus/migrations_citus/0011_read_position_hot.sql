-- 0011 on Citus: migrations/0011 (read_position loses read_position_by_seq,
-- its pages keep room for HOT updates), shard by shard in this transaction.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
DROP INDEX IF EXISTS read_position_by_seq;
ALTER TABLE read_position SET (fillfactor = 80);
