-- 0007: edits and recalls (docs/API.md, "Edit and Recall";
-- persist/events.go). Additive: the seed's im_message columns stay as
-- written, and a column with a constant default is added without a rewrite.
-- An event row (kind 1 edit, 2 recall) names its target in target_msg_id
-- (0 for an ordinary message); the target row carries its current state:
-- recalled (its body emptied for good), edit_count and edited_at (the
-- server_at of its last edit, NULL if never edited).

ALTER TABLE im_message
  ADD COLUMN kind          SMALLINT       NOT NULL DEFAULT 0,
  ADD COLUMN target_msg_id BIGINT         NOT NULL DEFAULT 0,
  ADD COLUMN recalled      BOOLEAN        NOT NULL DEFAULT false,
  ADD COLUMN edit_count    INTEGER        NOT NULL DEFAULT 0,
  ADD COLUMN edited_at     TIMESTAMPTZ(3);

-- A recall finds the edit events of its target; only event rows are in it.
CREATE INDEX im_message_target ON im_message (conv_id, target_msg_id) WHERE target_msg_id <> 0;
