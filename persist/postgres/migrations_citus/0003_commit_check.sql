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
-- newer epoch) or SQ002 (DETAIL: JSON array of mismatched conv_ids).
CREATE FUNCTION seq_cas_heads(convs text[], prevs int8[], heads int8[], epochs int8[])
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  n int := cardinality(convs);
  moved int := 0;
  k int;
  stale text;
  bad text;
BEGIN
  UPDATE conv_head AS h SET head = u.head, epoch = greatest(h.epoch, u.epoch)
  FROM unnest(convs, prevs, heads, epochs) AS u(conv_id, prev, head, epoch)
  WHERE h.conv_id = ANY(convs) AND h.conv_id = u.conv_id AND h.head = u.prev AND u.prev > 0
    AND (u.epoch = 0 OR h.epoch <= u.epoch);
  GET DIAGNOSTICS moved = ROW_COUNT;
  IF 0 = ANY(prevs) THEN
    INSERT INTO conv_head (conv_id, head, epoch)
    SELECT u.conv_id, u.head, u.epoch FROM unnest(convs, prevs, heads, epochs) AS u(conv_id, prev, head, epoch)
    WHERE u.prev = 0 AND u.head > 0
    ON CONFLICT (conv_id) DO NOTHING;
    GET DIAGNOSTICS k = ROW_COUNT;
    moved := moved + k;
    -- prev = head = 0 matches when the conversation has no row.
    SELECT count(*) INTO k FROM unnest(convs, prevs, heads) AS u(conv_id, prev, head)
    WHERE u.prev = 0 AND u.head = 0;
    IF k > 0 THEN
      SELECT count(*) INTO k FROM unnest(convs, prevs, heads) AS u(conv_id, prev, head)
      WHERE u.prev = 0 AND u.head = 0
        AND NOT EXISTS (SELECT 1 FROM conv_head h WHERE h.conv_id = ANY(convs) AND h.conv_id = u.conv_id);
      moved := moved + k;
    END IF;
  END IF;
  IF moved = n THEN
    RETURN;
  END IF;
  -- Something did not move: name it. A head row is now at u.head only if
  -- this call moved it (heads only grow, and this transaction holds the
  -- rows it moved).
  SELECT json_agg(u.conv_id ORDER BY u.conv_id)::text INTO stale
  FROM unnest(convs, epochs) AS u(conv_id, epoch)
  JOIN conv_head h ON h.conv_id = u.conv_id
  WHERE h.conv_id = ANY(convs) AND u.epoch > 0 AND h.epoch > u.epoch;
  IF stale IS NOT NULL THEN
    PERFORM seq_raise('SQ004', 'stale epoch', stale);
  END IF;
  SELECT json_agg(u.conv_id ORDER BY u.conv_id)::text INTO bad
  FROM unnest(convs, prevs, heads) AS u(conv_id, prev, head)
  WHERE NOT EXISTS (SELECT 1 FROM conv_head h WHERE h.conv_id = ANY(convs) AND h.conv_id = u.conv_id
                      AND (h.head = u.head AND u.head > 0))
    AND NOT (u.prev = 0 AND u.head = 0 AND NOT EXISTS (SELECT 1 FROM conv_head h WHERE h.conv_id = ANY(convs) AND h.conv_id = u.conv_id));
  PERFORM seq_raise('SQ002', 'head mismatch', coalesce(bad, '[]'));
END
$fn$;
SELECT create_distributed_function('seq_cas_heads(text[],int8[],int8[],int8[])');
