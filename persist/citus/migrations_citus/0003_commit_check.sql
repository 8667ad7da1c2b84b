-- 0003 on Citus: seq_raise as in migrations/0003_commit_check.sql, created on
-- every node (create_distributed_function), and seq_cas_heads, which moves
-- the heads of ONE shard's conversations by compare-and-set with the fence
-- epoch (commit.go, "Fencing on Citus"). It runs where it is called (the
-- worker holding the shard): its statements are single-shard, executed
-- locally. It never indexes its array arguments (a Citus 13.2.2 crash:
-- `SET col = arr[i]` in plpgsql kills the node, citus_test.go
-- TestCitusArraySubscriptTrap), and its UPDATE ... FROM unnest carries
-- conv_id = ANY(convs) so that Citus prunes it to the one shard.
CREATE FUNCTION seq_raise(code text, message text, detail text)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, DETAIL = detail;
END
$fn$;
SELECT create_distributed_function('seq_raise(text,text,text)');

-- convs ascending; epochs[i] = 0 is an unfenced commit (no epoch check).
-- Raises SQ004 (DETAIL: JSON array of conv_ids whose head row carries a
-- newer epoch) or SQ002 (DETAIL: JSON array of mismatched conv_ids). The
-- common path is one UPDATE (and one INSERT when a conversation is new);
-- the checks after it loop only when something did not move.
CREATE FUNCTION seq_cas_heads(convs text[], prevs int8[], heads int8[], epochs int8[])
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  n int := cardinality(convs);
  moved text[] := '{}';
  r record;
  cur_head int8;
  cur_epoch int8;
  stale text[] := '{}';
  bad text[] := '{}';
BEGIN
  FOR r IN
    UPDATE conv_head AS h SET head = u.head, epoch = greatest(h.epoch, u.epoch)
    FROM unnest(convs, prevs, heads, epochs) AS u(conv_id, prev, head, epoch)
    WHERE h.conv_id = ANY(convs) AND h.conv_id = u.conv_id AND h.head = u.prev AND u.prev > 0
      AND (u.epoch = 0 OR h.epoch <= u.epoch)
    RETURNING h.conv_id
  LOOP
    moved := moved || r.conv_id::text;
  END LOOP;
  IF cardinality(moved) = n THEN
    RETURN;
  END IF;
  IF 0 = ANY(prevs) THEN
    FOR r IN
      INSERT INTO conv_head (conv_id, head, epoch)
      SELECT u.conv_id, u.head, u.epoch FROM unnest(convs, prevs, heads, epochs) AS u(conv_id, prev, head, epoch)
      WHERE u.prev = 0 AND u.head > 0
      ON CONFLICT (conv_id) DO NOTHING
      RETURNING conv_id
    LOOP
      moved := moved || r.conv_id::text;
    END LOOP;
  END IF;
  IF cardinality(moved) = n THEN
    RETURN;
  END IF;
  -- Something did not move: look at each such conversation's row alone
  -- (single-shard reads; this path is rare).
  FOR r IN SELECT * FROM unnest(convs, prevs, heads, epochs) AS u(conv_id, prev, head, epoch) LOOP
    CONTINUE WHEN r.conv_id = ANY(moved);
    cur_head := NULL;
    cur_epoch := NULL;
    SELECT h.head, h.epoch INTO cur_head, cur_epoch FROM conv_head h WHERE h.conv_id = r.conv_id;
    IF cur_head IS NULL AND r.prev = 0 AND r.head = 0 THEN
      CONTINUE; -- an empty batch of a conversation never written: matches
    END IF;
    IF cur_head IS NOT NULL AND r.epoch > 0 AND cur_epoch > r.epoch THEN
      stale := stale || r.conv_id;
    ELSE
      bad := bad || r.conv_id;
    END IF;
  END LOOP;
  IF cardinality(stale) > 0 THEN
    PERFORM seq_raise('SQ004', 'stale epoch', array_to_json(stale)::text);
  END IF;
  IF cardinality(bad) > 0 THEN
    PERFORM seq_raise('SQ002', 'head mismatch', array_to_json(bad)::text);
  END IF;
END
$fn$;
SELECT create_distributed_function('seq_cas_heads(text[],int8[],int8[],int8[])');
