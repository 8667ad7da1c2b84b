-- 0007: the outbox keeps its rows after they are published (a commit on a
-- conversation with a row writes nothing to the outbox) and reads the head
-- from conv_head, so its own head column goes; the publisher deletes rows
-- published in full some seconds later (persist.Outbox, OutboxSweep).
ALTER TABLE feed_outbox DROP COLUMN IF EXISTS head;
