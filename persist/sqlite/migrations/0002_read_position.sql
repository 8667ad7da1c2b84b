-- 0002: read positions (persist/postgres/migrations/0005_read_position.sql
-- mirrored). One row per (conversation, user) that marked something read;
-- read_seq only moves up and never past the conversation's head. Retention
-- never touches this table.

CREATE TABLE read_position (
  conv_id  TEXT    NOT NULL CHECK (length(conv_id) <= 64),
  uid      INTEGER NOT NULL,
  read_seq INTEGER NOT NULL,
  PRIMARY KEY (conv_id, uid)
) STRICT, WITHOUT ROWID;
