package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// fenceSQL locks the partition leases a commit depends on FOR SHARE: an epoch
// bump (UPDATE) waits for in-flight commits, and commits that start after it
// see the new epoch. fenceCheckSQL takes these locks in a commit; tests use
// this statement to hold a fence from outside.
const fenceSQL = `SELECT partition, owner, epoch FROM partition_lease
WHERE partition = ANY($1::int8[]) ORDER BY partition FOR SHARE`

// fenceCheckSQL locks the partition leases of a commit's fences FOR SHARE,
// in partition order (an epoch bump waits for the commit), and fails the
// transaction with SQLSTATE sqlStaleFence if any fence ($1[i], $2[i], $3[i])
// is not the stored (partition, owner, epoch); DETAIL lists the 1-based
// positions i that did not hold. seq_raise comes from migration 0003.
const fenceCheckSQL = `WITH held AS MATERIALIZED (
  SELECT partition, owner, epoch FROM partition_lease
  WHERE partition = ANY($1::int8[]) ORDER BY partition FOR SHARE
)
SELECT seq_raise('SQ001', 'stale fence', string_agg(f.i::text, ',' ORDER BY f.i))
FROM unnest($1::int8[], $2::text[], $3::int8[]) WITH ORDINALITY AS f(p, o, e, i)
WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.partition = f.p AND h.owner = f.o AND h.epoch = f.e)
HAVING count(*) > 0`

// headCheckSQL moves every conversation's head by compare-and-set and fails
// the transaction with SQLSTATE sqlHeadMismatch if any conversation did not
// match; DETAIL is the JSON array of those conv_ids, ascending. A
// conversation with PrevHead 0 matches when it has no row yet (rows are
// created at the first non-empty commit, so a head row is never 0).
const headCheckSQL = `WITH u AS (
  SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[]) AS u(conv_id, prev, head) ORDER BY conv_id
), upd AS (
  UPDATE conv_head AS h SET head = u.head FROM u
  WHERE h.conv_id = u.conv_id AND h.head = u.prev AND u.prev > 0
  RETURNING h.conv_id
), ins AS (
  INSERT INTO conv_head (conv_id, head)
  SELECT conv_id, head FROM u WHERE prev = 0 AND head > 0
  ON CONFLICT (conv_id) DO NOTHING
  RETURNING conv_id
), matched AS (
  SELECT conv_id FROM upd
  UNION ALL SELECT conv_id FROM ins
  UNION ALL SELECT u.conv_id FROM u
    WHERE u.prev = 0 AND u.head = 0 AND NOT EXISTS (SELECT 1 FROM conv_head h WHERE h.conv_id = u.conv_id)
)
SELECT seq_raise('SQ002', 'head mismatch', json_agg(u.conv_id ORDER BY u.conv_id)::text)
FROM u WHERE NOT EXISTS (SELECT 1 FROM matched m WHERE m.conv_id = u.conv_id)
HAVING count(*) > 0`

// unfencedCheckSQL refuses a commit without fences (a node started without
// --cluster-listen) in a database whose partitions a cluster holds: such a
// node would write conversations that cluster nodes own, unfenced.
const unfencedCheckSQL = `SELECT seq_raise('SQ003', 'unfenced commit in a cluster database', '')
WHERE EXISTS (SELECT 1 FROM partition_lease WHERE owner <> '')`

// SQLSTATEs raised by fenceCheckSQL, headCheckSQL and unfencedCheckSQL.
const (
	sqlStaleFence   = "SQ001" // DETAIL: 1-based positions of the stale fences, comma-separated
	sqlHeadMismatch = "SQ002" // DETAIL: JSON array of the mismatched conv_ids
	sqlUnfenced     = "SQ003"
	sqlStaleEpoch   = "SQ004" // Citus: DETAIL: JSON array of conv_ids whose head row has a newer epoch
)

// casHeadsSQL is the distributed mode's head compare-and-set with the fence
// epochs (migrations_citus/0003_commit_check.sql).
const casHeadsSQL = `SELECT seq_cas_heads($1::text[], $2::int8[], $3::int8[], $4::int8[])`

