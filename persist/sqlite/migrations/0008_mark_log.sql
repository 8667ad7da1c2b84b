-- 0008: the own-send rule's marks are logged, then applied in bulk
-- (marklog.go). A commit appends ONE row holding its marks as a JSON array
-- of [conv_id, uid, seq] (a rowid table: appends fill its last page),
-- instead of upserting each sender's position into read_position, a
-- randomly keyed B-tree (a page of the commit's WAL per mark: a quarter to
-- a third of the write rate at the bench's `many`). The writer applies the
-- logged marks to read_position (max) and empties the log in one
-- transaction about once a second; the store's reads add the marks not yet
-- applied, so a position reads the same as if each commit had written it.
CREATE TABLE mark_log (
  id    INTEGER PRIMARY KEY,
  marks TEXT    NOT NULL
) STRICT;
