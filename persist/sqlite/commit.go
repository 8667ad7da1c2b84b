package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
)

// insertChunk is how many rows one INSERT statement carries (10 parameters
// a row; SQLite allows 32,766 parameters).
const insertChunk = 200

// headChunk is how many conversations' heads one statement reads or moves
// (SQLite allows 32,766 parameters per statement).
const headChunk = 400

var insertSQLByRows = map[int]string{}

func insertSQL(rows int) string {
	if q, ok := insertSQLByRows[rows]; ok {
		return q
	}
	var b strings.Builder
	b.WriteString("INSERT INTO im_message (msg_id, conv_id, seq, from_uid, msg_type, body, client_msg_id, server_at, kind, target_msg_id) VALUES ")
	writeList(&b, rows, "(?,?,?,?,?,?,?,?,?,?)")
	return b.String()
}

// writeList writes n copies of item, comma-separated.
func writeList(b *strings.Builder, n int, item string) {
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(item)
	}
}

func init() {
	insertSQLByRows[insertChunk] = insertSQL(insertChunk)
}

// insertTail is the largest of the power-of-two INSERT statements that
// carry the rows after the last full chunk.
const insertTail = 128

// insertStmts returns the row INSERTs of insertChunk rows and of 1, 2, 4,
// ... insertTail rows, prepared once on the writer connection (a 200-row
// INSERT took 5% of a-sqlite's CPU to prepare at every commit), or nil if
// they cannot be prepared (the table is not there yet): then each commit
// prepares its own. Not to be called while holding the writer connection.
func (s *Store) insertStmts(ctx context.Context) map[int]*sql.Stmt {
	s.insMu.Lock()
	defer s.insMu.Unlock()
	if s.ins != nil {
		return s.ins
	}
	ins := map[int]*sql.Stmt{}
	for _, n := range []int{insertChunk, 128, 64, 32, 16, 8, 4, 2, 1} {
		st, err := s.w.PrepareContext(ctx, insertSQL(n))
		if err != nil {
			for _, st := range ins {
				st.Close()
			}
			return nil
		}
		ins[n] = st
	}
	s.ins = ins
	return ins
}

// storedMs is t as stored: unix milliseconds (truncated), like PostgreSQL's
// TIMESTAMPTZ(3) column after persist/postgres truncates it.
func storedMs(t time.Time) int64 { return t.UnixMilli() }

// mergeRows bounds the rows of one transaction made of several Commit calls
// (a single larger call still goes alone).
const mergeRows = 4000

// commitReq is one Commit call waiting for the writer goroutine.
type commitReq struct {
	ctx     context.Context
	batches []persist.ConvBatch
	rows    int
	taken   bool // under Store.qmu: the writer has it; Commit waits for err
	err     error
	done    chan struct{}
}

// Commit writes all batches in one BEGIN IMMEDIATE transaction on the writer
// connection; see persist.Store. An error before COMMIT rolls back and wraps
// ErrStoreUnavailable (or is the refusal: *StaleFenceError,
// *HeadMismatchError, *ConflictError); an error from COMMIT itself wraps
// ErrUnknownOutcome.
//
// Concurrent calls are group-committed: SQLite has one writer, so the calls
// that arrive while a transaction runs wait, and the writer goroutine then
// commits them together in one transaction (up to mergeRows rows): one WAL
// sync, each conversation's head page and each index page written once for
// all of them. If that transaction fails before COMMIT (nothing written),
// each call is committed again on its own, so each gets the answer it would
// have had alone; an unknown outcome is every call's answer.
//
// Waiting for the writer is bounded by ctx; once its transaction has begun,
// Commit returns when it ends (committed or rolled back), whatever ctx does.
func (s *Store) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	if err := persist.CheckBatches(batches); err != nil {
		return err
	}
	if len(batches) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return unavailable("commit", err)
	}
	r := &commitReq{ctx: ctx, batches: batches, done: make(chan struct{})}
	for i := range batches {
		r.rows += len(batches[i].Messages)
	}
	s.qmu.Lock()
	if s.closing {
		s.qmu.Unlock()
		return unavailable("commit", errors.New("store closed"))
	}
	s.queue = append(s.queue, r)
	s.calls.Add(1)
	s.qmu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
	}
	s.qmu.Lock()
	if !r.taken {
		for i, q := range s.queue {
			if q == r {
				s.queue = append(s.queue[:i], s.queue[i+1:]...)
				break
			}
		}
		s.qmu.Unlock()
		return unavailable("commit: waiting for the writer", ctx.Err())
	}
	s.qmu.Unlock()
	<-r.done
	return r.err
}

