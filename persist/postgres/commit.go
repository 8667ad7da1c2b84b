package postgres

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// fenceSQL locks the partition leases a commit depends on FOR SHARE: an epoch
// bump (UPDATE) waits for in-flight commits, and commits that start after it
// see the new epoch.
const fenceSQL = `SELECT partition, owner, epoch FROM partition_lease
WHERE partition = ANY($1::int8[]) ORDER BY partition FOR SHARE`

// headSQL moves every conversation's head by compare-and-set and returns the
// conversations that matched. A conversation with PrevHead 0 matches when it
// has no row yet (rows are created at the first non-empty commit, so a head
// row is never 0). A conversation missing from the result did not match.
const headSQL = `WITH u AS (
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
)
SELECT conv_id FROM upd
UNION ALL SELECT conv_id FROM ins
UNION ALL SELECT u.conv_id FROM u
  WHERE u.prev = 0 AND u.head = 0 AND NOT EXISTS (SELECT 1 FROM conv_head h WHERE h.conv_id = u.conv_id)`

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
// Round trips: one pipelined batch (BEGIN, fence check, head CAS, INSERT of
// every row), then COMMIT; for large commits the rows go by COPY after the
// batch instead (one more round trip, less server work per row). Anything failing before COMMIT is sent rolls
// back and returns ErrStoreUnavailable (or the refusal: *StaleFenceError,
// *HeadMismatchError, *ConflictError); only COMMIT itself can end in
// ErrUnknownOutcome.
func (s *Store) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	if err := persist.CheckBatches(batches); err != nil {
		return err
	}
	if len(batches) == 0 {
		return nil
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return unavailable("commit: acquire connection", err)
	}
	defer conn.Release() // destroys the connection if a transaction is left open
	return s.commitOn(ctx, conn, batches)
}

func (s *Store) commitOn(ctx context.Context, conn *pgxpool.Conn, batches []persist.ConvBatch) error {
	// Distinct non-zero fences.
	var fences []persist.Fence
	seenFence := map[persist.Fence]bool{}
	for i := range batches {
		if f := batches[i].Fence; !f.IsZero() && !seenFence[f] {
			seenFence[f] = true
			fences = append(fences, f)
		}
	}
	sort.Slice(fences, func(i, j int) bool { return fences[i].Partition < fences[j].Partition })
	parts := make([]int64, len(fences))
	for i, f := range fences {
		parts[i] = int64(f.Partition)
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
	useCopy := s.mode == insertCopy || (s.mode == insertAuto && len(rows.msgID) >= copyMinRows)

	b := &pgx.Batch{}
	b.Queue("BEGIN")
	if len(fences) > 0 {
		b.Queue(fenceSQL, parts)
	}
	b.Queue(headSQL, convs, prevs, heads)
	if !useCopy && len(rows.msgID) > 0 {
		b.Queue(insertSQL, rows.msgID, rows.convID, rows.seq, rows.fromUID, rows.msgType, rows.body, rows.clientID, rows.serverAt)
	}
	br := conn.SendBatch(ctx, b)

	var stale []persist.Fence
	var mismatched []string
	var insertErr error
	err := func() error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		if len(fences) > 0 {
			held := map[uint32]persist.Fence{}
			rs, _ := br.Query()
			for rs.Next() {
				var p int64
				var owner string
				var epoch int64
				if err := rs.Scan(&p, &owner, &epoch); err != nil {
					rs.Close()
					return err
				}
				held[uint32(p)] = persist.Fence{Partition: uint32(p), Owner: owner, Epoch: uint64(epoch)}
			}
			rs.Close()
			if err := rs.Err(); err != nil {
				return err
			}
			for _, f := range fences {
				if held[f.Partition] != f {
					stale = append(stale, f)
				}
			}
		}
		matched := make(map[string]bool, len(batches))
		rs, _ := br.Query()
		for rs.Next() {
			var c string
			if err := rs.Scan(&c); err != nil {
				rs.Close()
				return err
			}
			matched[c] = true
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return err
		}
		for _, c := range convs {
			if !matched[c] {
				mismatched = append(mismatched, c)
			}
		}
		if !useCopy && len(rows.msgID) > 0 {
			if _, err := br.Exec(); err != nil {
				insertErr = err
			}
		}
		return nil
	}()
	if cerr := br.Close(); err == nil && insertErr == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		rollback(conn)
		return classify("commit", err)
	}
	if len(stale) > 0 {
		rollback(conn)
		return &persist.StaleFenceError{Fences: stale}
	}
	if len(mismatched) > 0 {
		rollback(conn)
		return &persist.HeadMismatchError{ConvIDs: mismatched}
	}
	if insertErr == nil && useCopy && len(rows.msgID) > 0 {
		_, insertErr = conn.Conn().CopyFrom(ctx, pgx.Identifier{"im_message"}, imMessageColumns, rows.copySource())
	}
	if insertErr != nil {
		rollback(conn)
		if isUniqueViolation(insertErr) {
			return s.conflicts(ctx, conn, rows, insertErr)
		}
		return classify("commit: insert rows", insertErr)
	}
	tag, err := conn.Exec(ctx, "COMMIT")
	if err != nil {
		return commitError(err)
	}
	if tag.String() != "COMMIT" {
		// COMMIT of an aborted transaction answers ROLLBACK.
		return unavailable("commit", fmt.Errorf("transaction rolled back (%s)", tag))
	}
	return nil
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
	return errors.As(err, &pg) && pg.Code == "23505"
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
	byKey := make(map[sequencer.ClientKey]int, len(r.msgID))
	for i := range r.msgID {
		byMsgID[r.msgID[i]] = i
		bySeq[convSeq{r.convID[i], r.seq[i]}] = i
		byKey[sequencer.ClientKey{FromUID: uint64(r.fromUID[i]), ClientMsgID: r.clientID[i]}] = i
	}
	rs, err := conn.Query(ctx, conflictSQL, r.msgID, r.convID, r.seq, r.fromUID, r.clientID)
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
			i, ok = byKey[sequencer.ClientKey{FromUID: uint64(from), ClientMsgID: client}]
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
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].ConvID != out[b].ConvID {
			return out[a].ConvID < out[b].ConvID
		}
		if out[a].Seq != out[b].Seq {
			return out[a].Seq < out[b].Seq
		}
		return out[a].Key < out[b].Key
	})
	return &persist.ConflictError{Conflicts: out}
}
