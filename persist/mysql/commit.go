package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// Commit writes all batches in one transaction; see persist.Store.
//
// Isolation and locking (docs/MYSQL.md): REPEATABLE READ, set for every
// transaction. Every lock a commit takes is on existing rows by primary key
// (record locks, no gap locks): the partition_lease rows of its fences
// (LOCK IN SHARE MODE, partition order; Acquire takes them FOR UPDATE, so it
// waits for in-flight commits and fences later ones), the conv_head rows of
// its conversations with a PrevHead (FOR UPDATE, conv_id order); new
// conversations get their head row by INSERT (insert-intention locks do not
// block each other; a row that exists already is a head mismatch). The rows
// go in (conv_id, seq) order. What can still deadlock (two inserts' unique
// checks meeting, a zombie writer) is detected, rolled back and redone here,
// up to Options.MaxRetries times, and counted (Retries): it happens before
// COMMIT, so nothing was written.
//
// Round trips: (1) SET TRANSACTION, START TRANSACTION, CONNECTION_ID(), the
// locking reads and the new head rows; (2) the head UPDATE, the multi-row
// INSERT and COMMIT, as one multi-statement (a failed statement stops the
// ones after it, so COMMIT runs only when everything before it succeeded).
// Rows beyond half of max_allowed_packet go in further round trips before
// the last one.
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

// plan is a commit's statements' inputs, ordered.
type plan struct {
	batches  []persist.ConvBatch // by conv_id
	fences   []persist.Fence     // distinct, by partition
	unfenced bool
	locked   []int // batches whose head row must exist: locked FOR UPDATE (PrevHead > 0, or an empty batch)
	created  []int // batches of new conversations: head row inserted
}

