-- 0005: the firehose's outbox (persist.Outbox; docs/FEED.md). One row per
-- conversation with messages not yet published to the broker: seqs
-- published+1..head. A commit with the firehose on upserts the row in its
-- own transaction; the publisher raises `published` after the broker's
-- acks and deletes the row once it reaches `head`. Keyed by the ring
-- partition first, so a partition's backlog is one index range.
CREATE TABLE IF NOT EXISTS feed_outbox (
  part      INT UNSIGNED    NOT NULL,
  conv_id   VARCHAR(64)     NOT NULL COLLATE {{BIN}},
  published BIGINT UNSIGNED NOT NULL,
  head      BIGINT UNSIGNED NOT NULL,
  PRIMARY KEY (part, conv_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
