package postgres

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// holdAll acquires every connection of pool (as a burst of slow reads
// would hold them) until the test ends, and checks the pool has none left.
func holdAll(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Each held connection is busy on the server too.
		if _, err := c.Exec(ctx, "SELECT pg_sleep(0.05)"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Release)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if c, err := pool.Acquire(short); err == nil {
		c.Release()
		t.Fatal("the pool still had a free connection: the test proves nothing")
	}
}

// TestReadsCannotStarveCommitsOrHeartbeats: with every read connection
// taken, reads wait, but the store's ping (readiness), commits, membership
// heartbeats, partition leases and the worker-id lease go through on their
// own pools.
func TestReadsCannotStarveCommitsOrHeartbeats(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	s, err := Open(ctx, dsn, Options{MaxConns: 2, CommitConns: 1, ControlConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // after the held connections are released (cleanups run last first)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	lease, err := s.AcquireWorker(ctx, "node-a", time.Now(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cs := s.Cluster()
	m := membership.Member{NodeID: "a", Incarnation: "a/1", ClusterAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2", Partitions: 4, Protocol: 1}
	view, err := cs.Join(ctx, m, 10*time.Second, false)
	if err != nil {
		t.Fatal(err)
	}

	holdAll(t, s.pool)
	// A read now waits for a connection: it fails at its deadline.
	rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = s.LoadHead(rctx, "c")
	rcancel()
	if !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("read with every read connection taken: %v, want it to wait and fail unavailable", err)
	}

	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The ping behind /readyz and the node's store watch: the database
	// answers, so the store is reachable (it queued behind the reads and
	// failed at its deadline before).
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err = s.Ping(pctx)
	pcancel()
	if err != nil {
		t.Fatalf("ping with every read connection taken: %v", err)
	}
	if _, err := cs.Heartbeat(octx, m.NodeID, m.Incarnation, 10*time.Second); err != nil {
		t.Fatalf("heartbeat with every read connection taken: %v", err)
	}
	leases, err := cs.Acquire(octx, m.Incarnation, view.Version, []uint32{0, 1})
	if err != nil || len(leases) != 2 {
		t.Fatalf("partition leases with every read connection taken: %v, %v", leases, err)
	}
	if _, err := s.RenewWorker(octx, lease, time.Now().UnixMilli()+5000, time.Now(), 10*time.Second); err != nil {
		t.Fatalf("worker-id lease renewal with every read connection taken: %v", err)
	}
	b := msgs("c", 0, 2, 1)
	b.Fence = persist.Fence{Partition: leases[0].Partition, Owner: leases[0].Owner, Epoch: leases[0].Epoch}
	if err := s.Commit(octx, []persist.ConvBatch{b}); err != nil {
		t.Fatalf("commit with every read connection taken: %v", err)
	}
	if err := s.Settle(octx); err != nil {
		t.Fatalf("settle with every read connection taken: %v", err)
	}
}

// TestReadsCannotStarveCommitsAndCommitsNotHeartbeats: commits that hold
// every commit connection do not starve the heartbeat either.
func TestCommitsCannotStarveHeartbeats(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	s, err := Open(ctx, dsn, Options{MaxConns: 1, CommitConns: 1, ControlConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // after the held connections are released (cleanups run last first)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	cs := s.Cluster()
	m := membership.Member{NodeID: "a", Incarnation: "a/1", ClusterAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2", Partitions: 4, Protocol: 1}
	if _, err := cs.Join(ctx, m, 10*time.Second, false); err != nil {
		t.Fatal(err)
	}
	holdAll(t, s.commits)
	holdAll(t, s.pool)
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cs.Heartbeat(octx, m.NodeID, m.Incarnation, 10*time.Second); err != nil {
		t.Fatalf("heartbeat with every read and commit connection taken: %v", err)
	}
}

// replicaDSN starts a primary with a synchronous standby and returns both
// and the multi-host DSN (target_session_attrs=read-write) of database
// "postgres".
func replicaDSN(t *testing.T) (primary, standby *pgtest.Node, dsn string) {
	t.Helper()
	primary = pgtest.StartPrimary(t, "synchronous_standby_names=*", "synchronous_commit=on")
	standby = primary.StartStandby(t, "synchronous_standby_names=")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := primary.WaitStreaming(ctx, 1); err != nil {
		t.Fatalf("standby does not stream: %v\n%s", err, standby.Log())
	}
	for {
		var st string
		if err := primary.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication", &st); err == nil && st == "sync" {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the standby never became synchronous")
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
	u, err := url.Parse(primary.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = primary.Host() + "," + standby.Host()
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	return primary, standby, u.String()
}

// TestReadsFollowTheNewPrimary reproduces the "acked, then read stale"
// failure of a primary switch: the old primary's postmaster stops answering
// (new connections hang) but its established sessions keep running, as
// PostgreSQL backends run in sessions of their own. The store's idle read
// connections are on those sessions. The standby is promoted, a commit
// reaches it through a new connection and is acknowledged; a read after
// that ack must see it, from the new primary, not the old data of a pooled
// session on the old one. And once the new primary was seen, the old one
// (an older timeline) is never used again, even when it is the only server
// answering.
func TestReadsFollowTheNewPrimary(t *testing.T) {
	primary, standby, dsn := replicaDSN(t)
	ctx := context.Background()
	st, err := Open(ctx, dsn, Options{MaxConns: 3, CommitConns: 1, ControlConns: 1, ConnectTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(ctx, []persist.ConvBatch{msgs("c", 0, 1, 1)}); err != nil {
		t.Fatal(err)
	}
	// Every read connection is open, on the old primary.
	var held []*pgxpool.Conn
	for range 3 {
		c, err := st.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	old := st.primary.Current()

	primary.Freeze()
	if err := standby.Promote(); err != nil {
		t.Fatalf("promote: %v\n%s", err, standby.Log())
	}
	// The commit connection is on the old primary: there the commit waits
	// for the (gone) synchronous standby and times out. Retry, as the
	// writer does, until a new connection reaches the new primary.
	deadline := time.Now().Add(30 * time.Second)
	var errs []error
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := st.Commit(cctx, []persist.ConvBatch{msgs("c", 1, 1, 2)})
		cancel()
		if err == nil {
			break
		}
		if !errors.Is(err, sequencer.ErrUnknownOutcome) && !errors.Is(err, sequencer.ErrStoreUnavailable) {
			t.Fatalf("commit during the switch: %v", err)
		}
		errs = append(errs, err)
		if time.Now().After(deadline) {
			t.Fatalf("no commit on the new primary within 30s: %v", errs)
		}
	}
	if cur := st.primary.Current(); cur == old || cur.timeline <= old.timeline {
		t.Fatalf("current server %v after the switch, was %v: want the promoted standby (a newer timeline)", cur, old)
	}
	// Acked on the new primary: every read from now on sees it.
	for i := range 5 {
		h, err := st.LoadHead(ctx, "c")
		if err != nil {
			t.Fatalf("read %d after the ack: %v", i, err)
		}
		if h != 2 {
			t.Fatalf("read %d after the ack: head %d, want 2 (read from the old primary's session)", i, h)
		}
		got, err := st.ReadRange(ctx, "c", 0, 10)
		if err != nil || len(got) != 2 {
			t.Fatalf("read %d after the ack: %d messages (%v), want 2", i, len(got), err)
		}
	}
	// The membership and the worker-id lease run on the new primary too.
	if _, err := st.AcquireWorker(ctx, "node-a", time.Now(), 10*time.Second); err != nil {
		t.Fatalf("worker-id lease after the switch: %v", err)
	}

	// The old primary answers again, and the new one goes away: the store
	// must refuse the old one (its data lacks acked commits) rather than
	// read from it.
	primary.Thaw()
	standby.Stop()
	for _, p := range []*pgxpool.Pool{st.pool, st.commits, st.control} {
		p.Reset()
	}
	for i := range 3 {
		h, err := st.LoadHead(ctx, "c")
		if err == nil {
			t.Fatalf("read %d with only the demoted primary up: head %d, want an error", i, h)
		}
		if !errors.Is(err, sequencer.ErrStoreUnavailable) {
			t.Fatalf("read %d with only the demoted primary up: %v, want unavailable", i, err)
		}
	}
	if err := st.Commit(ctx, []persist.ConvBatch{msgs("c", 1, 1, 3)}); !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("commit with only the demoted primary up: %v, want unavailable", err)
	}
}

// The tracker's rules on their own: the newest connection's server is
// current, connections to others are not handed out, an older timeline of
// the same system is refused, another system starts afresh.
func TestPrimaryTrackerRules(t *testing.T) {
	p := newPrimaryTracker()
	a := serverID{system: "1", timeline: 1, started: "100"}
	b := serverID{system: "1", timeline: 2, started: "200"}
	a2 := serverID{system: "1", timeline: 1, started: "300"} // the old primary restarted
	other := serverID{system: "9", timeline: 1, started: "400"}
	for _, step := range []struct {
		connect serverID
		refused bool
		current serverID
	}{
		{a, false, a},
		{b, false, b},
		{a2, true, b},
		{a, true, b},
		{other, false, other},
		{b, false, b},
	} {
		err := p.admit(step.connect)
		if (err != nil) != step.refused || (err != nil && !errors.Is(err, errOlderTimeline)) {
			t.Fatalf("connect to %v: %v, want refused %v", step.connect, err, step.refused)
		}
		if err == nil {
			p.connect(step.connect)
		}
		if got := p.Current(); got != step.current {
			t.Fatalf("after connecting to %v: current %v, want %v", step.connect, got, step.current)
		}
		for _, id := range []serverID{a, b, a2, other} {
			if p.isCurrent(id) != (id == step.current) {
				t.Fatalf("after connecting to %v: connection to %v usable %v", step.connect, id, p.isCurrent(id))
			}
		}
	}
}

// On a server that refuses the control and WAL functions to the store's
// role (some managed services), the store still works: its servers are
// then known by their start time alone.
func TestServerIdentityWithoutControlFunctions(t *testing.T) {
	srv := pgtest.StartServer(t) // private: its privileges change
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, q := range []string{
		"REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC",
		"CREATE ROLE app LOGIN",
		"GRANT CREATE ON SCHEMA public TO app",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	u, err := url.Parse(srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("app")
	st, err := Open(ctx, u.String(), Options{})
	if err != nil {
		t.Fatalf("open as a role without pg_control_system: %v", err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(ctx, []persist.ConvBatch{msgs("c", 0, 1, 1)}); err != nil {
		t.Fatal(err)
	}
	if h, err := st.LoadHead(ctx, "c"); err != nil || h != 1 {
		t.Fatalf("head %d, %v; want 1", h, err)
	}
	if cur := st.primary.Current(); cur.system != "" || cur.timeline != 0 || cur.started == "" {
		t.Fatalf("server identity %v, want the start time alone", cur)
	}
}