func planCommit(in []persist.ConvBatch) *plan {
	p := &plan{batches: slices.Clone(in)}
	slices.SortFunc(p.batches, func(a, b persist.ConvBatch) int { return strings.Compare(a.ConvID, b.ConvID) })
	p.fences, p.unfenced = persist.Fences(p.batches)
	for i := range p.batches {
		b := &p.batches[i]
		if b.PrevHead == 0 && len(b.Messages) > 0 {
			p.created = append(p.created, i)
		} else {
			p.locked = append(p.locked, i)
		}
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

func (s *Store) commitOnce(ctx context.Context, p *plan) error {
	conn, err := s.commits.Conn(ctx)
	if err != nil {
		return unavailable("commit: acquire connection", err)
	}
	defer conn.Close()

	// Round trip 1: the checks.
	var q strings.Builder
	var args []any
	q.WriteString("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION; SELECT CONNECTION_ID();")
	if len(p.fences) > 0 {
		q.WriteString("SELECT `partition`, owner, epoch FROM partition_lease FORCE INDEX (PRIMARY) WHERE `partition` IN (")
		sqlList(&q, len(p.fences), "?")
		q.WriteString(") ORDER BY `partition` LOCK IN SHARE MODE;")
		for _, f := range p.fences {
			args = append(args, f.Partition)
		}
	}
	if p.unfenced {
		q.WriteString("SELECT EXISTS (SELECT 1 FROM partition_lease WHERE owner <> '');")
	}
	if len(p.locked) > 0 {
		q.WriteString("SELECT conv_id, head FROM conv_head FORCE INDEX (PRIMARY) WHERE conv_id IN (")
		sqlList(&q, len(p.locked), "?")
		q.WriteString(") ORDER BY conv_id FOR UPDATE;")
		for _, i := range p.locked {
			args = append(args, p.batches[i].ConvID)
		}
	}
	if len(p.created) > 0 {
		q.WriteString("INSERT INTO conv_head (conv_id, head) VALUES ")
		sqlList(&q, len(p.created), "(?,?)")
		for _, i := range p.created {
			args = append(args, p.batches[i].ConvID, p.batches[i].LastSeq())
		}
	}
	var thread uint64
	leases := map[uint32]persist.Fence{}
	clusterHeld := false
	heads := map[string]uint64{}
	err = func() error {
		rows, err := conn.QueryContext(ctx, q.String(), args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		if err := scanAll(rows, func() error { return rows.Scan(&thread) }); err != nil {
			return err
		}
		if len(p.fences) > 0 {
			if !rows.NextResultSet() {
				return resultErr(rows)
			}
			if err := scanAll(rows, func() error {
				var f persist.Fence
				if err := rows.Scan(&f.Partition, &f.Owner, &f.Epoch); err != nil {
					return err
				}
				leases[f.Partition] = f
				return nil
			}); err != nil {
				return err
			}
		}
		if p.unfenced {
			if !rows.NextResultSet() {
				return resultErr(rows)
			}
			if err := scanAll(rows, func() error { return rows.Scan(&clusterHeld) }); err != nil {
				return err
			}
		}
		if len(p.locked) > 0 {
			if !rows.NextResultSet() {
				return resultErr(rows)
			}
			if err := scanAll(rows, func() error {
				var c string
				var h uint64
				if err := rows.Scan(&c, &h); err != nil {
					return err
				}
				heads[c] = h
				return nil
			}); err != nil {
				return err
			}
		}
		for rows.NextResultSet() { // the INSERT's outcome
		}
		return rows.Err()
	}()
	if err != nil {
		s.rollback(conn)
		switch {
		case retryable(err):
			return fmt.Errorf("%w: %v", errRedo, err)
		case isNumber(err, erDupEntry) && len(p.created) > 0:
			// Only the head rows are inserted in this round trip: a new
			// conversation's row exists. The fences come first.
			if err := s.checkFences(p, leases); err != nil && thread != 0 {
				return err
			}
			return s.headMismatch(ctx, p, heads)
		}
		return classify("commit: checks", err)
	}
	if err := s.checkFences(p, leases); err != nil {
		s.rollback(conn)
		return err
	}
	if clusterHeld {
		s.rollback(conn)
		return persist.ErrUnfenced
	}
	for _, i := range p.locked {
		b := &p.batches[i]
		if h, ok := heads[b.ConvID]; (ok && h != b.PrevHead) || (!ok && b.PrevHead != 0) {
			s.rollback(conn)
			return s.headMismatch(ctx, p, heads)
		}
	}
	if s.beforeCommit != nil {
		s.beforeCommit(thread)
	}

	// Round trip 2 (and more for large commits): the rows and COMMIT.
	trips := s.writeTrips(p)
	for k, t := range trips {
		last := k == len(trips)-1
		if last {
			t.sql += "COMMIT"
		}
		_, err := conn.ExecContext(ctx, t.sql, t.args...)
		if err == nil {
			continue
		}
		if !last || !connLost(err) || errors.Is(err, driver.ErrBadConn) {
			// A statement failed (COMMIT did not run: the statements after a
			// failed one are skipped), or nothing of COMMIT's round trip was
			// sent.
			s.rollback(conn)
			switch {
			case retryable(err):
				return fmt.Errorf("%w: %v", errRedo, err)
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

// scanAll calls scan for every row of the current result set.
func scanAll(rows *sql.Rows, scan func() error) error {
	for rows.Next() {
		if err := scan(); err != nil {
			return err
		}
	}
	return rows.Err()
}

// resultErr is the error of a missing result set.
func resultErr(rows *sql.Rows) error {
	if err := rows.Err(); err != nil {
		return err
	}
	return errors.New("mysql: commit: a result set is missing")
}

// checkFences returns the *StaleFenceError of the fences whose lease row
// (as read, locked) is not held by their owner at their epoch.
func (s *Store) checkFences(p *plan, leases map[uint32]persist.Fence) error {
	var stale []persist.Fence
	for _, f := range p.fences {
		if l, ok := leases[f.Partition]; !ok || l.Owner != f.Owner || l.Epoch != f.Epoch {
			stale = append(stale, f)
		}
	}
	if len(stale) > 0 {
		return &persist.StaleFenceError{Fences: stale}
	}
	return nil
}

// headMismatch names every conversation of p whose stored head is not its
// PrevHead (heads: the locked rows already read). The transaction is rolled
// back; this reads.
func (s *Store) headMismatch(ctx context.Context, p *plan, heads map[string]uint64) error {
	var bad []string
	for _, i := range p.locked {
		b := &p.batches[i]
		if h, ok := heads[b.ConvID]; (ok && h != b.PrevHead) || (!ok && b.PrevHead != 0) {
			bad = append(bad, b.ConvID)
		}
	}
	if len(p.created) > 0 {
		var q strings.Builder
		q.WriteString("SELECT conv_id FROM conv_head WHERE conv_id IN (")
		sqlList(&q, len(p.created), "?")
		q.WriteString(")")
		args := make([]any, len(p.created))
		for k, i := range p.created {
			args[k] = p.batches[i].ConvID
		}
		rows, err := s.read.QueryContext(ctx, q.String(), args...)
		if err != nil {
			return unavailable("commit: read heads", err)
		}
		defer rows.Close()
		if err := scanAll(rows, func() error {
			var c string
			if err := rows.Scan(&c); err != nil {
				return err
			}
			bad = append(bad, c)
			return nil
		}); err != nil {
			return unavailable("commit: read heads", err)
		}
	}
	if len(bad) == 0 {
		return unavailable("commit: head check", errors.New("a head row appeared and vanished"))
	}
	slices.Sort(bad)
	return &persist.HeadMismatchError{ConvIDs: slices.Compact(bad)}
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

// writeTrips builds the write phase: the head UPDATE and the rows in
// (conv_id, seq) order, in statements of at most half of
// max_allowed_packet, grouped into round trips of that size.
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
	var upd []int
	for _, i := range p.locked {
		if len(p.batches[i].Messages) > 0 {
			upd = append(upd, i)
		}
	}
	// The heads, all in one statement by primary key (the rows exist and
	// are locked FOR UPDATE already): an upsert takes record locks on the
	// rows it finds, where an UPDATE over an IN list may run as a scan,
	// which at REPEATABLE READ locks every row it passes (other writers'
	// heads) and deadlocks concurrent group commits.
	if len(upd) > 0 {
		sqlb.WriteString("INSERT INTO conv_head (conv_id, head) VALUES ")
		sqlList(&sqlb, len(upd), "(?,?)")
		sqlb.WriteString(" ON DUPLICATE KEY UPDATE head = VALUES(head);")
		for _, i := range upd {
			cur.args = append(cur.args, p.batches[i].ConvID, p.batches[i].LastSeq())
		}
	}
	inStmt, size := false, sqlb.Len()
	for i := range p.batches {
		for j := range p.batches[i].Messages {
			m := &p.batches[i].Messages[j]
			n := rowBytes(m)
			if inStmt && size+n > limit {
				sqlb.WriteString(";")
				flush()
				inStmt, size = false, 0
			}
			if !inStmt {
				sqlb.WriteString("INSERT INTO im_message (msg_id, conv_id, seq, from_uid, msg_type, body, client_msg_id, server_at) VALUES ")
				inStmt = true
			} else {
				sqlb.WriteByte(',')
			}
			sqlb.WriteString("(?,?,?,?,?,?,?,?)")
			body := m.Body
			if body == nil {
				body = []byte{}
			}
			cur.args = append(cur.args, m.MsgID, m.ConvID, m.Seq, m.FromUID, m.MsgType, body, m.ClientMsgID, storedTime(m.ServerAt))
			size += n
		}
	}
	if inStmt {
		sqlb.WriteString(";")
	}
	flush()
	if len(trips) == 0 {
		trips = append(trips, trip{})
	}
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