// insertSQL writes all rows of a commit in one statement.
const insertSQL = `INSERT INTO im_message (msg_id, conv_id, seq, from_uid, msg_type, body, client_msg_id, server_at)
SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[], $4::int8[], $5::int2[], $6::bytea[], $7::text[], $8::timestamptz[])`

// conflictSQL finds the stored rows holding any unique key of a failed batch.
const conflictSQL = `SELECT 1, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  WHERE m.msg_id = ANY($1::int8[])
UNION ALL
SELECT 2, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($2::text[], $3::int8[]) AS u(conv_id, seq) ON m.conv_id = u.conv_id AND m.seq = u.seq
UNION ALL
SELECT 3, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($4::int8[], $5::text[]) AS u(from_uid, client_msg_id) ON m.from_uid = u.from_uid AND m.client_msg_id = u.client_msg_id`

// conflictDistSQL is conflictSQL on Citus, where every unique key holds
// conv_id: (conv_id, msg_id), (conv_id, seq), (conv_id, from_uid,
// client_msg_id). Every branch names the commit's conversations, so it
// runs on their shard.
const conflictDistSQL = `SELECT 1, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($1::int8[], $2::text[]) AS u(msg_id, conv_id) ON m.conv_id = u.conv_id AND m.msg_id = u.msg_id
  WHERE m.conv_id = ANY($2::text[])
UNION ALL
SELECT 2, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($2::text[], $3::int8[]) AS u(conv_id, seq) ON m.conv_id = u.conv_id AND m.seq = u.seq
  WHERE m.conv_id = ANY($2::text[])
UNION ALL
SELECT 3, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($2::text[], $4::int8[], $5::text[]) AS u(conv_id, from_uid, client_msg_id)
    ON m.conv_id = u.conv_id AND m.from_uid = u.from_uid AND m.client_msg_id = u.client_msg_id
  WHERE m.conv_id = ANY($2::text[])`

var imMessageColumns = []string{"msg_id", "conv_id", "seq", "from_uid", "msg_type", "body", "client_msg_id", "server_at"}

// rowArrays is a commit's rows as column arrays (for unnest or COPY).
type rowArrays struct {
	msgID    []int64
	convID   []string
	seq      []int64
	fromUID  []int64
	msgType  []int16
	body     [][]byte
	clientID []string
	serverAt []time.Time
}

func buildRows(batches []persist.ConvBatch) *rowArrays {
	n := 0
	for i := range batches {
		n += len(batches[i].Messages)
	}
	r := &rowArrays{
		msgID: make([]int64, 0, n), convID: make([]string, 0, n), seq: make([]int64, 0, n),
		fromUID: make([]int64, 0, n), msgType: make([]int16, 0, n), body: make([][]byte, 0, n),
		clientID: make([]string, 0, n), serverAt: make([]time.Time, 0, n),
	}
	for i := range batches {
		for j := range batches[i].Messages {
			m := &batches[i].Messages[j]
			body := m.Body
			if body == nil {
				body = []byte{} // NULL would break NOT NULL
			}
			r.msgID = append(r.msgID, int64(m.MsgID))
			r.convID = append(r.convID, m.ConvID)
			r.seq = append(r.seq, int64(m.Seq))
			r.fromUID = append(r.fromUID, int64(m.FromUID))
			r.msgType = append(r.msgType, m.MsgType)
			r.body = append(r.body, body)
			r.clientID = append(r.clientID, m.ClientMsgID)
			r.serverAt = append(r.serverAt, storedTime(m.ServerAt))
		}
	}
	return r
}