// writeLoop is the writer goroutine: it commits the queued calls, several
// at a time, until Close. Between commits, and on a timer when idle, it
// applies the own-send marks' log when due (marklog.go): first at start
// (what a crash left there; not for a shared opener), last at Close.
func (s *Store) writeLoop() {
	defer close(s.loopDone)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	arm := func(wait time.Duration) {
		timer.Stop()
		if wait > 0 {
			timer.Reset(wait)
		}
	}
	if !s.shared {
		arm(s.flushMarks(true))
	}
	for {
		select {
		case <-s.wake:
		case <-s.stop:
		case <-timer.C:
		}
		for {
			group := s.take()
			if group == nil {
				break
			}
			s.commitGroup(group)
			arm(s.flushMarks(false))
		}
		arm(s.flushMarks(false))
		select {
		case <-s.stop:
			if s.drained() {
				timer.Stop()
				if !s.shared {
					s.flushMarks(true)
				}
				return
			}
		default:
		}
	}
}

// drained reports whether nothing is queued (after Close: nothing more can
// be).
func (s *Store) drained() bool {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return len(s.queue) == 0
}

// take removes the longest prefix of the queue that fits in mergeRows rows
// (at least one call); nil if the queue is empty.
func (s *Store) take() []*commitReq {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	n, rows := 0, 0
	for n < len(s.queue) {
		k := s.queue[n].rows
		if n > 0 && (rows+k > mergeRows) {
			break
		}
		rows += k
		s.queue[n].taken = true
		n++
	}
	if n == 0 {
		return nil
	}
	s.groups.Add(1)
	group := make([]*commitReq, n)
	copy(group, s.queue)
	rest := copy(s.queue, s.queue[n:])
	clear(s.queue[rest:])
	s.queue = s.queue[:rest]
	return group
}

// commitGroup commits the calls of group in one transaction and answers
// each of them.
func (s *Store) commitGroup(group []*commitReq) {
	if len(group) == 1 {
		r := group[0]
		r.err = s.commitTx(r.ctx, r.batches, true)
		close(r.done)
		return
	}
	var all []persist.ConvBatch
	for _, r := range group {
		all = append(all, r.batches...)
	}
	ctx, release := allDone(group)
	// Keys two calls share, or a conversation in two calls, fail this
	// transaction like any refusal and are sorted out below.
	err := s.commitTx(ctx, all, false)
	release()
	if err != nil && !errors.Is(err, sequencer.ErrUnknownOutcome) && !errors.Is(err, errDiskFull) {
		// Nothing was written: each call on its own, in order. (A full file
		// system refuses each of them too: they all get its answer.)
		for _, r := range group {
			r.err = s.commitTx(r.ctx, r.batches, true)
			close(r.done)
		}
		return
	}
	for _, r := range group {
		r.err = err
		close(r.done)
	}
}

// allDone returns a context that ends when every call's context has ended
// (the transaction is abandoned only when no caller waits for it), and the
// function that releases it.
func allDone(group []*commitReq) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int32
	left.Store(int32(len(group)))
	stops := make([]func() bool, len(group))
	for i, r := range group {
		stops[i] = context.AfterFunc(r.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// commitTx writes batches in one transaction. With lookup false a unique
// key violation is reported as unavailable without looking up the rows that
// hold the keys (the caller commits the calls again one by one).
func (s *Store) commitTx(ctx context.Context, batches []persist.ConvBatch, lookup bool) (err error) {
	// Waiting for the writer connection is bounded by ctx. The transaction
	// itself is not bound to ctx: database/sql would roll it back from
	// another goroutine when ctx ends, racing with COMMIT. ctx bounds each
	// statement instead, and is checked before COMMIT.
	ins := s.insertStmts(ctx) // before taking the writer connection: preparing needs it
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return unavailable("commit: writer connection", err)
	}
	defer conn.Close()
	defer func() { s.wrote(err) }()
	gen := s.settle.failed.Load() // the failed COMMITs this one's frames go over
	tx, err := conn.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return unavailable("commit: begin", err)
	}
	if ctx.Err() != nil {
		tx.Rollback()
		return unavailable("commit", ctx.Err())
	}
	var marks []persist.Mark
	err = s.stage(ctx, tx, batches, ins)
	if err == nil {
		marks, err = logMarks(ctx, tx, batches)
	}
	if err != nil {
		tx.Rollback()
		var ce *conflictCause
		if errors.As(err, &ce) {
			if !lookup {
				return unavailable("commit: unique key conflict", ce.err)
			}
			return s.conflicts(ctx, batches, ce.err)
		}
		return err
	}
	if err := ctx.Err(); err != nil {
		tx.Rollback()
		return unavailable("commit", err)
	}
	if err := tx.Commit(); err != nil {
		if isDiskFull(err) {
			// A frame write failed: the commit frame is not whole in the
			// -wal file, and SQLite rolled back (settle.go).
			return unavailable("commit: COMMIT", err)
		}
		s.settle.commitFailed() // while holding the connection
		if marks != nil {
			s.pend.unknown() // the log may hold them now (marklog.go)
		}
		return unknownOutcome("commit: COMMIT", err)
	}
	s.settle.committed(gen)
	s.pend.committed(marks) // before the answer (marklog.go)
	return nil
}

