-- 0008: the firehose's outbox (persist.Outbox; docs/FEED.md). One row per
-- conversation with messages not yet published to the broker: seqs
-- published+1..head. A commit with the firehose on upserts the row in its
-- own transaction; the publisher raises `published` after the broker's
-- acks and deletes the row once it reaches `head`. Keyed by the ring
-- partition first, so a partition's backlog is one index range and idle
-- conversations cost nothing.

CREATE TABLE feed_outbox (
  part      INTEGER     NOT NULL,
  conv_id   VARCHAR(64) NOT NULL,
  published BIGINT      NOT NULL,
  head      BIGINT      NOT NULL,
  PRIMARY KEY (part, conv_id)
);