// storedTime is t as stored: UTC, truncated to the millisecond (the column is
// TIMESTAMPTZ(3), which would round instead).
func storedTime(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

func (r *rowArrays) copySource() pgx.CopyFromSource {
	i := -1
	return pgx.CopyFromFunc(func() ([]any, error) {
		i++
		if i >= len(r.msgID) {
			return nil, nil
		}
		return []any{r.msgID[i], r.convID[i], r.seq[i], r.fromUID[i], r.msgType[i], r.body[i], r.clientID[i], r.serverAt[i]}, nil
	})
}

// Commit writes all batches in one transaction; see persist.Store.
//
// Below copyMinRows rows (the common case) it is ONE round trip: a pipelined
// batch of BEGIN, the fence check and the head compare-and-set (which raise
// inside the server when they refuse: fenceCheckSQL, headCheckSQL), the
// INSERT of every row, and COMMIT. A refusal or unique violation aborts the transaction on the server,
// so the pipelined COMMIT does nothing; only then are follow-up reads made
// (after ROLLBACK) to name the conflicting rows. Once that batch is written,
// a lost connection, timeout or cancel is ErrUnknownOutcome (COMMIT may have
// run); a server error before COMMIT's answer means nothing was written.
//
// From copyMinRows rows the rows go by COPY, which cannot be pipelined:
// BEGIN and the checks, then COPY, then COMMIT (three round trips); failures
// before COMMIT is sent are ErrStoreUnavailable.
func (s *Store) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	check := persist.CheckBatches
	if s.dist != nil {
		check = persist.CheckBatchesKeysPerConv
	}
	if err := check(batches); err != nil {
		return err
	}
	if len(batches) == 0 {
		return nil
	}
	if s.dist != nil {
		return s.commitDist(ctx, batches)
	}
	conn, err := s.commits.Acquire(ctx)
	if err != nil {
		return unavailable("commit: acquire connection", err)
	}
	defer conn.Release() // destroys the connection if a transaction is left open
	backend := backendOf(conn.Conn().PgConn())
	if s.beforeCommit != nil {
		s.beforeCommit(backend.pid)
	}
	err = s.commitOn(ctx, conn, batches)
	if errors.Is(err, sequencer.ErrUnknownOutcome) {
		// The transaction may still commit on the server: Settle must end
		// it before anyone re-reads. Never reuse this connection.
		s.unsettle(backend, nil)
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Conn().Close(cctx)
		cancel()
	}
	return err
}

func (s *Store) commitOn(ctx context.Context, conn *pgxpool.Conn, batches []persist.ConvBatch) error {
	// Distinct non-zero fences, in partition order.
	fences, unfenced := persist.Fences(batches)
	parts := make([]int64, len(fences))
	owners := make([]string, len(fences))
	epochs := make([]int64, len(fences))
	for i, f := range fences {
		parts[i], owners[i], epochs[i] = int64(f.Partition), f.Owner, int64(f.Epoch)
	}
	// Heads, in conv_id order.
	order := make([]int, len(batches))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return batches[order[a]].ConvID < batches[order[b]].ConvID })
	convs := make([]string, len(batches))
	prevs := make([]int64, len(batches))
	heads := make([]int64, len(batches))
	for k, i := range order {
		convs[k] = batches[i].ConvID
		prevs[k] = int64(batches[i].PrevHead)
		heads[k] = int64(batches[i].LastSeq())
	}
	rows := buildRows(batches)
	useCopy := len(rows.msgID) > 0 && (s.mode == insertCopy || (s.mode == insertAuto && len(rows.msgID) >= copyMinRows))

	b := &pgx.Batch{}
	b.Queue("BEGIN")
	if s.dist != nil {
		// Distributed mode: the fences were checked against the cached
		// lease table (checkFences); the head rows carry the epochs
		// (citus.go, "Fencing on Citus").
		convEpochs := make([]int64, len(order))
		for k, i := range order {
			convEpochs[k] = int64(batches[i].Fence.Epoch)
		}
		b.Queue(casHeadsSQL, convs, prevs, heads, convEpochs)
	} else {
		if len(fences) > 0 {
			b.Queue(fenceCheckSQL, parts, owners, epochs)
		}
		if unfenced {
			b.Queue(unfencedCheckSQL)
		}
		b.Queue(headCheckSQL, convs, prevs, heads)
	}
	insertAt, commitAt := -1, -1
	if !useCopy {
		if len(rows.msgID) > 0 {
			insertAt = b.Len()
			b.Queue(insertSQL, rows.msgID, rows.convID, rows.seq, rows.fromUID, rows.msgType, rows.body, rows.clientID, rows.serverAt)
		}
		commitAt = b.Len()
		b.Queue("COMMIT")
	}
	br := conn.SendBatch(ctx, b)
	var tag pgconn.CommandTag
	var err error
	failedAt := -1
	for i := 0; i < b.Len(); i++ {
		if tag, err = br.Exec(); err != nil {
			failedAt = i
			break
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		if commitAt >= 0 && tag.String() == "COMMIT" {
			return nil // COMMIT answered; only reading the end of the batch failed
		}
		err, failedAt = cerr, b.Len()
	}

	if err != nil {
		var pg *pgconn.PgError
		isPg := errors.As(err, &pg)
		switch {
		case commitAt >= 0 && failedAt >= commitAt:
			// The answer to COMMIT itself.
			return commitError(err)
		case commitAt >= 0 && !isPg && !sentNothing(err):
			// COMMIT went out with the batch and the connection failed
			// before its answer: it may have run.
			return unknownOutcome("commit: batch with COMMIT", err)
		}
		// The server refused a statement before COMMIT (the transaction is
		// aborted and the pipelined COMMIT skipped), or nothing that could
		// commit was sent.
		rollback(conn)
		if isPg {
			switch {
			case pg.Code == sqlStaleFence:
				return staleFences(fences, pg)
			case pg.Code == sqlHeadMismatch:
				return headMismatch(pg)
			case pg.Code == sqlStaleEpoch:
				return staleEpochs(batches, pg)
			case pg.Code == sqlUnfenced:
				return persist.ErrUnfenced
			case failedAt == insertAt && isUniqueViolation(err):
				return s.conflicts(ctx, conn, rows, err)
			}
		}
		return classify("commit", err)
	}
	if commitAt < 0 {
		// COPY path: the checks passed; rows, then COMMIT.
		if _, err := conn.Conn().CopyFrom(ctx, pgx.Identifier{"im_message"}, imMessageColumns, rows.copySource()); err != nil {
			rollback(conn)
			if isUniqueViolation(err) {
				return s.conflicts(ctx, conn, rows, err)
			}
			return classify("commit: insert rows", err)
		}
		tag, err = conn.Exec(ctx, "COMMIT")
		if err != nil {
			return commitError(err)
		}
	}
	if tag.String() != "COMMIT" {
		// COMMIT of an aborted transaction answers ROLLBACK.
		rollback(conn)
		return unavailable("commit", fmt.Errorf("transaction rolled back (%s)", tag))
	}
	return nil
}

