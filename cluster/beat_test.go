package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/internal/testwait"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/ring"
)

// nopLocal is a local writer that is never asked to write.
type nopLocal struct{}

func (nopLocal) Send(context.Context, sequencer.SendRequest) (sequencer.SendResult, error) {
	return sequencer.SendResult{}, sequencer.ErrNotOwner
}
func (nopLocal) SendBatch(_ context.Context, _ []sequencer.SendRequest, out []sequencer.SendOutcome) {
	for i := range out {
		out[i].Err = sequencer.ErrNotOwner
	}
}
func (nopLocal) StopConversations(context.Context, func(string) bool) error { return nil }

// TestRenewalWithANewViewReconcilesAtOnce: a renewal that brings a new
// membership view (a member joined, left or expired), or leases that changed
// hands (a peer released a partition), wakes the partition reconciliation
// at once, so what moved is taken or handed off without waiting for the
// next reconcile tick; a renewal with the same view and leases does not.
func TestRenewalWithANewViewReconcilesAtOnce(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Now())
	mem := membership.NewMem(clk)
	net := NewMemNetwork()
	net.IgnoreWakes = true
	n, err := New(Config{NodeID: "a", Store: mem, Transport: net.Transport("mem://a"), Clock: clk, Logger: simLogger(),
		Ring: ring.Config{Partitions: 7}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.start(ctx, nopLocal{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.wakeRecon: // whatever start left
	default:
	}
	n.beat(ctx)
	if len(n.wakeRecon) != 0 {
		t.Fatal("a renewal with the same view woke the reconciliation")
	}
	if _, err := mem.Join(ctx, membership.Member{NodeID: "b", Incarnation: "b/1", ClusterAddr: "mem://b", Partitions: 7, Protocol: ProtocolVersion},
		n.cfg.MemberTTL, false); err != nil {
		t.Fatal(err)
	}
	n.beat(ctx)
	if len(n.wakeRecon) != 1 {
		t.Fatal("a renewal that brought a new member did not wake the reconciliation")
	}
	// b takes a partition, then releases it (a handback: its wake makes a
	// beat read the released lease, which a must take now, not a tick
	// later). Same member set, so the same view version throughout.
	<-n.wakeRecon
	v, err := mem.View(ctx)
	if err != nil {
		t.Fatal(err)
	}
	taken, err := mem.Acquire(ctx, "b/1", v.Version, []uint32{6})
	if err != nil || len(taken) != 1 {
		t.Fatalf("b acquires partition 6: %v, %v", taken, err)
	}
	n.beat(ctx)
	if len(n.wakeRecon) != 1 {
		t.Fatal("a renewal whose leases changed hands did not wake the reconciliation")
	}
	<-n.wakeRecon
	n.beat(ctx)
	if len(n.wakeRecon) != 0 {
		t.Fatal("a renewal with the same view and leases woke the reconciliation")
	}
	if err := mem.Release(ctx, taken); err != nil {
		t.Fatal(err)
	}
	n.beat(ctx)
	if len(n.wakeRecon) != 1 {
		t.Fatal("a renewal that saw a lease released did not wake the reconciliation")
	}
}

// TestLoopsRunOnTheClock: the heartbeat and the reconciliation loop wait on
// the node's clock, not on real time: on a fake clock that stands still
// neither runs again, and moving it by one heartbeat runs both (a renewal,
// and another try of the acquisition the store refused).
func TestLoopsRunOnTheClock(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Now())
	mem := membership.NewMem(clk)
	var beats, acquires atomic.Int64
	mem.Fail = func(op string) error {
		switch op {
		case "Heartbeat":
			beats.Add(1)
		case "Acquire":
			acquires.Add(1)
			return errors.New("test: acquire refused")
		}
		return nil
	}
	const hb = 20 * time.Millisecond // real-time timers would fire many times below
	n, err := New(Config{NodeID: "a", Store: mem, Transport: NewMemNetwork().Transport("mem://a"), Clock: clk, Logger: simLogger(),
		Ring: ring.Config{Partitions: 7}, Heartbeat: hb, MemberTTL: 10 * hb})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx, nopLocal{}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n.Leave(context.Background()) }()
	testwait.For(t, 5*time.Second, time.Millisecond, "the first reconciliation", func() bool { return acquires.Load() > 0 })
	time.Sleep(10 * hb) // let the start's own wakes run out
	b0, a0 := beats.Load(), acquires.Load()
	time.Sleep(10 * hb)
	if b, a := beats.Load(), acquires.Load(); b != b0 || a != a0 {
		t.Fatalf("with the clock standing still: %d heartbeats and %d acquisitions in %v of real time (want 0 and 0)", b-b0, a-a0, 10*hb)
	}
	clk.Advance(hb)
	testwait.For(t, 5*time.Second, time.Millisecond, "a heartbeat after the clock moved one heartbeat", func() bool { return beats.Load() > b0 })
	testwait.For(t, 5*time.Second, time.Millisecond, "a reconciliation after the clock moved one heartbeat", func() bool { return acquires.Load() > a0 })
}

