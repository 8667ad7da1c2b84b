-- 0003: seq_raise, so that a Commit's checks can fail INSIDE its transaction
-- and the COMMIT pipelined behind them in the same round trip does nothing
-- (persist/postgres commit.go: fenceCheckSQL, headCheckSQL).
--
-- seq_raise(code, message, detail) raises an ERROR with that SQLSTATE,
-- message and detail. The checks call it from plain SQL only when they
-- refuse (SELECT seq_raise(...) ... HAVING count(*) > 0), so the common path
-- runs no PL/pgSQL. An ERROR aborts the transaction: nothing is written.
CREATE FUNCTION seq_raise(code text, message text, detail text)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, DETAIL = detail;
END
$fn$;