// conflictCause marks a unique violation found while inserting.
type conflictCause struct{ err error }

func (c *conflictCause) Error() string { return c.err.Error() }

// stage runs the fence checks, the head compare-and-set and the inserts.
func (s *Store) stage(ctx context.Context, tx *sql.Tx, batches []persist.ConvBatch, ins map[int]*sql.Stmt) error {
	fences, unfenced := persist.Fences(batches)
	holds := func(f persist.Fence) (bool, error) {
		var owner string
		var epoch int64
		err := tx.QueryRowContext(ctx, `SELECT owner, epoch FROM partition_lease WHERE partition = ?`, int64(f.Partition)).Scan(&owner, &epoch)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return false, nil
		case err != nil:
			return false, classify("commit: fence check", err)
		}
		return membership.LeaseHolds(f, persist.Fence{Partition: f.Partition, Owner: owner, Epoch: uint64(epoch)}, true), nil
	}
	held := func() (bool, error) {
		var held bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM partition_lease WHERE owner <> '')`).Scan(&held); err != nil {
			return false, classify("commit: cluster check", err)
		}
		return held, nil
	}
	if err := membership.CheckFences(fences, unfenced, holds, held); err != nil {
		return err
	}
	// Heads: read in chunks (one statement per headChunk conversations,
	// not one per conversation), compare, then move in chunks.
	heads := make(map[string]int64, len(batches))
	for lo := 0; lo < len(batches); lo += headChunk {
		hi := min(lo+headChunk, len(batches))
		args := make([]any, 0, hi-lo)
		for i := lo; i < hi; i++ {
			args = append(args, batches[i].ConvID)
		}
		rows, err := tx.QueryContext(ctx, `SELECT conv_id, head FROM conv_head WHERE conv_id IN (?`+strings.Repeat(",?", hi-lo-1)+`)`, args...)
		if err != nil {
			return classify("commit: head check", err)
		}
		for rows.Next() {
			var c string
			var h int64
			if err := rows.Scan(&c, &h); err != nil {
				rows.Close()
				return classify("commit: head check", err)
			}
			heads[c] = h
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return classify("commit: head check", err)
		}
	}
	if err := persist.CheckHeads(batches, func(c string) uint64 { return uint64(heads[c]) }); err != nil {
		return err
	}
	moved := make([]any, 0, 2*headChunk)
	flushHeads := func() error {
		if len(moved) == 0 {
			return nil
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO conv_head (conv_id, head) VALUES (?,?)`+strings.Repeat(",(?,?)", len(moved)/2-1)+`
			ON CONFLICT (conv_id) DO UPDATE SET head = excluded.head`, moved...)
		moved = moved[:0]
		if err != nil {
			return classify("commit: head update", err)
		}
		return nil
	}
	for i := range batches {
		b := &batches[i]
		if len(b.Messages) == 0 {
			continue
		}
		moved = append(moved, b.ConvID, int64(b.LastSeq()))
		if len(moved) == 2*headChunk {
			if err := flushHeads(); err != nil {
				return err
			}
		}
	}
	if err := flushHeads(); err != nil {
		return err
	}
	if err := stageOutbox(ctx, tx, batches); err != nil {
		return err
	}
	args := make([]any, 0, rowArgs*insertChunk)
	exec := func(rows int, args []any) error {
		var err error
		if st := ins[rows]; st != nil {
			_, err = tx.StmtContext(ctx, st).ExecContext(ctx, args...)
		} else {
			_, err = tx.ExecContext(ctx, insertSQL(rows), args...)
		}
		if isUniqueViolation(err) {
			return &conflictCause{err}
		}
		if err != nil {
			return classify("commit: insert rows", err)
		}
		return nil
	}
	flush := func(rows int) error {
		defer func() { args = args[:0] }()
		if rows == insertChunk || ins == nil {
			if rows == 0 {
				return nil
			}
			return exec(rows, args)
		}
		// A shorter tail: statements of 128, 64, ... 1 rows, all prepared,
		// instead of preparing one of exactly this many.
		at := 0
		for size := insertTail; size >= 1; size /= 2 {
			for rows-at >= size {
				if err := exec(size, args[rowArgs*at:rowArgs*(at+size)]); err != nil {
					return err
				}
				at += size
			}
		}
		return nil
	}
	rows := 0
	for i := range batches {
		for j := range batches[i].Messages {
			m := &batches[i].Messages[j]
			body := m.Body
			if body == nil {
				body = []byte{}
			}
			args = append(args, int64(m.MsgID), m.ConvID, int64(m.Seq), int64(m.FromUID), int64(m.MsgType),
				body, m.ClientMsgID, storedMs(m.ServerAt), int64(m.Kind), int64(m.TargetMsgID))
			rows++
			if rows == insertChunk {
				if err := flush(rows); err != nil {
					return err
				}
				rows = 0
			}
		}
	}
	if err := flush(rows); err != nil {
		return err
	}
	return applyEvents(ctx, tx, batches)
}

