-- 0005 on Citus: read positions, distributed by conv_id and co-located with
-- conv_head (a conversation's head and its readers' positions live in
-- shards of the same index, on the same worker), so a mark is a
-- single-shard statement and a read state a co-located join. Retention never
-- touches this table.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

CREATE TABLE read_position (
  conv_id  VARCHAR(64) NOT NULL,
  uid      BIGINT      NOT NULL,
  read_seq BIGINT      NOT NULL,
  PRIMARY KEY (conv_id, uid)
);
SELECT create_distributed_table('read_position', 'conv_id', colocate_with => 'conv_head');
