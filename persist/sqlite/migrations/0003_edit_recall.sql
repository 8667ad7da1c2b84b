-- 0003: edits and recalls (persist/postgres/migrations/0007_edit_recall.sql
-- mirrored; persist/events.go). Additive: the seed's columns stay as
-- written. An event row (kind 1 edit, 2 recall) names its target in
-- target_msg_id (0 for an ordinary message); the target row carries its
-- current state: recalled (0/1, its body emptied for good), edit_count and
-- edited_at (unix ms of the last edit, NULL if never edited).

ALTER TABLE im_message ADD COLUMN kind          INTEGER NOT NULL DEFAULT 0 CHECK (kind BETWEEN 0 AND 2);
ALTER TABLE im_message ADD COLUMN target_msg_id INTEGER NOT NULL DEFAULT 0;
ALTER TABLE im_message ADD COLUMN recalled      INTEGER NOT NULL DEFAULT 0 CHECK (recalled IN (0, 1));
ALTER TABLE im_message ADD COLUMN edit_count    INTEGER NOT NULL DEFAULT 0;
ALTER TABLE im_message ADD COLUMN edited_at     INTEGER;

-- A recall finds the edit events of its target (only event rows are in it).
CREATE INDEX im_message_target ON im_message (conv_id, target_msg_id) WHERE target_msg_id <> 0;
