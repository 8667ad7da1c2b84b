-- 0003: users' read positions (persist.ReadPositions, readpos.go). Retention
-- never deletes them.
CREATE TABLE IF NOT EXISTS read_position (
  uid      BIGINT UNSIGNED NOT NULL,
  conv_id  VARCHAR(64) NOT NULL COLLATE {{BIN}},
  read_seq BIGINT UNSIGNED NOT NULL,
  PRIMARY KEY (uid, conv_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
