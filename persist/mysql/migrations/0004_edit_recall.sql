-- 0004: edits and recalls (persist/postgres/migrations/0007_edit_recall.sql;
-- persist/events.go). Additive, in ONE statement (MySQL's DDL is not
-- transactional: a failure leaves nothing half done). An event row (kind 1
-- edit, 2 recall) names its target in target_msg_id (0 for an ordinary
-- message); the target row carries its current state: recalled (its body
-- emptied for good), edit_count and edited_at (NULL if never edited). The
-- index finds a recalled target's edit events.
ALTER TABLE im_message
  ADD COLUMN kind          SMALLINT        NOT NULL DEFAULT 0,
  ADD COLUMN target_msg_id BIGINT UNSIGNED NOT NULL DEFAULT 0,
  ADD COLUMN recalled      BOOLEAN         NOT NULL DEFAULT false,
  ADD COLUMN edit_count    INT UNSIGNED    NOT NULL DEFAULT 0,
  ADD COLUMN edited_at     DATETIME(3)     NULL,
  ADD KEY im_message_target (conv_id, target_msg_id);
