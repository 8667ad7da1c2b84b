-- 0007: the outbox keeps its rows after they are published (a commit on a
-- conversation with a row writes nothing to the outbox) and reads the head
-- from conv_head, so its own head column goes; the publisher deletes rows
-- published in full some seconds later (persist.Outbox, OutboxSweep).
-- Plain DROP COLUMN: MySQL 8 has no IF EXISTS here (MariaDB has); one
-- statement, so a failure leaves nothing half done.
ALTER TABLE feed_outbox DROP COLUMN head;
