-- 0001: the PostgreSQL schema (persist/postgres/migrations/0001_init.sql)
-- mirrored in SQLite: same tables, columns and constraint names. STRICT
-- tables; BIGINT/SMALLINT are INTEGER, BYTEA is BLOB, VARCHAR(64) is TEXT with
-- a length check (characters, like PostgreSQL), TIMESTAMPTZ(3) is INTEGER
-- unix milliseconds.

CREATE TABLE im_message (
  msg_id        INTEGER NOT NULL,                 -- snowflake, global, never reused
  conv_id       TEXT    NOT NULL CHECK (length(conv_id) <= 64),
  seq           INTEGER NOT NULL,                 -- per-conversation, 1,2,3,... no gaps
  from_uid      INTEGER NOT NULL,
  msg_type      INTEGER NOT NULL DEFAULT 1 CHECK (msg_type BETWEEN -32768 AND 32767),
  body          BLOB    NOT NULL,                 -- opaque payload
  client_msg_id TEXT    NOT NULL CHECK (length(client_msg_id) <= 64),
  server_at     INTEGER NOT NULL,                 -- unix ms, display only
  PRIMARY KEY (msg_id),
  CONSTRAINT uk_conv_seq    UNIQUE (conv_id, seq),
  CONSTRAINT uk_from_client UNIQUE (from_uid, client_msg_id)
) STRICT;

-- The highest seq ever committed per conversation; Trim never touches it.
CREATE TABLE conv_head (
  conv_id TEXT    NOT NULL PRIMARY KEY CHECK (length(conv_id) <= 64),
  head    INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- Snowflake worker ids 0..1023 (expires_at in unix ms; NULL = free).
CREATE TABLE worker_lease (
  worker_id  INTEGER PRIMARY KEY,
  holder     TEXT,
  token      INTEGER,
  expires_at INTEGER,
  last_ms    INTEGER NOT NULL DEFAULT 0
) STRICT;
-- Acquire walks ids in (last_ms, worker_id) order to the first free one.
CREATE INDEX worker_lease_pick ON worker_lease (last_ms, worker_id, expires_at);
WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < 1023)
INSERT INTO worker_lease (worker_id, holder, token, expires_at, last_ms)
SELECT n, NULL, 0, NULL, 0 FROM g;

-- Partition ownership with epochs (fencing); expires_at in unix ms.
CREATE TABLE partition_lease (
  partition  INTEGER PRIMARY KEY,
  owner      TEXT    NOT NULL,
  epoch      INTEGER NOT NULL,
  expires_at INTEGER
) STRICT;