// sentNothing reports whether err is a failure that happened before anything
// of the batch reached the server (dial, write of zero bytes, or a prepare
// round trip before the batch itself).
func sentNothing(err error) bool {
	if pgconn.SafeToRetry(err) {
		return true
	}
	var pre pgx.ErrPreprocessingBatch
	return errors.As(err, &pre)
}

// staleFences builds the *StaleFenceError of a fenceCheckSQL refusal:
// DETAIL lists the 1-based positions (in fences) that did not hold.
func staleFences(fences []persist.Fence, pg *pgconn.PgError) error {
	var stale []persist.Fence
	for _, p := range strings.Split(pg.Detail, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || i < 1 || i > len(fences) {
			return unavailable("commit: unreadable stale-fence report", pg)
		}
		stale = append(stale, fences[i-1])
	}
	return &persist.StaleFenceError{Fences: stale}
}

// headMismatch builds the *HeadMismatchError of a headCheckSQL refusal:
// DETAIL is the JSON array of the conversations whose head did not match.
func headMismatch(pg *pgconn.PgError) error {
	var convs []string
	if err := json.Unmarshal([]byte(pg.Detail), &convs); err != nil || len(convs) == 0 {
		return unavailable("commit: unreadable head-mismatch report", pg)
	}
	return &persist.HeadMismatchError{ConvIDs: convs}
}

// staleEpochs builds the *StaleFenceError of a seq_cas_heads refusal (Citus):
// DETAIL is the JSON array of the conversations whose head row carries a
// newer epoch; the error names their batches' fences.
func staleEpochs(batches []persist.ConvBatch, pg *pgconn.PgError) error {
	var convs []string
	if err := json.Unmarshal([]byte(pg.Detail), &convs); err != nil || len(convs) == 0 {
		return unavailable("commit: unreadable stale-epoch report", pg)
	}
	named := map[string]bool{}
	for _, c := range convs {
		named[c] = true
	}
	seen := map[persist.Fence]bool{}
	var stale []persist.Fence
	for i := range batches {
		if f := batches[i].Fence; named[batches[i].ConvID] && !seen[f] {
			seen[f] = true
			stale = append(stale, f)
		}
	}
	return &persist.StaleFenceError{Fences: stale}
}

