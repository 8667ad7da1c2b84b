package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/membership/membershiptest"
	"github.com/sequencer-im/sequencer/persist"
)

func TestClusterConformance(t *testing.T) {
	membershiptest.Run(t, func(t *testing.T, clk *clock.Fake) membership.Store {
		s, _ := newStore(t)
		return s.Cluster().WithClock(clk)
	})
}

// With the database clock: leases are now()+ttl by the server's time.
func TestClusterDatabaseClock(t *testing.T) {
	s, _ := newStore(t)
	cs := s.Cluster()
	ctx := context.Background()
	m := membership.Member{NodeID: "a", Incarnation: "a/1", ClusterAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2"}
	v, err := cs.Join(ctx, m, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := v.Member("a")
	if !ok {
		t.Fatal("member missing")
	}
	if d := got.LeaseUntil.Sub(v.Now); d != time.Hour {
		t.Fatalf("lease until - now = %v, want 1h", d)
	}
	if d := time.Since(v.Now); d < -time.Minute || d > time.Minute {
		t.Fatalf("database now %v is far from local now", v.Now)
	}
	if _, err := cs.Heartbeat(ctx, "a", "a/1", time.Hour); err != nil {
		t.Fatal(err)
	}
	// A 1 ms lease runs out by the database clock; the next heartbeat of
	// someone else removes it.
	b := membership.Member{NodeID: "b", Incarnation: "b/1", ClusterAddr: "x", APIAddr: "y"}
	if _, err := cs.Join(ctx, b, time.Millisecond, false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := cs.Heartbeat(ctx, "a", "a/1", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := v.Member("b"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("1 ms lease never expired")
		}
	}
	if _, err := cs.Heartbeat(ctx, "b", "b/1", time.Hour); !errors.Is(err, membership.ErrMemberGone) {
		t.Fatalf("expired member's heartbeat: %v", err)
	}
}

// waitLockWaiters polls until n backends of this database wait on a lock.
func waitLockWaiters(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends waiting on locks, want %d", waiting, n)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not settling
	}
}

func msg(conv string, seq, id uint64, client string) sequencer.Message {
	return sequencer.Message{MsgID: id, ConvID: conv, Seq: seq, FromUID: 1, MsgType: 1, Body: []byte("x"),
		ClientMsgID: client, ServerAt: time.Now().UTC().Truncate(time.Millisecond)}
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
	// fence check (it holds the lease row FOR SHARE) while it is in flight.
	blocker, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `SELECT head FROM conv_head WHERE conv_id = $1 FOR UPDATE`, conv); err != nil {
		t.Fatal(err)
	}
	commitDone := make(chan error, 1)
	go func() {
		commitDone <- s.Commit(ctx, []persist.ConvBatch{{ConvID: conv, PrevHead: 1, Fence: fenceA, Messages: []sequencer.Message{msg(conv, 2, 102, "c2")}}})
	}()
	waitLockWaiters(t, s, 1)

	// a's lease expires; b takes the partition: it must wait for a's commit.
	clk.Advance(4 * time.Second)
	if _, err := cs.Heartbeat(ctx, b.NodeID, b.Incarnation, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	v, err = cs.Heartbeat(ctx, b.NodeID, b.Incarnation, 5*time.Second)
	if err != nil {
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
		ls, err := cs.WithLockTimeout(20*time.Second).Acquire(ctx, b.Incarnation, v.Version, []uint32{p})
		acqDone <- acq{ls, err}
	}()
	waitLockWaiters(t, s, 2)
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

	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-commitDone; err != nil {
		t.Fatalf("in-flight commit under the old epoch: %v (it held the lease first, so it lands)", err)
	}
	r := <-acqDone
	if r.err != nil || len(r.ls) != 1 || r.ls[0].Epoch != fenceA.Epoch+1 {
		t.Fatalf("b's acquire: %+v, want epoch %d", r, fenceA.Epoch+1)
	}
	fenceB := persist.Fence{Partition: p, Owner: b.Incarnation, Epoch: r.ls[0].Epoch}

	// The stale owner's next commit is refused, and nothing of it is written.
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

// A commit stuck in flight (a frozen node's open transaction) makes an
// acquire fail after the lock timeout, retryably, and never blocks the
// heartbeats of the cluster.
func TestClusterAcquireLockTimeout(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	cs := s.Cluster().WithLockTimeout(300 * time.Millisecond)
	a := membership.Member{NodeID: "a", Incarnation: "a/1", ClusterAddr: "a", APIAddr: "a"}
	v, err := cs.Join(ctx, a, time.Minute, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Acquire(ctx, a.Incarnation, v.Version, []uint32{1}); err != nil {
		t.Fatal(err)
	}
	stuck, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Rollback(ctx)
	if _, err := stuck.Exec(ctx, fenceSQL, []int64{1}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := cs.Acquire(ctx, a.Incarnation, v.Version, []uint32{1})
		done <- err
	}()
	waitLockWaiters(t, s, 1)
	if _, err := cs.Heartbeat(ctx, a.NodeID, a.Incarnation, time.Minute); err != nil {
		t.Fatalf("heartbeat while an acquire waits: %v", err)
	}
	err = <-done
	if !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("acquire behind a stuck commit: %v, want ErrStoreUnavailable (retryable)", err)
	}
	_ = stuck.Rollback(ctx)
	ls, err := cs.Acquire(ctx, a.Incarnation, v.Version, []uint32{1})
	if err != nil || len(ls) != 1 || ls[0].Epoch != 2 {
		t.Fatalf("acquire after the stuck commit ended: %+v %v", ls, err)
	}
}

// Nodes heartbeating, acquiring and releasing the same partitions at once
// never deadlock, and every partition has at most one owner with epochs that
// only grow.
func TestClusterConcurrentChurn(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	cs := s.Cluster()
	const nodes, parts, rounds = 3, 16, 25
	ms := make([]membership.Member, nodes)
	for i := range ms {
		ms[i] = membership.Member{NodeID: fmt.Sprintf("n%d", i), Incarnation: fmt.Sprintf("n%d/1", i), ClusterAddr: "x", APIAddr: "y"}
		if _, err := cs.Join(ctx, ms[i], time.Minute, false); err != nil {
			t.Fatal(err)
		}
	}
	all := make([]uint32, parts)
	for i := range all {
		all[i] = uint32(i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, nodes*rounds*3)
	for i := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				v, err := cs.Heartbeat(ctx, ms[i].NodeID, ms[i].Incarnation, time.Minute)
				if err != nil {
					errs <- err
					return
				}
				ps := all
				if (i+r)%2 == 1 {
					ps = all[parts/2:]
				}
				ls, err := cs.Acquire(ctx, ms[i].Incarnation, v.Version, ps)
				if err != nil {
					errs <- err
					continue
				}
				if err := cs.Release(ctx, ls); err != nil {
					errs <- err
				}
			}
		}()
	}
	// Meanwhile one node joins and leaves repeatedly (version bumps).
	wg.Add(1)
	go func() {
		defer wg.Done()
		for r := range rounds {
			m := membership.Member{NodeID: "churn", Incarnation: fmt.Sprintf("churn/%d", r), ClusterAddr: "x", APIAddr: "y"}
			if _, err := cs.Join(ctx, m, time.Minute, false); err != nil {
				errs <- err
				return
			}
			if err := cs.Remove(ctx, m.NodeID, m.Incarnation); err != nil {
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if strings.Contains(err.Error(), "deadlock") {
			t.Fatalf("deadlock: %v", err)
		}
		t.Errorf("churn: %v", err)
	}
	v, err := cs.View(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range v.Leases {
		if l.Owner != "" {
			t.Errorf("partition %d still held by %s after every node released", l.Partition, l.Owner)
		}
		if l.Epoch == 0 {
			t.Errorf("partition %d at epoch 0", l.Partition)
		}
	}
}

func TestClusterSchema(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	var version int64
	if err := s.pool.QueryRow(ctx, `SELECT version FROM cluster_version`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version != 0 {
		t.Fatalf("initial cluster version %d", version)
	}
	// The version row is single.
	if _, err := s.pool.Exec(ctx, `INSERT INTO cluster_version (id, version) VALUES (false, 1)`); err == nil {
		t.Fatal("a second version row was accepted")
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO cluster_member (node_id, incarnation, cluster_addr, api_addr, lease_until) VALUES ('a', 'x', '', '', now()), ('b', 'x', '', '', now())`)
	if err == nil {
		t.Fatal("two members with one incarnation were accepted")
	}
}

// A commit frozen between its fence check and its COMMIT (its session idle
// in the transaction, holding the lease row FOR SHARE) does not block a
// takeover for long: Acquire terminates the stuck session, whose transaction
// then writes nothing.
func TestClusterAcquireReapsStuckCommit(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC))
	cs := s.Cluster().WithClock(clk).WithLockTimeout(20 * time.Second).WithStuckAfter(200 * time.Millisecond)
	a := membership.Member{NodeID: "a", Incarnation: "a/1", ClusterAddr: "a", APIAddr: "a"}
	b := membership.Member{NodeID: "b", Incarnation: "b/1", ClusterAddr: "b", APIAddr: "b"}
	cs.Join(ctx, a, 5*time.Second, false)
	v, err := cs.Join(ctx, b, 5*time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := cs.Acquire(ctx, a.Incarnation, v.Version, []uint32{3})
	if err != nil || len(ls) != 1 {
		t.Fatalf("%v %v", ls, err)
	}
	// a's commit: fence checked, row inserted, COMMIT never sent (frozen).
	stuck, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Rollback(ctx)
	if _, err := stuck.Exec(ctx, fenceSQL, []int64{3}); err != nil {
		t.Fatal(err)
	}
	if _, err := stuck.Exec(ctx, `INSERT INTO im_message (msg_id, conv_id, seq, from_uid, body, client_msg_id, server_at)
		VALUES (9, 'g:9', 1, 1, 'x', 'stuck', now())`); err != nil {
		t.Fatal(err)
	}
	clk.Advance(4 * time.Second)
	if _, err := cs.Heartbeat(ctx, b.NodeID, b.Incarnation, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second) // a expired
	v, err = cs.Heartbeat(ctx, b.NodeID, b.Incarnation, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ls, err = cs.Acquire(ctx, b.Incarnation, v.Version, []uint32{3})
	if err != nil || len(ls) != 1 || ls[0].Epoch != 2 {
		t.Fatalf("takeover behind a stuck commit: %+v %v", ls, err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("takeover waited %v (the lock timeout), the stuck session was not ended", d)
	}
	if err := stuck.Commit(ctx); err == nil {
		t.Fatal("the stuck transaction committed after its session was terminated")
	}
	if _, err := s.GetMessage(ctx, 9); !errors.Is(err, sequencer.ErrNotFound) {
		t.Fatalf("the stuck commit's row exists: %v", err)
	}
}
