-- 0005: read positions. One row per (conversation, user) that marked
-- something read; read_seq only moves up (GREATEST) and never past the
-- conversation's head (LEAST with conv_head in the same statement). The
-- primary key leads with conv_id, the shard key, so the table co-locates
-- with the conversation on a distributed PostgreSQL. Retention never
-- touches this table.

CREATE TABLE read_position (
  conv_id  VARCHAR(64) NOT NULL,
  uid      BIGINT      NOT NULL,
  read_seq BIGINT      NOT NULL,
  PRIMARY KEY (conv_id, uid)
);
