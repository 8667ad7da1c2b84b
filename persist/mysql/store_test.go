package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/mysqltest"
	"github.com/sequencer-im/sequencer/persist/storetest"
)

func msg(conv string, seq, id uint64, client string) sequencer.Message {
	return sequencer.Message{MsgID: id, ConvID: conv, Seq: seq, FromUID: 1, MsgType: 1, Body: []byte("x"),
		ClientMsgID: client, ServerAt: time.Now().UTC().Truncate(time.Millisecond)}
}

// session opens a connection of its own on the store's database (a
// blocker: another client holding locks).
func session(t *testing.T, s *Store) *sql.Conn {
	t.Helper()
	c, err := s.read.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func exec(t *testing.T, c interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, q string, args ...any) {
	t.Helper()
	if _, err := c.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// waitFor polls cond until it holds or 20s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not settling
	}
}

// lockWaiters counts this database's statements that wait for a row lock:
// the locking reads and the commits' head upserts that are running (they
// work on a few rows by primary key: in these tests running means
// waiting). INNODB_TRX does not show a wait that happens while the
// optimizer reads a const row.
func lockWaiters(t *testing.T, s *Store) int {
	var n int
	if err := s.read.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM information_schema.PROCESSLIST
		WHERE DB = DATABASE() AND COMMAND = 'Query' AND (INFO LIKE '%FOR UPDATE%' OR INFO LIKE '%LOCK IN SHARE MODE%'
			OR INFO LIKE 'INSERT INTO conv_head (conv_id, head) VALUES%')
		AND INFO NOT LIKE '%PROCESSLIST%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func threadAlive(t *testing.T, s *Store, id uint64) bool {
	var n int
	if err := s.read.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// Taking a partition bumps its epoch only after the commits in flight under
// the old fence finished (they land), and fences out every later one.
func TestClusterEpochBumpWaitsForInFlightCommit(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC))
	cs := s.Cluster().WithClock(clk)
	a := membership.Member{NodeID: "a", Incarnation: "a/1", ClusterAddr: "a", APIAddr: "a"}
	b := membership.Member{NodeID: "b", Incarnation: "b/1", ClusterAddr: "b", APIAddr: "b"}
	if _, err := cs.Join(ctx, a, 5*time.Second, false); err != nil {
		t.Fatal(err)
	}
	v, err := cs.Join(ctx, b, 5*time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	const p = 7
	ls, err := cs.Acquire(ctx, a.Incarnation, v.Version, []uint32{p})
	if err != nil || len(ls) != 1 {
		t.Fatalf("a acquire: %v %v", ls, err)
	}
	fenceA := persist.Fence{Partition: p, Owner: a.Incarnation, Epoch: ls[0].Epoch}
	const conv = "g:1"
	if err := s.Commit(ctx, []persist.ConvBatch{{ConvID: conv, PrevHead: 0, Fence: fenceA, Messages: []sequencer.Message{msg(conv, 1, 101, "c1")}}}); err != nil {
		t.Fatalf("first commit: %v", err)
	}
	// Hold the conversation's head row so a's next commit stops after its
	// fence check (it holds the lease row shared) while it is in flight.
	blocker := session(t, s)
	exec(t, blocker, "START TRANSACTION")
	exec(t, blocker, "SELECT head FROM conv_head WHERE conv_id = ? FOR UPDATE", conv)
	commitDone := make(chan error, 1)
	go func() {
		commitDone <- s.Commit(ctx, []persist.ConvBatch{{ConvID: conv, PrevHead: 1, Fence: fenceA, Messages: []sequencer.Message{msg(conv, 2, 102, "c2")}}})
	}()
	waitFor(t, "the commit to wait for the head row", func() bool { return lockWaiters(t, s) >= 1 })

	// a's lease expires; b takes the partition: it must wait for a's commit.
	clk.Advance(4 * time.Second)
	if _, err := cs.Heartbeat(ctx, b.NodeID, b.Incarnation, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	if v, err = cs.Heartbeat(ctx, b.NodeID, b.Incarnation, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if v.Live(a.Incarnation) {
		t.Fatal("a still live")
	}
	type acq struct {
		ls  []membership.PartitionLease
		err error
	}
	acqDone := make(chan acq, 1)
	go func() {
		ls, err := cs.Acquire(ctx, b.Incarnation, v.Version, []uint32{p})
		acqDone <- acq{ls, err}
	}()
	waitFor(t, "the acquire to wait for the lease row", func() bool {
		select {
		case r := <-acqDone:
			t.Fatalf("acquire returned while a commit under the old epoch was in flight: %+v %v", r, r.err)
		default:
		}
		return lockWaiters(t, s) >= 2
	})
	select {
	case r := <-acqDone:
		t.Fatalf("acquire returned while a commit under the old epoch was in flight: %+v", r)
	case err := <-commitDone:
		t.Fatalf("commit returned while blocked: %v", err)
	default:
	}
	// Membership is not blocked by the waiting acquire.
	if _, err := cs.Heartbeat(ctx, b.NodeID, b.Incarnation, 5*time.Second); err != nil {
		t.Fatalf("heartbeat while an acquire waits: %v", err)
	}
	exec(t, blocker, "ROLLBACK")
	if err := <-commitDone; err != nil {
		t.Fatalf("in-flight commit under the old epoch: %v (it held the lease first, so it lands)", err)
	}
	r := <-acqDone
	if r.err != nil || len(r.ls) != 1 || r.ls[0].Epoch != fenceA.Epoch+1 {
		t.Fatalf("b's acquire: %+v, want epoch %d", r, fenceA.Epoch+1)
	}
	fenceB := persist.Fence{Partition: p, Owner: b.Incarnation, Epoch: r.ls[0].Epoch}
	err = s.Commit(ctx, []persist.ConvBatch{{ConvID: conv, PrevHead: 2, Fence: fenceA, Messages: []sequencer.Message{msg(conv, 3, 103, "c3")}}})
	var sf *persist.StaleFenceError
	if !errors.As(err, &sf) || !errors.Is(err, sequencer.ErrStaleEpoch) || len(sf.Fences) != 1 || sf.Fences[0] != fenceA {
		t.Fatalf("stale commit: %v, want *StaleFenceError for %v", err, fenceA)
	}
	if err := s.Commit(ctx, []persist.ConvBatch{{ConvID: conv, PrevHead: 2, Fence: fenceB, Messages: []sequencer.Message{msg(conv, 3, 104, "c4")}}}); err != nil {
		t.Fatalf("new owner's commit: %v", err)
	}
	if h, err := s.LoadHead(ctx, conv); err != nil || h != 3 {
		t.Fatalf("head %d %v, want 3", h, err)
	}
	if _, err := s.GetMessage(ctx, 103); !errors.Is(err, sequencer.ErrNotFound) {
		t.Fatalf("the stale owner's message was stored: %v", err)
	}
}

// frozenCommit starts a commit of conv seq 2 whose write round trip (rows
// and COMMIT) is frozen by another session's LOCK TABLES im_message WRITE,
// taken just before it is sent; the commit's own deadline then cuts the
// connection. It returns the commit's error, the server thread and the
// session holding the table lock.
func frozenCommit(t *testing.T, s *Store, conv string, id uint64) (error, uint64, *sql.Conn) {
	t.Helper()
	ctx := context.Background()
	if err := s.Commit(ctx, []persist.ConvBatch{{ConvID: conv, Messages: []sequencer.Message{msg(conv, 1, id, fmt.Sprint("c", id))}}}); err != nil {
		t.Fatal(err)
	}
	locker := session(t, s)
	var thread uint64
	s.beforeLast = func(th uint64) {
		thread = th
		exec(t, locker, "LOCK TABLES im_message WRITE")
	}
	defer func() { s.beforeLast = nil }()
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	err := s.Commit(cctx, []persist.ConvBatch{{ConvID: conv, PrevHead: 1, Messages: []sequencer.Message{msg(conv, 2, id+1, fmt.Sprint("c", id+1))}}})
	return err, thread, locker
}

// A commit cut off while its COMMIT round trip waits on the server is an
// unknown outcome; Settle kills the server thread and returns only once it
// is gone, and what the rows say then stays true: a commit rolled back by
// the kill never lands later.
func TestUnknownOutcomeSettledByKill(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	const conv = "g:frozen"
	err, thread, locker := frozenCommit(t, s, conv, 500)
	if !errors.Is(err, sequencer.ErrUnknownOutcome) || persist.OutcomeOf(err) != persist.Unknown {
		t.Fatalf("commit cut off during its COMMIT round trip: %v, want ErrUnknownOutcome", err)
	}
	if thread == 0 || !threadAlive(t, s, thread) {
		t.Fatalf("the frozen commit's server thread %d should still be running", thread)
	}
	if err := s.Settle(ctx); err != nil {
		t.Fatalf("settle: %v", err)
	}
	if threadAlive(t, s, thread) {
		t.Fatal("Settle returned while the commit's server thread was still running")
	}
	exec(t, locker, "UNLOCK TABLES")
	// The truth now, and later: nothing of the cut commit.
	for i := 0; i < 2; i++ {
		if h, err := s.LoadHead(ctx, conv); err != nil || h != 1 {
			t.Fatalf("head %d %v, want 1", h, err)
		}
		if _, err := s.GetMessage(ctx, 501); !errors.Is(err, sequencer.ErrNotFound) {
			t.Fatalf("the killed commit's row: %v", err)
		}
		// A write after the unlock goes through the table the frozen thread
		// waited for: had it survived, its row would be there by now.
		if err := s.Commit(ctx, []persist.ConvBatch{{ConvID: "g:other" + fmt.Sprint(i), Messages: []sequencer.Message{msg("g:other"+fmt.Sprint(i), 1, 600+uint64(i), fmt.Sprint("o", i))}}}); err != nil {
			t.Fatal(err)
		}
	}
	// The store works on: the next commit of conv continues at 2.
	if err := s.Commit(ctx, []persist.ConvBatch{{ConvID: conv, PrevHead: 1, Messages: []sequencer.Message{msg(conv, 2, 502, "c502")}}}); err != nil {
		t.Fatalf("commit after settle: %v", err)
	}
}

// When the frozen thread is released before Settle, its COMMIT runs: Settle
// waits until the thread is gone, and the rows then show the commit landed
// (or, if the kill came first, that it did not), and that stays so.
func TestUnknownOutcomeLandedAfterCut(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	const conv = "g:frozen2"
	err, thread, locker := frozenCommit(t, s, conv, 700)
	if !errors.Is(err, sequencer.ErrUnknownOutcome) {
		t.Fatalf("commit: %v, want ErrUnknownOutcome", err)
	}
	exec(t, locker, "UNLOCK TABLES")
	if err := s.Settle(ctx); err != nil {
		t.Fatalf("settle: %v", err)
	}
	if threadAlive(t, s, thread) {
		t.Fatal("Settle returned while the commit's server thread was still running")
	}
	h, err := s.LoadHead(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	_, gerr := s.GetMessage(ctx, 701)
	switch {
	case h == 2 && gerr == nil, h == 1 && errors.Is(gerr, sequencer.ErrNotFound):
	default:
		t.Fatalf("head %d, row %v: half a commit", h, gerr)
	}
	if h2, _ := s.LoadHead(ctx, conv); h2 != h {
		t.Fatalf("head moved after Settle: %d -> %d", h, h2)
	}
	t.Logf("outcome after settle: head %d", h)
}

// A commit that waits longer than innodb_lock_wait_timeout for a row lock
// (1205) is rolled back, redone and counted; once the lock is free it lands
// once.
func TestLockWaitTimeoutRedone(t *testing.T) {
	url := newDatabaseURL(t)
	s := openStore(t, url, Options{CommitLockWait: time.Second, MaxRetries: 100})
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const conv = "g:wait"
	if err := s.Commit(ctx, []persist.ConvBatch{{ConvID: conv, Messages: []sequencer.Message{msg(conv, 1, 1, "c1")}}}); err != nil {
		t.Fatal(err)
	}
	blocker := session(t, s)
	exec(t, blocker, "START TRANSACTION")
	exec(t, blocker, "SELECT head FROM conv_head WHERE conv_id = ? FOR UPDATE", conv)
	done := make(chan error, 1)
	go func() {
		done <- s.Commit(ctx, []persist.ConvBatch{{ConvID: conv, PrevHead: 1, Messages: []sequencer.Message{msg(conv, 2, 2, "c2")}}})
	}()
	waitFor(t, "a redo after a lock wait timeout", func() bool { return s.Retries() >= 1 })
	exec(t, blocker, "ROLLBACK")
	if err := <-done; err != nil {
		t.Fatalf("commit: %v", err)
	}
	if h, _ := s.LoadHead(ctx, conv); h != 2 {
		t.Fatalf("head %d, want 2", h)
	}
}

// A deadlock between a commit and another transaction (1213): InnoDB rolls
// the lighter one back; when that is the commit, it is redone and counted,
// and either way the commit lands exactly once.
func TestDeadlockRedone(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	a, b := "g:a", "g:b"
	if err := s.Commit(ctx, []persist.ConvBatch{
		{ConvID: a, Messages: []sequencer.Message{msg(a, 1, 1, "a1")}},
		{ConvID: b, Messages: []sequencer.Message{msg(b, 1, 2, "b1")}}}); err != nil {
		t.Fatal(err)
	}
	blocker := session(t, s)
	exec(t, blocker, "START TRANSACTION")
	// Make the blocker heavy (many undo records), so InnoDB picks the
	// commit as the deadlock victim.
	exec(t, blocker, "UPDATE worker_lease SET token = token + 1")
	exec(t, blocker, "SELECT head FROM conv_head WHERE conv_id = ? FOR UPDATE", b)
	done := make(chan error, 1)
	go func() {
		done <- s.Commit(ctx, []persist.ConvBatch{
			{ConvID: a, PrevHead: 1, Messages: []sequencer.Message{msg(a, 2, 3, "a2")}},
			{ConvID: b, PrevHead: 1, Messages: []sequencer.Message{msg(b, 2, 4, "b2")}}})
	}()
	waitFor(t, "the commit to hold a and wait for b", func() bool { return lockWaiters(t, s) >= 1 })
	// The blocker now wants a, which the commit holds: a deadlock.
	_, berr := blocker.ExecContext(ctx, "SELECT head FROM conv_head WHERE conv_id = ? FOR UPDATE", a)
	if berr != nil && !isNumber(berr, erLockDeadlock) {
		t.Fatalf("blocker: %v", berr)
	}
	if berr == nil {
		// The commit was the victim: it is redone, and waits for the
		// blocker again.
		waitFor(t, "the redo to be counted", func() bool { return s.Retries() >= 1 })
	}
	exec(t, blocker, "ROLLBACK")
	if err := <-done; err != nil {
		t.Fatalf("commit: %v", err)
	}
	if berr == nil && s.Retries() < 1 {
		t.Fatal("the commit was the deadlock victim but no redo was counted")
	}
	for _, c := range []string{a, b} {
		if h, _ := s.LoadHead(ctx, c); h != 2 {
			t.Fatalf("head of %s = %d, want 2", c, h)
		}
	}
	t.Logf("deadlock victim: commit=%v, retries=%d", berr == nil, s.Retries())
}

// Concurrent group commits of many new and existing conversations (the
// pattern whose gap locks deadlock naive schemes) all land; redos, if any,
// are counted and invisible to the caller.
func TestConcurrentGroupCommits(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	const workers, rounds, convs = 4, 15, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				var bs []persist.ConvBatch
				for c := 0; c < convs; c++ {
					conv := fmt.Sprintf("g:%d:%d", c, w) // each writer owns its conversations
					id := uint64(1_000_000 + w*100_000 + r*1000 + c)
					bs = append(bs, persist.ConvBatch{ConvID: conv, PrevHead: uint64(r), Messages: []sequencer.Message{msg(conv, uint64(r+1), id, fmt.Sprint("k", id))}})
				}
				if err := s.Commit(ctx, bs); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var n int
	if err := s.read.QueryRowContext(ctx, "SELECT COUNT(*) FROM im_message").Scan(&n); err != nil || n != workers*rounds*convs {
		t.Fatalf("%d rows (%v), want %d", n, err, workers*rounds*convs)
	}
	t.Logf("redos: %d", s.Retries())
}

func newDatabaseURL(t *testing.T) string {
	t.Helper()
	u := mysqltest.NewDatabase(t)
	return u
}

// The message table is the seed's DDL: column types, engine, charset and
// the two unique keys by name.
func TestSchemaMatchesSeed(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	rows, err := s.read.QueryContext(ctx, `SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'im_message' ORDER BY ORDINAL_POSITION`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var n, ty, null string
		if err := rows.Scan(&n, &ty, &null); err != nil {
			t.Fatal(err)
		}
		got = append(got, n+" "+ty+" "+null)
	}
	rows.Close()
	want := []string{"msg_id bigint(20) unsigned NO", "conv_id varchar(64) NO", "seq bigint(20) unsigned NO",
		"from_uid bigint(20) unsigned NO", "msg_type smallint(6) NO", "body mediumblob NO",
		"client_msg_id varchar(64) NO", "server_at datetime(3) NO",
		// The seed's columns above stay as written; 0004 adds these
		// (docs/API.md, "Storage schema").
		"kind smallint(6) NO", "target_msg_id bigint(20) unsigned NO", "recalled tinyint(1) NO",
		"edit_count int(10) unsigned NO", "edited_at datetime(3) YES"}
	norm := func(s string) string {
		return strings.NewReplacer("(20)", "", "(6)", "", "(10)", "", "(1)", "").Replace(s)
	} // MySQL 8 drops display widths
	if len(got) != len(want) {
		t.Fatalf("columns %v", got)
	}
	for i := range want {
		if norm(got[i]) != norm(want[i]) {
			t.Fatalf("column %d: %q, want %q", i, got[i], want[i])
		}
	}
	var engine, coll string
	if err := s.read.QueryRowContext(ctx, `SELECT ENGINE, TABLE_COLLATION FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'im_message'`).Scan(&engine, &coll); err != nil {
		t.Fatal(err)
	}
	if engine != "InnoDB" || !strings.HasPrefix(coll, "utf8mb4") {
		t.Fatalf("engine %s, collation %s", engine, coll)
	}
	rows, err = s.read.QueryContext(ctx, `SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX), MIN(NON_UNIQUE)
		FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'im_message'
		GROUP BY INDEX_NAME ORDER BY INDEX_NAME`)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for rows.Next() {
		var n, cols string
		var nonUnique int
		if err := rows.Scan(&n, &cols, &nonUnique); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, fmt.Sprintf("%s(%s)%d", n, cols, nonUnique))
	}
	rows.Close()
	if w := "im_message_target(conv_id,target_msg_id)1 PRIMARY(msg_id)0 uk_conv_seq(conv_id,seq)0 uk_from_client(from_uid,client_msg_id)0"; strings.Join(keys, " ") != w {
		t.Fatalf("keys %v, want %s", keys, w)
	}
}

// Conversation ids and client keys compare byte for byte: 'a', 'A' and
// 'a ' are three conversations (utf8mb4's default collations would make
// them one and break uk_conv_seq).
func TestKeysAreBinary(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	var bs []persist.ConvBatch
	for i, c := range []string{"a", "A", "a ", "é", "e"} {
		m := msg(c, 1, uint64(10+i), "k")
		m.FromUID = uint64(1 + i)
		bs = append(bs, persist.ConvBatch{ConvID: c, Messages: []sequencer.Message{m}})
	}
	if err := s.Commit(ctx, bs); err != nil {
		t.Fatalf("commit: %v", err)
	}
	for _, c := range []string{"a", "A", "a ", "é", "e"} {
		ms, err := s.ReadRange(ctx, c, 0, 10)
		if err != nil || len(ms) != 1 || ms[0].ConvID != c {
			t.Fatalf("conversation %q: %v %v", c, ms, err)
		}
	}
	if _, err := s.FindByClientKey(ctx, sequencer.ClientKey{FromUID: 1, ClientMsgID: "K"}); !errors.Is(err, sequencer.ErrNotFound) {
		t.Fatalf("client key lookup is case-insensitive: %v", err)
	}
}

// A commit larger than half of max_allowed_packet goes in several round
// trips and still lands whole.
func TestLargeCommitSplits(t *testing.T) {
	s, _ := newStore(t)
	s.maxPacket = 1 << 20 // as if the server allowed 1 MiB packets
	ctx := context.Background()
	var bs []persist.ConvBatch
	body := make([]byte, 60_000)
	for i := range body {
		body[i] = byte(i)
	}
	for c := 0; c < 30; c++ {
		conv := fmt.Sprint("g:big:", c)
		m := msg(conv, 1, uint64(100+c), fmt.Sprint("big", c))
		m.Body = body
		bs = append(bs, persist.ConvBatch{ConvID: conv, Messages: []sequencer.Message{m}})
	}
	if n := len(s.writeTrips(planCommit(bs))); n < 2 {
		t.Fatalf("%d round trips, want several", n)
	}
	if n := len(s.writeTrips(planCommit(bs[:1]))); n != 1 {
		t.Fatalf("a commit that fits in a packet takes %d round trips, want 1", n)
	}
	if err := s.Commit(ctx, bs); err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMessage(ctx, 129)
	if err != nil || len(m.Body) != len(body) || m.Body[59_999] != body[59_999] {
		t.Fatalf("big message: %v", err)
	}
}

// A database migrated by an older version (migrations 0001-0002, before
// read positions) upgrades to the current schema, keeping its rows.
func TestMigrateFromOlderSchema(t *testing.T) {
	url := newDatabaseURL(t)
	ctx := context.Background()
	old := openStore(t, url, Options{})
	if err := old.MigrateTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if v, _ := old.SchemaVersion(ctx); v != 2 {
		t.Fatalf("old schema version %d", v)
	}
	// A row as that version wrote it (the seed's columns only).
	if _, err := old.read.ExecContext(ctx, `INSERT INTO im_message (msg_id, conv_id, seq, from_uid, msg_type, body, client_msg_id, server_at)
		VALUES (1, 'g:old', 1, 1, 1, 'o1', 'o1', UTC_TIMESTAMP(3))`); err != nil {
		t.Fatal(err)
	}
	if _, err := old.read.ExecContext(ctx, `INSERT INTO conv_head (conv_id, head) VALUES ('g:old', 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := old.MarkRead(ctx, "g:old", 7, 1); err == nil {
		t.Fatal("read positions work before their migration")
	}
	s := openStore(t, url, Options{})
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil { // idempotent
		t.Fatal(err)
	}
	ms, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := s.SchemaVersion(ctx); v != ms[len(ms)-1].Version {
		t.Fatalf("schema version %d, want %d", v, ms[len(ms)-1].Version)
	}
	if h, _ := s.LoadHead(ctx, "g:old"); h != 1 {
		t.Fatalf("head %d after upgrade", h)
	}
	if m, err := s.GetMessage(ctx, 1); err != nil || m.Kind != sequencer.KindMessage || m.Recalled || m.EditCount != 0 || !m.EditedAt.IsZero() {
		t.Fatalf("an old row after the upgrade: %+v %v", m, err)
	}
	if st, err := s.MarkRead(ctx, "g:old", 7, 1); err != nil || st.ReadSeq != 1 {
		t.Fatalf("mark read after upgrade: %+v %v", st, err)
	}
}

// The body column is the smallest BLOB type that holds --max-body.
func TestBodyColumnSizedToMaxBody(t *testing.T) {
	for _, c := range []struct {
		max  int
		want string
	}{{1000, "blob"}, {65535, "blob"}, {65536, "mediumblob"}, {32 << 20, "longblob"}} {
		url := newDatabaseURL(t)
		s := openStore(t, url, Options{MaxBody: c.max})
		if err := s.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		var ty string
		if err := s.read.QueryRow(`SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
			AND TABLE_NAME = 'im_message' AND COLUMN_NAME = 'body'`).Scan(&ty); err != nil {
			t.Fatal(err)
		}
		if ty != c.want {
			t.Fatalf("max body %d: %s, want %s", c.max, ty, c.want)
		}
		if c.want == "blob" {
			// A later run with a larger --max-body is refused at start.
			big := openStore(t, url, Options{MaxBody: 65536})
			if err := big.Migrate(context.Background()); err == nil || !strings.Contains(err.Error(), "MEDIUMBLOB") {
				t.Fatalf("max body 65536 on a BLOB column: %v", err)
			}
		}
	}
}

// Read positions: up only, clamped to the head, in order, retention keeps
// them.
func TestReadPositions(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	const conv = "g:rp"
	var ms []sequencer.Message
	for i := uint64(1); i <= 5; i++ {
		ms = append(ms, msg(conv, i, i, fmt.Sprint("r", i)))
	}
	if err := s.Commit(ctx, []persist.ConvBatch{{ConvID: conv, Messages: ms}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ seq, want uint64 }{{3, 3}, {2, 3}, {9, 5}, {4, 5}} {
		st, err := s.MarkRead(ctx, conv, 42, c.seq)
		if err != nil || st.ReadSeq != c.want || st.Head != 5 {
			t.Fatalf("mark %d: %+v %v, want read %d head 5", c.seq, st, err, c.want)
		}
	}
	if st, err := s.MarkRead(ctx, "g:none", 42, 3); err != nil || st.ReadSeq != 0 || st.Head != 0 {
		t.Fatalf("mark on an empty conversation: %+v %v", st, err)
	}
	if err := s.Trim(ctx, conv, 5); err != nil {
		t.Fatal(err)
	}
	got, err := s.ReadStates(ctx, 42, []string{"g:none", conv, "g:unknown", conv})
	if err != nil {
		t.Fatal(err)
	}
	want := []persist.ReadState{{ConvID: "g:none"}, {ConvID: conv, ReadSeq: 5, Head: 5}, {ConvID: "g:unknown"}, {ConvID: conv, ReadSeq: 5, Head: 5}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("read states %+v, want %+v", got, want)
		}
	}
	// Concurrent marks end at the highest.
	var wg sync.WaitGroup
	for i := uint64(1); i <= 5; i++ {
		wg.Add(1)
		go func(seq uint64) {
			defer wg.Done()
			if _, err := s.MarkRead(ctx, conv, 43, seq); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	if got, _ := s.ReadStates(ctx, 43, []string{conv}); got[0].ReadSeq != 5 {
		t.Fatalf("concurrent marks: %+v", got)
	}
}

// Migration 0008 re-keys read_position by (conv_id, uid) with no other
// index (the own-send rule's every commit writes one B-tree, not three);
// positions written before it read the same after it.
func TestReadPositionRekeyed(t *testing.T) {
	url := newDatabaseURL(t)
	ctx := context.Background()
	old := openStore(t, url, Options{})
	if err := old.MigrateTo(ctx, 7); err != nil {
		t.Fatal(err)
	}
	const conv = "g:rk"
	var ms []sequencer.Message
	for i := uint64(1); i <= 6; i++ {
		ms = append(ms, msg(conv, i, i, fmt.Sprint("k", i)))
	}
	if err := old.Commit(ctx, []persist.ConvBatch{{ConvID: conv, Messages: ms}}); err != nil {
		t.Fatal(err)
	}
	for uid := uint64(1); uid <= 6; uid++ {
		if _, err := old.MarkRead(ctx, conv, uid*10, uid); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := old.MarkRead(ctx, "g:other", 10, 1); err != nil { // no head: position 0
		t.Fatal(err)
	}
	bounds := []uint64{1, 3, 6}
	before, err := old.ReadCounts(ctx, conv, bounds)
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t, url, Options{})
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX)
		FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'read_position' GROUP BY INDEX_NAME`)
	if err != nil {
		t.Fatal(err)
	}
	var idx []string
	for rows.Next() {
		var name, cols string
		if err := rows.Scan(&name, &cols); err != nil {
			t.Fatal(err)
		}
		idx = append(idx, name+"("+cols+")")
	}
	rows.Close()
	if len(idx) != 1 || idx[0] != "PRIMARY(conv_id,uid)" {
		t.Fatalf("read_position's indexes %v, want PRIMARY(conv_id,uid) alone", idx)
	}
	after, err := s.ReadCounts(ctx, conv, bounds)
	if err != nil || fmt.Sprint(after) != fmt.Sprint(before) || fmt.Sprint(after) != "[2 3 1]" {
		t.Fatalf("read counts %v %v, before the migration %v, want [2 3 1] (per bucket)", after, err, before)
	}
	page, more, err := s.ReadPositionsPage(ctx, conv, 20, 2)
	if err != nil || !more || len(page) != 2 || page[0] != (persist.ReadPosition{UID: 30, ReadSeq: 3}) || page[1] != (persist.ReadPosition{UID: 40, ReadSeq: 4}) {
		t.Fatalf("page after uid 20: %+v more=%v %v", page, more, err)
	}
	if st, err := s.MarkRead(ctx, conv, 10, 5); err != nil || st.ReadSeq != 5 {
		t.Fatalf("mark after the migration: %+v %v", st, err)
	}
}

// A commit of several round trips (rows beyond half of max_allowed_packet)
// whose process stalls between them (a frozen node) holds the head and
// lease rows only until the server's wait_timeout (Options.IdleTimeout)
// closes its session: then the rows are free for the new owner, and the
// stalled commit, when it goes on, learns nothing was written (after
// Settle, the rows say so).
func TestStalledCommitReleasesLocks(t *testing.T) {
	url := newDatabaseURL(t)
	s := openStore(t, url, Options{IdleTimeout: time.Second})
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const conv = "g:stall"
	if err := s.Commit(ctx, []persist.ConvBatch{{ConvID: conv, Messages: []sequencer.Message{msg(conv, 1, 1, "s1")}}}); err != nil {
		t.Fatal(err)
	}
	resume := make(chan struct{})
	stalled := make(chan struct{})
	s.beforeLast = func(uint64) { close(stalled); <-resume }
	// A body larger than the packet allows in one round trip with the
	// checks: the checks (and the head moved) go first, the row and COMMIT
	// after the stall.
	s.maxPacket = 8 << 10
	big := msg(conv, 2, 2, "s2")
	big.Body = make([]byte, 6<<10)
	stalledBatch := []persist.ConvBatch{{ConvID: conv, PrevHead: 1, Messages: []sequencer.Message{big}}}
	if n := len(s.writeTrips(planCommit(stalledBatch))); n != 2 {
		t.Fatalf("%d round trips, want 2", n)
	}
	done := make(chan error, 1)
	go func() {
		done <- s.Commit(ctx, stalledBatch)
	}()
	<-stalled
	// Another writer (the new owner) gets the head row once the server
	// closed the stalled session.
	other := openStore(t, url, Options{})
	if err := other.Commit(ctx, []persist.ConvBatch{{ConvID: conv, PrevHead: 1, Messages: []sequencer.Message{msg(conv, 2, 3, "s3")}}}); err != nil {
		t.Fatalf("new owner's commit: %v", err)
	}
	close(resume)
	err := <-done
	if persist.OutcomeOf(err) == persist.Landed {
		t.Fatal("the stalled commit reported success")
	}
	if err := s.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetMessage(ctx, 2); !errors.Is(err, sequencer.ErrNotFound) {
		t.Fatalf("the stalled commit's row: %v", err)
	}
	if h, _ := s.LoadHead(ctx, conv); h != 2 {
		t.Fatalf("head %d, want 2 (the new owner's)", h)
	}
	t.Logf("stalled commit: %v", err)
}

// A failed head check stops the commit through strict mode (a NULL head is
// refused). The store forces strict mode on its sessions, so a server or
// URL whose sql_mode is lax (NULL stored as 0 with a warning) still refuses
// the commit and keeps every head.
func TestHeadCheckHoldsWithLaxSQLMode(t *testing.T) {
	url := newDatabaseURL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	s := openStore(t, url+sep+"sql_mode=%27%27", Options{})
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var mode string
	if err := s.commits.QueryRowContext(ctx, "SELECT @@SESSION.sql_mode").Scan(&mode); err != nil || !strings.Contains(mode, "STRICT_ALL_TABLES") {
		t.Fatalf("commit session sql_mode %q (%v), want strict", mode, err)
	}
	a, b := "g:lax:a", "g:lax:b"
	if err := s.Commit(ctx, []persist.ConvBatch{
		{ConvID: a, Messages: []sequencer.Message{msg(a, 1, 1, "a1")}},
		{ConvID: b, Messages: []sequencer.Message{msg(b, 1, 2, "b1"), msg(b, 2, 3, "b2")}}}); err != nil {
		t.Fatal(err)
	}
	// b's PrevHead is wrong (3, stored 2: its row 4 would leave a gap), a's
	// is right.
	err := s.Commit(ctx, []persist.ConvBatch{
		{ConvID: a, PrevHead: 1, Messages: []sequencer.Message{msg(a, 2, 4, "a2")}},
		{ConvID: b, PrevHead: 3, Messages: []sequencer.Message{msg(b, 4, 5, "b4")}}})
	var hm *persist.HeadMismatchError
	if !errors.As(err, &hm) || len(hm.ConvIDs) != 1 || hm.ConvIDs[0] != b {
		t.Fatalf("commit over a wrong head: %v, want HeadMismatchError naming %s", err, b)
	}
	for conv, want := range map[string]uint64{a: 1, b: 2} {
		if h, err := s.LoadHead(ctx, conv); err != nil || h != want {
			t.Fatalf("head of %s = %d (%v), want %d", conv, h, err, want)
		}
	}
}

// The store's ping answers while every read connection is taken
// (storetest.PingWithReadsHeld).
func TestPingWithEveryReadConnectionTaken(t *testing.T) {
	url := mysqltest.NewDatabase(t)
	s := openStore(t, url, Options{MaxConns: 1})
	storetest.PingWithReadsHeld(t, s, s.read)
}