// TestDeparturesNamedInTheLog: a member gone from the next view is named
// in the survivors' log, as left (it was leaving) or presumed dead (its
// lease ran out, with how long it was silent: its last renewal was at
// LeaseUntil - MemberTTL), with the partitions it held.
func TestDeparturesNamedInTheLog(t *testing.T) {
	var buf bytes.Buffer
	n, err := New(Config{NodeID: "a", Store: membership.NewMem(clock.NewFake(time.Now())), Transport: NewMemNetwork().Transport("mem://a"),
		Logger: slog.New(slog.NewTextHandler(&buf, nil)), MemberTTL: 1500 * time.Millisecond, Heartbeat: 250 * time.Millisecond,
		Ring: ring.Config{Partitions: 7}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)
	members := []membership.Member{{NodeID: "a", Incarnation: "a/1"}, {NodeID: "b", Incarnation: "b/1", LeaseUntil: now.Add(time.Second)},
		{NodeID: "c", Incarnation: "c/1", Leaving: true}}
	leases := []membership.PartitionLease{{Partition: 0, Owner: "b/1", Epoch: 1}, {Partition: 1, Owner: "b/1", Epoch: 1},
		{Partition: 2, Owner: "c/1", Epoch: 1}}
	n.viewed(membership.View{Version: 3, Members: members, Leases: leases, Now: now})
	n.viewed(membership.View{Version: 4, Members: members[:1], Now: now.Add(2 * time.Second)})
	out := buf.String()
	for _, want := range []string{`msg="member presumed dead" node=a member=b incarnation=b/1 silent_for=2.5s partitions_held=2`,
		`msg="member left" node=a member=c incarnation=c/1 partitions_held=1`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "level=WARN") {
		t.Errorf("a departure logged as a warning:\n%s", out)
	}
}

// TestStartRetriesAJoinTheStoreDidNotAnswer: a start whose join the store
// answers unavailable (a store under load, a link just back) tries again
// until the start's context ends, instead of failing the start; another
// error (here: a refusal) still fails it at once.
func TestStartRetriesAJoinTheStoreDidNotAnswer(t *testing.T) {
	mem := membership.NewMem(clock.Real{})
	var joins atomic.Int64
	mem.Fail = func(op string) error {
		if op == "Join" && joins.Add(1) <= 2 {
			return fmt.Errorf("test: %w (timeout)", sequencer.ErrStoreUnavailable)
		}
		return nil
	}
	cfg := Config{NodeID: "a", Store: mem, Transport: NewMemNetwork().Transport("mem://a"), Logger: simLogger(),
		Ring: ring.Config{Partitions: 7}, Heartbeat: 20 * time.Millisecond, MemberTTL: 200 * time.Millisecond}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Start(ctx, nopLocal{}); err != nil {
		t.Fatalf("start after two unanswered joins: %v", err)
	}
	defer func() { _ = n.Leave(context.Background()) }()
	if j := joins.Load(); j != 3 {
		t.Fatalf("%d joins, want 3", j)
	}

	refused := membership.NewMem(clock.Real{})
	refused.Fail = func(op string) error {
		if op == "Join" {
			return errors.New("test: join refused")
		}
		return nil
	}
	cfg.Store, cfg.NodeID, cfg.Transport = refused, "b", NewMemNetwork().Transport("mem://b")
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, nopLocal{}); err == nil || !strings.Contains(err.Error(), "join refused") {
		t.Fatalf("start with the join refused: %v, want that error", err)
	}
}

// TestPartitionsHeldGaugeDropsWithTheLease: sequencer_cluster_partitions_held
// shows the partitions the node holds while it may write them, and 0 once
// its heartbeats fail past MemberTTL (a node cut from the store), where it
// showed its last count before.
func TestPartitionsHeldGaugeDropsWithTheLease(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Now())
	mem := membership.NewMem(clk)
	var down atomic.Bool
	mem.Fail = func(op string) error {
		if down.Load() {
			return errors.New("test: store unreachable")
		}
		return nil
	}
	set := metrics.New()
	n, err := New(Config{NodeID: "a", Store: mem, Transport: NewMemNetwork().Transport("mem://a"), Clock: clk, Logger: simLogger(),
		Ring: ring.Config{Partitions: 7}, Metrics: set})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.start(ctx, nopLocal{}); err != nil {
		t.Fatal(err)
	}
	n.reconcile(ctx)
	gauge := func() float64 {
		t.Helper()
		mfs, err := set.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "sequencer_cluster_partitions_held" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no sequencer_cluster_partitions_held")
		return 0
	}
	if g := gauge(); g != 7 {
		t.Fatalf("partitions_held %v after acquiring 7, want 7", g)
	}
	down.Store(true)
	n.beat(ctx)
	if g := gauge(); g != 7 {
		t.Fatalf("partitions_held %v after one failed heartbeat within the TTL, want 7", g)
	}
	clk.Advance(n.cfg.MemberTTL + time.Millisecond)
	n.beat(ctx)
	if g := gauge(); g != 0 {
		t.Fatalf("partitions_held %v with the membership lease not renewed for more than MemberTTL, want 0", g)
	}
}
