-- 0001: messages (docs/API.md, "Storage schema", exactly), conversation heads, worker-id
-- leases and partition leases.

CREATE TABLE im_message (
  msg_id        BIGINT       NOT NULL,            -- snowflake, global, never reused
  conv_id       VARCHAR(64)  NOT NULL,            -- conversation id, also the shard key
  seq           BIGINT       NOT NULL,            -- per-conversation, 1,2,3,... no gaps
  from_uid      BIGINT       NOT NULL,
  msg_type      SMALLINT     NOT NULL DEFAULT 1,
  body          BYTEA        NOT NULL,            -- opaque (already encrypted) payload
  client_msg_id VARCHAR(64)  NOT NULL,            -- client UUID, never empty
  server_at     TIMESTAMPTZ(3) NOT NULL,          -- display only, never used to order
  PRIMARY KEY (msg_id),
  CONSTRAINT uk_conv_seq    UNIQUE (conv_id, seq),
  CONSTRAINT uk_from_client UNIQUE (from_uid, client_msg_id)
);

-- The highest seq ever committed per conversation. Commit moves it by
-- compare-and-set; retention (Trim) never touches it, so a conversation
-- continues at head+1 even after its rows were deleted.
CREATE TABLE conv_head (
  conv_id VARCHAR(64) PRIMARY KEY,
  head    BIGINT      NOT NULL
);

-- Snowflake worker ids 0..1023. A row is free when expires_at is NULL or in
-- the past (by the caller's clock). token is bumped on every acquire; last_ms
-- is the highest unix-ms any holder may have issued ids for (never lowered).
CREATE TABLE worker_lease (
  worker_id  SMALLINT PRIMARY KEY,
  holder     TEXT,
  token      BIGINT,
  expires_at TIMESTAMPTZ(3),
  last_ms    BIGINT
);
INSERT INTO worker_lease (worker_id, holder, token, expires_at, last_ms)
SELECT g, NULL, 0, NULL, 0 FROM generate_series(0, 1023) AS g;

-- Partition ownership with epochs (fencing). Every fenced commit checks
-- (owner, epoch) here with FOR SHARE inside its transaction.
CREATE TABLE partition_lease (
  partition  INT PRIMARY KEY,
  owner      TEXT   NOT NULL,
  epoch      BIGINT NOT NULL,
  expires_at TIMESTAMPTZ(3)
);
