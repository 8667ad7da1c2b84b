package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
)

// Commit writes all batches in one transaction; see persist.Store.
//
// One round trip (docs/MYSQL.md "One commit"): a multi-statement that
// starts the transaction at REPEATABLE READ, checks the fences (a locking
// count of the partition_lease rows held at the commit's epochs, LOCK IN
// SHARE MODE: Acquire takes them FOR UPDATE, so it waits for in-flight
// commits and fences later ones), moves every head by compare-and-set in
// INSERT ... ON DUPLICATE KEY UPDATE (a head that is not PrevHead becomes
// NULL, which the NOT NULL column refuses; a head row that should exist
// but was inserted shows in ROW_COUNT()), inserts the rows in (conv_id,
// seq) order and COMMITs. A failed check raises error 1048 by inserting a
// NULL head (raiseIfNotOK): the statements after a failed one, COMMIT included,
// never run. The refusal is then named by re-reading the fences and heads
// (diagnose). Rows beyond half of max_allowed_packet go in further round
// trips before the last one.
//
// Every lock is on existing rows by primary key (record locks, no gap
// locks) except the locking read of an empty batch's missing head row.
// What can still deadlock (two inserts' unique checks meeting, a zombie
// writer) is detected, rolled back and redone here, up to
// Options.MaxRetries times, and counted (Retries): it happens before
// COMMIT, so nothing was written. The connection's server thread id is
// known from when it opened (threadConnector), so a commit cut off in its
// last round trip can be settled (settle.go).
func (s *Store) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	if err := persist.CheckBatches(batches); err != nil {
		return err
	}
	if len(batches) == 0 {
		return nil
	}
	p := planCommit(batches)
	for attempt := 0; ; attempt++ {
		err := s.commitOnce(ctx, p)
		if !errors.Is(err, errRedo) {
			return err
		}
		if attempt >= s.opts.MaxRetries {
			return unavailable("commit: deadlock or lock wait timeout, retries exhausted", err)
		}
		s.retries.Add(1)
		if ctx.Err() != nil {
			return unavailable("commit", ctx.Err())
		}
	}
}

// errRedo marks a transaction rolled back by a deadlock or lock wait
// timeout before COMMIT: Commit redoes it.
var errRedo = errors.New("mysql: deadlock or lock wait timeout before COMMIT (rolled back)")

// okVar is the session variable the checks leave their verdict in.
const okVar = "@sequencer_ok"

// raiseIfNotOK fails the multi-statement with error 1048 (Column 'head'
// cannot be null) when okVar is false; otherwise it inserts nothing and
// locks nothing. Strict mode (forced at Open) makes the NULL an error.
const raiseIfNotOK = "INSERT INTO conv_head (conv_id, head) SELECT '', NULL FROM DUAL WHERE NOT " + okVar + ";"

// plan is a commit's statements' inputs, ordered.
type plan struct {
	batches  []persist.ConvBatch // by conv_id
	fences   []persist.Fence     // distinct, by partition
	unfenced bool
	// moves are the batches with messages, grouped by their number of
	// messages (one compare-and-set statement each), groups by size,
	// conv_id order inside.
	moves [][]int
	// held and free are the empty batches (a check of the head only) with
	// PrevHead > 0 (the row must hold it) and PrevHead 0 (no row, or 0).
	held, free []int
}

func planCommit(in []persist.ConvBatch) *plan {
	p := &plan{batches: slices.Clone(in)}
	slices.SortFunc(p.batches, func(a, b persist.ConvBatch) int { return strings.Compare(a.ConvID, b.ConvID) })
	p.fences, p.unfenced = persist.Fences(p.batches)
	bySize := map[int][]int{}
	for i := range p.batches {
		b := &p.batches[i]
		switch {
		case len(b.Messages) > 0:
			bySize[len(b.Messages)] = append(bySize[len(b.Messages)], i)
		case b.PrevHead > 0:
			p.held = append(p.held, i)
		default:
			p.free = append(p.free, i)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(bySize)) {
		p.moves = append(p.moves, bySize[n])
	}
	return p
}

// sqlList appends n comma-separated copies of item to b.
func sqlList(b *strings.Builder, n int, item string) {
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(item)
	}
}