// rowArgs is the parameters of one row of insertSQL.
const rowArgs = 10

// The target updates of edits and recalls (persist/events.go), one
// statement per event, in seq order, after the rows are in.
const (
	editSQL = `UPDATE im_message SET body = ?, edit_count = edit_count + 1, edited_at = ?
		WHERE conv_id = ? AND msg_id = ? AND kind = 0`
	recallSQL = `UPDATE im_message SET body = x'', recalled = 1
		WHERE conv_id = ? AND (msg_id = ? AND kind = 0 OR target_msg_id = ? AND target_msg_id <> 0 AND kind = 1)`
	// recallUneditedSQL is recallSQL for a target its writer knows has no
	// edit events (ConvBatch.RecallsOfUnedited).
	recallUneditedSQL = `UPDATE im_message SET body = x'', recalled = 1
		WHERE conv_id = ? AND msg_id = ? AND kind = 0`
)

func applyEvents(ctx context.Context, tx *sql.Tx, batches []persist.ConvBatch) error {
	for i := range batches {
		for j := range batches[i].Messages {
			m := &batches[i].Messages[j]
			var err error
			switch m.Kind {
			case sequencer.KindEdit:
				body := m.Body
				if body == nil {
					body = []byte{}
				}
				_, err = tx.ExecContext(ctx, editSQL, body, storedMs(m.ServerAt), m.ConvID, int64(m.TargetMsgID))
			case sequencer.KindRecall:
				if batches[i].RecallsOfUnedited {
					_, err = tx.ExecContext(ctx, recallUneditedSQL, m.ConvID, int64(m.TargetMsgID))
				} else {
					_, err = tx.ExecContext(ctx, recallSQL, m.ConvID, int64(m.TargetMsgID), int64(m.TargetMsgID))
				}
			default:
				continue
			}
			if err != nil {
				return classify("commit: update the target of an edit or recall", err)
			}
		}
	}
	return nil
}

// conflicts builds the *ConflictError of batches whose insert hit a unique
// key held by a stored row (rows colliding within the batch were caught by
// persist.CheckBatches). The transaction is rolled back; these are reads.
func (s *Store) conflicts(ctx context.Context, batches []persist.ConvBatch, cause error) error {
	conn, err := s.r.Conn(ctx)
	if err != nil {
		return unavailable("commit: find conflicting rows", errors.Join(cause, err))
	}
	defer conn.Close()
	lookups := []struct {
		key persist.ConflictKey
		sql string
		arg func(m *sequencer.Message) []any
	}{
		{persist.KeyMsgID, `SELECT 1 FROM im_message WHERE msg_id = ?`,
			func(m *sequencer.Message) []any { return []any{int64(m.MsgID)} }},
		{persist.KeyConvSeq, `SELECT 1 FROM im_message WHERE conv_id = ? AND seq = ?`,
			func(m *sequencer.Message) []any { return []any{m.ConvID, int64(m.Seq)} }},
		{persist.KeyClientMsgID, `SELECT 1 FROM im_message WHERE from_uid = ? AND client_msg_id = ?`,
			func(m *sequencer.Message) []any { return []any{int64(m.FromUID), m.ClientMsgID} }},
	}
	var out []persist.Conflict
	for _, l := range lookups {
		stmt, err := conn.PrepareContext(ctx, l.sql)
		if err != nil {
			return unavailable("commit: find conflicting rows", errors.Join(cause, err))
		}
		for i := range batches {
			for j := range batches[i].Messages {
				m := &batches[i].Messages[j]
				var one int
				err := stmt.QueryRowContext(ctx, l.arg(m)...).Scan(&one)
				if errors.Is(err, sql.ErrNoRows) {
					continue
				}
				if err != nil {
					stmt.Close()
					return unavailable("commit: find conflicting rows", errors.Join(cause, err))
				}
				out = append(out, persist.Conflict{Key: l.key, ConvID: m.ConvID, Seq: m.Seq, MsgID: m.MsgID,
					FromUID: m.FromUID, ClientMsgID: m.ClientMsgID})
			}
		}
		stmt.Close()
	}
	if len(out) == 0 {
		return unavailable("commit: unique key conflict with a row that is gone", cause)
	}
	persist.SortConflicts(out)
	return &persist.ConflictError{Conflicts: out}
}
