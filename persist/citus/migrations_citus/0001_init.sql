-- 0001 on Citus (replaces migrations/0001_init.sql when the database has the
-- citus extension; see docs/CITUS.md). The conversation tables are
-- distributed by conv_id and co-located (a conversation's head and rows live
-- in shards of the same index, on the same worker); every unique key holds
-- conv_id, as Citus requires. The control tables are plain tables of the
-- coordinator: off the hot path, consistent in one place.
--
-- The shard count is the session's citus.shard_count when this runs: set it
-- in the --store DSN (?options=-c%20citus.shard_count%3D16) at the first
-- migrate; Citus's default is 32.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

-- epoch: the partition epoch of the last owner that moved the head. A
-- commit moves the head only by compare-and-set, and only with an epoch at
-- least this one (commit.go, "Fencing on Citus").
CREATE TABLE conv_head (
  conv_id VARCHAR(64) PRIMARY KEY,
  head    BIGINT      NOT NULL,
  epoch   BIGINT      NOT NULL DEFAULT 0
);
SELECT create_distributed_table('conv_head', 'conv_id');

CREATE TABLE im_message (
  msg_id        BIGINT       NOT NULL,            -- snowflake, global (leased worker ids), never reused
  conv_id       VARCHAR(64)  NOT NULL,            -- conversation id, the distribution column
  seq           BIGINT       NOT NULL,
  from_uid      BIGINT       NOT NULL,
  msg_type      SMALLINT     NOT NULL DEFAULT 1,
  body          BYTEA        NOT NULL,
  client_msg_id VARCHAR(64)  NOT NULL,
  server_at     TIMESTAMPTZ(3) NOT NULL,
  PRIMARY KEY (conv_id, msg_id),
  CONSTRAINT uk_conv_seq    UNIQUE (conv_id, seq),
  CONSTRAINT uk_from_client UNIQUE (conv_id, from_uid, client_msg_id)
);
SELECT create_distributed_table('im_message', 'conv_id', colocate_with => 'conv_head');
-- GetMessage (by msg_id) and FindByClientKey look in every shard: each
-- shard answers from an index.
CREATE INDEX im_message_msg_id ON im_message (msg_id);
CREATE INDEX im_message_client ON im_message (from_uid, client_msg_id);

CREATE TABLE worker_lease (
  worker_id  SMALLINT PRIMARY KEY,
  holder     TEXT,
  token      BIGINT,
  expires_at TIMESTAMPTZ(3),
  last_ms    BIGINT
);
INSERT INTO worker_lease (worker_id, holder, token, expires_at, last_ms)
SELECT g, NULL, 0, NULL, 0 FROM generate_series(0, 1023) AS g;

CREATE TABLE partition_lease (
  partition  INT PRIMARY KEY,
  owner      TEXT   NOT NULL,
  epoch      BIGINT NOT NULL,
  expires_at TIMESTAMPTZ(3)
);
