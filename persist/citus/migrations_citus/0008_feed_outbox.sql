-- 0008 on Citus: the firehose's outbox (migrations/0008; persist.Outbox,
-- docs/FEED.md), distributed by conv_id and co-located with conv_head: a
-- conversation's outbox row lives in the shard of the same index as its
-- head row, on the same worker, so a commit written directly to the
-- worker's shard tables upserts it in its own transaction (no coordinator
-- hop, no two-phase commit). The key stays (part, conv_id): it holds the
-- distribution column, and one partition's backlog is one index range on
-- every shard (OutboxPending pushes its ORDER BY conv_id LIMIT down to the
-- shards). A Citus database migrated before this file existed has 0008 as
-- a plain coordinator table, necessarily empty (no commit on Citus wrote
-- it); the Citus store distributes it at Migrate (persist/citus).
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

CREATE TABLE feed_outbox (
  part      INTEGER     NOT NULL,
  conv_id   VARCHAR(64) NOT NULL,
  published BIGINT      NOT NULL,
  head      BIGINT      NOT NULL,
  PRIMARY KEY (part, conv_id)
);
SELECT create_distributed_table('feed_outbox', 'conv_id', colocate_with => 'conv_head');
