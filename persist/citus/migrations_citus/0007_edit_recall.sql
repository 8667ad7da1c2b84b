-- 0007 on Citus: migrations/0007_edit_recall.sql on the distributed
-- im_message (the columns and the index are added to every shard; the index
-- leads with conv_id, the distribution column, so a recall's update of its
-- target's edit events stays on the conversation's shard).
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

ALTER TABLE im_message
  ADD COLUMN kind          SMALLINT       NOT NULL DEFAULT 0,
  ADD COLUMN target_msg_id BIGINT         NOT NULL DEFAULT 0,
  ADD COLUMN recalled      BOOLEAN        NOT NULL DEFAULT false,
  ADD COLUMN edit_count    INTEGER        NOT NULL DEFAULT 0,
  ADD COLUMN edited_at     TIMESTAMPTZ(3);

CREATE INDEX im_message_target ON im_message (conv_id, target_msg_id) WHERE target_msg_id <> 0;