// checks writes the statements that start the transaction, check the
// fences and the empty batches' heads and move the other heads, each check
// followed by raiseIfNotOK.
func (p *plan) checks(b *strings.Builder, args []any) []any {
	b.WriteString("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION;")
	if len(p.fences) > 0 {
		keys := make([]any, len(p.fences))
		var rows []any
		for i, f := range p.fences {
			keys[i] = f.Partition
			rows = append(rows, f.Partition, f.Owner, f.Epoch)
		}
		args = lockedMatch(b, args, "partition_lease", "`partition`", "(`partition`, owner, epoch)", "(?,?,?)", keys, rows, "LOCK IN SHARE MODE")
	}
	if p.unfenced {
		b.WriteString("SELECT NOT EXISTS (SELECT 1 FROM partition_lease WHERE owner <> '') INTO " + okVar + ";" + raiseIfNotOK)
	}
	if len(p.held) > 0 {
		keys := make([]any, len(p.held))
		var rows []any
		for k, i := range p.held {
			keys[k] = p.batches[i].ConvID
			rows = append(rows, p.batches[i].ConvID, p.batches[i].PrevHead)
		}
		args = lockedMatch(b, args, "conv_head", "conv_id", "(conv_id, head)", "(?,?)", keys, rows, "FOR UPDATE")
	}
	if len(p.free) > 0 {
		fmt.Fprintf(b, "SELECT COUNT(*) = 0 INTO %s FROM conv_head FORCE INDEX (PRIMARY) WHERE conv_id IN (", okVar)
		sqlList(b, len(p.free), "?")
		b.WriteString(") AND head <> 0 FOR UPDATE;" + raiseIfNotOK)
		for _, i := range p.free {
			args = append(args, p.batches[i].ConvID)
		}
	}
	// The heads, by primary key, one upsert per batch size n: a row whose
	// head is not LastSeq-n (PrevHead) is set to NULL and refused; a
	// missing row is inserted, which is right only for PrevHead 0, so
	// ROW_COUNT() (1 per inserted row, 2 per updated one) must show
	// exactly the new conversations as inserted.
	for _, g := range p.moves {
		n := len(p.batches[g[0]].Messages)
		want := 0
		b.WriteString("INSERT INTO conv_head (conv_id, head) VALUES ")
		sqlList(b, len(g), "(?,?)")
		fmt.Fprintf(b, " ON DUPLICATE KEY UPDATE head = IF(head + %d = VALUES(head), VALUES(head), NULL);", n)
		for _, i := range g {
			args = append(args, p.batches[i].ConvID, p.batches[i].LastSeq())
			if p.batches[i].PrevHead == 0 {
				want++
			} else {
				want += 2
			}
		}
		fmt.Fprintf(b, "SET %s = ROW_COUNT() = %d;%s", okVar, want, raiseIfNotOK)
	}
	return outboxUpsert(b, args, p.batches)
}

// lockedMatch writes a locking read of table's rows with the primary keys
// keys (lock: LOCK IN SHARE MODE or FOR UPDATE) that checks each holds
// the values of one tuple of rows (cols, tuple: the row constructor and one
// tuple's placeholders), then raiseIfNotOK. The range on the primary key
// decides what is locked (FORCE INDEX: never a scan); the row constructor
// only filters.
func lockedMatch(b *strings.Builder, args []any, table, key, cols, tuple string, keys, rows []any, lock string) []any {
	fmt.Fprintf(b, "SELECT COUNT(*) = %d INTO %s FROM %s FORCE INDEX (PRIMARY) WHERE %s IN (", len(keys), okVar, table, key)
	sqlList(b, len(keys), "?")
	fmt.Fprintf(b, ") AND %s IN (", cols)
	sqlList(b, len(keys), tuple)
	fmt.Fprintf(b, ") %s;%s", lock, raiseIfNotOK)
	args = append(args, keys...)
	return append(args, rows...)
}