// commitError classifies an error of the COMMIT statement: not sent at all,
// or refused by the server with an ERROR, means rolled back; anything else
// (connection lost, timeout, cancel, FATAL) means the outcome is unknown.
func commitError(err error) error {
	if pgconn.SafeToRetry(err) {
		return unavailable("commit: COMMIT not sent", err)
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Severity == "ERROR" {
		return unavailable("commit: COMMIT refused", err)
	}
	return unknownOutcome("commit: COMMIT", err)
}

// rollback ends the transaction on conn. If it cannot, the connection is
// left in a transaction and Release destroys it, which rolls back too.
func rollback(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(ctx)
	}
}

func isUniqueViolation(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	// Citus passes a worker's unique violation on from the coordinator as
	// XX000 with the worker's message.
	return pg.Code == "23505" || (pg.Code == "XX000" && strings.HasPrefix(pg.Message, "duplicate key value violates unique constraint"))
}

// conflicts builds the *ConflictError of a batch whose insert hit a unique
// key, by looking up which of its keys stored rows hold (the transaction is
// already rolled back; this is a read).
func (s *Store) conflicts(ctx context.Context, conn *pgxpool.Conn, r *rowArrays, cause error) error {
	type convSeq struct {
		conv string
		seq  int64
	}
	byMsgID := make(map[int64]int, len(r.msgID))
	bySeq := make(map[convSeq]int, len(r.msgID))
	type convKey struct {
		conv string
		key  sequencer.ClientKey
	}
	keyOf := func(conv string, from int64, client string) convKey {
		k := convKey{key: sequencer.ClientKey{FromUID: uint64(from), ClientMsgID: client}}
		if s.dist != nil {
			k.conv = conv // unique per conversation on Citus
		}
		return k
	}
	byKey := make(map[convKey]int, len(r.msgID))
	for i := range r.msgID {
		byMsgID[r.msgID[i]] = i
		bySeq[convSeq{r.convID[i], r.seq[i]}] = i
		byKey[keyOf(r.convID[i], r.fromUID[i], r.clientID[i])] = i
	}
	q := conflictSQL
	if s.dist != nil {
		q = conflictDistSQL
	}
	rs, err := conn.Query(ctx, q, r.msgID, r.convID, r.seq, r.fromUID, r.clientID)
	if err != nil {
		return unavailable("commit: find conflicting rows", errors.Join(cause, err))
	}
	defer rs.Close()
	var out []persist.Conflict
	for rs.Next() {
		var kind int
		var msgID, seq, from int64
		var conv, client string
		if err := rs.Scan(&kind, &msgID, &conv, &seq, &from, &client); err != nil {
			return unavailable("commit: find conflicting rows", errors.Join(cause, err))
		}
		var i int
		var ok bool
		var key persist.ConflictKey
		switch kind {
		case 1:
			i, ok = byMsgID[msgID]
			key = persist.KeyMsgID
		case 2:
			i, ok = bySeq[convSeq{conv, seq}]
			key = persist.KeyConvSeq
		case 3:
			i, ok = byKey[keyOf(conv, from, client)]
			key = persist.KeyClientMsgID
		}
		if !ok {
			continue
		}
		out = append(out, persist.Conflict{Key: key, ConvID: r.convID[i], Seq: uint64(r.seq[i]), MsgID: uint64(r.msgID[i]),
			FromUID: uint64(r.fromUID[i]), ClientMsgID: r.clientID[i]})
	}
	if err := rs.Err(); err != nil {
		return unavailable("commit: find conflicting rows", errors.Join(cause, err))
	}
	if len(out) == 0 {
		// The conflicting row vanished (retention) between the failed insert
		// and the lookup: nothing was written, a retry may well succeed.
		return unavailable("commit: unique key conflict with a row that is gone", cause)
	}
	persist.SortConflicts(out)
	return &persist.ConflictError{Conflicts: out}
}
