-- 0006 on Citus: the resend key's two indexes become one. 0001 made the
-- per-conversation resend key UNIQUE (conv_id, from_uid, client_msg_id)
-- and, for lookups by (from_uid, client_msg_id) in every shard, a second
-- index on those two columns. UNIQUE (from_uid, client_msg_id, conv_id)
-- is the same key and serves both lookups (every column compared by
-- equality). Every message insert maintains one index fewer, and the one
-- dropped is a random-order one: the workers' CPU per message in the hot
-- conversation fell by about a third (docs/BENCHMARKS.md, Citus).
--
-- It builds the new index on every shard while writes to im_message wait
-- (like CREATE INDEX on the table): on a large table run `sequencer
-- migrate` at a quiet time.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
ALTER TABLE im_message DROP CONSTRAINT uk_from_client;
ALTER TABLE im_message ADD CONSTRAINT uk_from_client UNIQUE (from_uid, client_msg_id, conv_id);
DROP INDEX im_message_client;