func (s *Store) commitOnce(ctx context.Context, p *plan) error {
	conn, err := s.commits.Conn(ctx)
	if err != nil {
		return unavailable("commit: acquire connection", err)
	}
	defer conn.Close()
	thread, err := threadOf(conn)
	if err != nil {
		return unavailable("commit: connection", err)
	}
	trips := s.writeTrips(p)
	for k, t := range trips {
		last := k == len(trips)-1
		if last {
			if s.beforeLast != nil {
				s.beforeLast(thread)
			}
			t.sql += "COMMIT"
		}
		_, err := conn.ExecContext(ctx, t.sql, t.args...)
		if err == nil {
			continue
		}
		if !last || !connLost(err) || errors.Is(err, driver.ErrBadConn) {
			// A statement failed (COMMIT did not run: the statements after
			// a failed one are skipped), or nothing of COMMIT's round trip
			// was sent.
			s.rollback(conn)
			switch {
			case retryable(err):
				return fmt.Errorf("%w: %v", errRedo, err)
			case isCheckFailed(err):
				return s.diagnose(ctx, p, err)
			case isNumber(err, erDupEntry):
				return s.conflicts(ctx, p, err)
			}
			if _, ok := mysqlErr(err); ok && rejected(err) {
				return persist.ErrRejected
			}
			return classify("commit: write", err)
		}
		// COMMIT was on its way: it may have run, and the server thread may
		// still run it. Settle must end that thread before anyone re-reads.
		s.unsettle(thread)
		return unknownOutcome("commit: COMMIT", err)
	}
	return nil
}

// isCheckFailed reports the error of a failed check: raiseIfNotOK or a
// head compare-and-set (a NULL head).
func isCheckFailed(err error) bool {
	me, ok := mysqlErr(err)
	return ok && me.Number == erBadNull && strings.Contains(me.Message, "'head'")
}

// scanAll calls scan for every row of the current result set.
func scanAll(rows *sql.Rows, scan func() error) error {
	for rows.Next() {
		if err := scan(); err != nil {
			return err
		}
	}
	return rows.Err()
}

// diagnose names why a check failed (the transaction is rolled back;
// this reads): a stale fence, a cluster that holds partitions while the
// commit is unfenced, or the conversations whose stored head is not their
// PrevHead. Fences and heads never return to an older value, so what was
// wrong inside the transaction is still wrong now; if nothing is, the
// commit failed without a cause that lasted, and nothing was written.
func (s *Store) diagnose(ctx context.Context, p *plan, cause error) error {
	leases := map[uint32]persist.Fence{}
	if len(p.fences) > 0 {
		var q strings.Builder
		q.WriteString("SELECT `partition`, owner, epoch FROM partition_lease WHERE `partition` IN (")
		sqlList(&q, len(p.fences), "?")
		q.WriteString(")")
		args := make([]any, len(p.fences))
		for i, f := range p.fences {
			args[i] = f.Partition
		}
		if err := s.readRows(ctx, q.String(), args, func(rows *sql.Rows) error {
			var f persist.Fence
			if err := rows.Scan(&f.Partition, &f.Owner, &f.Epoch); err != nil {
				return err
			}
			leases[f.Partition] = f
			return nil
		}); err != nil {
			return unavailable("commit: read fences", errors.Join(cause, err))
		}
	}
	held := func() (bool, error) {
		var held bool
		if err := s.read.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM partition_lease WHERE owner <> '')").Scan(&held); err != nil {
			return false, unavailable("commit: read leases", errors.Join(cause, err))
		}
		return held, nil
	}
	if err := membership.CheckFences(p.fences, p.unfenced, membership.InLeases(leases), held); err != nil {
		return err
	}
	var q strings.Builder
	q.WriteString("SELECT conv_id, head FROM conv_head WHERE conv_id IN (")
	sqlList(&q, len(p.batches), "?")
	q.WriteString(")")
	args := make([]any, len(p.batches))
	for i := range p.batches {
		args[i] = p.batches[i].ConvID
	}
	heads := map[string]uint64{}
	if err := s.readRows(ctx, q.String(), args, func(rows *sql.Rows) error {
		var c string
		var h uint64
		if err := rows.Scan(&c, &h); err != nil {
			return err
		}
		heads[c] = h
		return nil
	}); err != nil {
		return unavailable("commit: read heads", errors.Join(cause, err))
	}
	if err := persist.CheckHeads(p.batches, func(c string) uint64 { return heads[c] }); err != nil {
		return err
	}
	return unavailable("commit: a check failed, and the fences and heads read after it are as expected", cause)
}

