-- 0002: cluster membership (cluster.go): one row per member node and the
-- single version row that orders every change of the member set.
CREATE TABLE IF NOT EXISTS cluster_member (
  node_id      VARCHAR(255) NOT NULL COLLATE {{BIN}},
  incarnation  VARCHAR(255) NOT NULL COLLATE {{BIN}},
  cluster_addr VARCHAR(255) NOT NULL,
  api_addr     VARCHAR(255) NOT NULL,
  leaving      BOOLEAN      NOT NULL DEFAULT false,
  lease_until  DATETIME(3)  NOT NULL,
  joined_at    DATETIME(3)  NOT NULL,
  partitions   INT          NOT NULL DEFAULT 0,
  protocol     INT          NOT NULL DEFAULT 0,
  version      VARCHAR(255) NOT NULL DEFAULT '',
  PRIMARY KEY (node_id),
  UNIQUE KEY uk_incarnation (incarnation)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS cluster_version (
  id      TINYINT NOT NULL,
  version BIGINT UNSIGNED NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB;
INSERT IGNORE INTO cluster_version (id, version) VALUES (1, 0);
