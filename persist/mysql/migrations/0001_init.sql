-- 0001: messages (the seed's DDL: BIGINT UNSIGNED ids, DATETIME(3), InnoDB,
-- utf8mb4, uk_conv_seq, uk_from_client), conversation heads, worker-id leases
-- and partition leases. {{BODY}} is BLOB, MEDIUMBLOB or LONGBLOB, the smallest
-- that holds --max-body; {{BIN}} is the binary, no-pad utf8mb4 collation of
-- the server (utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL 8), so
-- that 'a', 'A' and 'a ' are three conversations (docs/MYSQL.md).

CREATE TABLE IF NOT EXISTS im_message (
  msg_id        BIGINT UNSIGNED NOT NULL,
  conv_id       VARCHAR(64)  NOT NULL COLLATE {{BIN}},
  seq           BIGINT UNSIGNED NOT NULL,
  from_uid      BIGINT UNSIGNED NOT NULL,
  msg_type      SMALLINT     NOT NULL DEFAULT 1,
  body          {{BODY}}     NOT NULL,
  client_msg_id VARCHAR(64)  NOT NULL COLLATE {{BIN}},
  server_at     DATETIME(3)  NOT NULL,
  PRIMARY KEY (msg_id),
  UNIQUE KEY uk_conv_seq (conv_id, seq),
  UNIQUE KEY uk_from_client (from_uid, client_msg_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- The highest seq ever committed per conversation; retention never touches it.
CREATE TABLE IF NOT EXISTS conv_head (
  conv_id VARCHAR(64) NOT NULL COLLATE {{BIN}},
  head    BIGINT UNSIGNED NOT NULL,
  PRIMARY KEY (conv_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Snowflake worker ids 0..1023 (see persist/postgres migration 0001).
CREATE TABLE IF NOT EXISTS worker_lease (
  worker_id  SMALLINT NOT NULL,
  holder     VARCHAR(255) COLLATE {{BIN}},
  token      BIGINT UNSIGNED NOT NULL DEFAULT 0,
  expires_at DATETIME(3),
  last_ms    BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (worker_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
INSERT IGNORE INTO worker_lease (worker_id)
WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n < 31)
SELECT a.n * 32 + b.n FROM g AS a CROSS JOIN g AS b;

-- Partition ownership with epochs. Every fenced commit reads its rows
-- LOCK IN SHARE MODE inside its transaction.
CREATE TABLE IF NOT EXISTS partition_lease (
  `partition` INT UNSIGNED NOT NULL,
  owner       VARCHAR(255) NOT NULL COLLATE {{BIN}},
  epoch       BIGINT UNSIGNED NOT NULL,
  PRIMARY KEY (`partition`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