// readRows runs a query on the read pool and calls scan for every row.
func (s *Store) readRows(ctx context.Context, q string, args []any, scan func(*sql.Rows) error) error {
	rows, err := s.read.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return scanAll(rows, func() error { return scan(rows) })
}

// trip is one round trip of the write phase.
type trip struct {
	sql  string
	args []any
}

// rowBytes bounds the bytes one message adds to a statement (escaped body,
// keys, literals).
func rowBytes(m *sequencer.Message) int {
	return 2*len(m.Body) + 2*len(m.ConvID) + 2*len(m.ClientMsgID) + 128
}

// writeTrips builds the commit's round trips: the checks and head moves,
// then the rows in (conv_id, seq) order, in statements of at most half of
// max_allowed_packet, grouped into round trips of that size. COMMIT is
// appended to the last one by the caller.
func (s *Store) writeTrips(p *plan) []trip {
	limit := s.maxPacket / 2
	if limit <= 0 {
		limit = 1 << 20
	}
	var trips []trip
	var cur trip
	var sqlb strings.Builder
	flush := func() {
		if sqlb.Len() > 0 {
			cur.sql = sqlb.String()
			trips = append(trips, cur)
		}
		cur = trip{}
		sqlb.Reset()
	}
	rows := 0
	for i := range p.batches {
		rows += len(p.batches[i].Messages)
	}
	// One allocation for the arguments and the text of a commit that fits
	// in one round trip (the usual case).
	cur.args = make([]any, 0, 3*len(p.fences)+2*len(p.batches)+10*rows)
	sqlb.Grow(256 + 24*len(p.batches) + 32*rows)
	cur.args = p.checks(&sqlb, cur.args)
	inStmt, size := false, sqlb.Len()
	for _, a := range cur.args {
		if v, ok := a.(string); ok {
			size += 2 * len(v) // escaped in the worst case
		} else {
			size += 20
		}
	}
	for i := range p.batches {
		for j := range p.batches[i].Messages {
			m := &p.batches[i].Messages[j]
			n := rowBytes(m)
			if size+n > limit && (inStmt || size > 0) {
				if inStmt {
					sqlb.WriteString(";")
				}
				flush()
				inStmt, size = false, 0
			}
			if !inStmt {
				sqlb.WriteString("INSERT INTO im_message (msg_id, conv_id, seq, from_uid, msg_type, body, client_msg_id, server_at, kind, target_msg_id) VALUES ")
				inStmt = true
			} else {
				sqlb.WriteByte(',')
			}
			sqlb.WriteString("(?,?,?,?,?,?,?,?,?,?)")
			body := m.Body
			if body == nil {
				body = []byte{}
			}
			cur.args = append(cur.args, m.MsgID, m.ConvID, m.Seq, m.FromUID, m.MsgType, body, m.ClientMsgID, storedTime(m.ServerAt), int16(m.Kind), m.TargetMsgID)
			size += n
		}
	}
	if inStmt {
		sqlb.WriteString(";")
	}
	// The target updates of edits and recalls (persist/events.go), one
	// statement each in seq order, after every row.
	for i := range p.batches {
		for j := range p.batches[i].Messages {
			m := &p.batches[i].Messages[j]
			if m.Kind == sequencer.KindMessage {
				continue
			}
			if n := rowBytes(m); size+n > limit && size > 0 {
				flush()
				size = 0
			}
			switch m.Kind {
			case sequencer.KindEdit:
				body := m.Body
				if body == nil {
					body = []byte{}
				}
				sqlb.WriteString(`UPDATE im_message SET body = ?, edit_count = edit_count + 1, edited_at = ? WHERE conv_id = ? AND msg_id = ? AND kind = 0;`)
				cur.args = append(cur.args, body, storedTime(m.ServerAt), m.ConvID, m.TargetMsgID)
			case sequencer.KindRecall:
				sqlb.WriteString(`UPDATE im_message SET body = '', recalled = true WHERE conv_id = ? AND msg_id = ? AND kind = 0;`)
				cur.args = append(cur.args, m.ConvID, m.TargetMsgID)
				if !p.batches[i].RecallsOfUnedited { // its edit events lose their bodies too
					sqlb.WriteString(`UPDATE im_message SET body = '', recalled = true WHERE conv_id = ? AND target_msg_id = ? AND kind = 1;`)
					cur.args = append(cur.args, m.ConvID, m.TargetMsgID)
				}
			}
			size += rowBytes(m)
		}
	}
	if marks := persist.SenderMarks(p.batches); len(marks) > 0 {
		if n := 100 * len(marks); size+n > limit && size > 0 {
			flush()
		}
		cur.args = senderMarks(&sqlb, cur.args, marks)
	}
	flush()
	return trips
}

// storedTime is t as stored: UTC, truncated to the millisecond (DATETIME(3)
// would round).
func storedTime(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

// rollback ends the transaction on conn; if it cannot, the connection is
// broken and the server rolls back when it notices.
func (s *Store) rollback(conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // never reuse it
	}
}

// rejected reports a data error: a value the schema cannot hold.
func rejected(err error) bool {
	me, ok := mysqlErr(err)
	if !ok {
		return false
	}
	switch me.Number {
	case 1048, // column cannot be null
		1264, // out of range
		1292, // incorrect datetime value
		1366, // incorrect string value
		1406: // data too long
		return true
	}
	return false
}

// classify wraps a failure in which nothing was written.
func classify(op string, err error) error {
	return unavailable(op, err)
}

// conflicts builds the *ConflictError of a commit whose insert hit a unique
// key, by looking up which of its keys stored rows hold (the transaction is
// rolled back; this is a read).
func (s *Store) conflicts(ctx context.Context, p *plan, cause error) error {
	var q strings.Builder
	var args []any
	cols := "msg_id, conv_id, seq, from_uid, client_msg_id FROM im_message WHERE "
	var ids, seqs, keys []string
	for i := range p.batches {
		for range p.batches[i].Messages {
			ids = append(ids, "?")
			seqs = append(seqs, "(conv_id = ? AND seq = ?)")
			keys = append(keys, "(from_uid = ? AND client_msg_id = ?)")
		}
	}
	q.WriteString("SELECT 1, " + cols + "msg_id IN (" + strings.Join(ids, ",") + ")")
	q.WriteString(" UNION ALL SELECT 2, " + cols + strings.Join(seqs, " OR "))
	q.WriteString(" UNION ALL SELECT 3, " + cols + strings.Join(keys, " OR "))
	for pass := 0; pass < 3; pass++ {
		for i := range p.batches {
			for j := range p.batches[i].Messages {
				m := &p.batches[i].Messages[j]
				switch pass {
				case 0:
					args = append(args, m.MsgID)
				case 1:
					args = append(args, m.ConvID, m.Seq)
				case 2:
					args = append(args, m.FromUID, m.ClientMsgID)
				}
			}
		}
	}
	rows, err := s.read.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return unavailable("commit: find conflicting rows", errors.Join(cause, err))
	}
	defer rows.Close()
	var hits []persist.StoredKey
	if err := scanAll(rows, func() error {
		var h persist.StoredKey
		var kind int
		if err := rows.Scan(&kind, &h.MsgID, &h.ConvID, &h.Seq, &h.FromUID, &h.ClientMsgID); err != nil {
			return err
		}
		h.Key = [...]persist.ConflictKey{0, persist.KeyMsgID, persist.KeyConvSeq, persist.KeyClientMsgID}[kind]
		hits = append(hits, h)
		return nil
	}); err != nil {
		return unavailable("commit: find conflicting rows", errors.Join(cause, err))
	}
	ce := persist.ConflictsWith(p.batches, hits)
	if ce == nil {
		return unavailable("commit: unique key conflict with a row that is gone", cause)
	}
	return ce
}
