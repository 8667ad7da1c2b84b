// Package membershiptest is the conformance suite of membership.Store: the
// same rules are checked against every implementation: the in-memory ones
// (membership.Mem, persist/memstore) and the shared stores' (persist/postgres
// ClusterStore, on PostgreSQL and on Citus, and persist/mysql's). Time is a clock.Fake
// the store under test must read as its clock, so lease expiry is tested
// without sleeping.
package membershiptest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
)

// TTL is the member lease the suite uses.
const TTL = 5 * time.Second

// Open returns an empty store whose clock is clk.
type Open func(t *testing.T, clk *clock.Fake) membership.Store

// Run runs every case of the suite.
func Run(t *testing.T, open Open) {
	cases := []struct {
		name string
		f    func(t *testing.T, s membership.Store, clk *clock.Fake)
	}{
		{"JoinAndView", testJoinAndView},
		{"HeartbeatRenews", testHeartbeatRenews},
		{"ExpiryRemovesAndBumpsVersion", testExpiry},
		{"SameNodeIDIncarnations", testSameNodeID},
		{"LeaveAndRemove", testLeaveAndRemove},
		{"AcquireRules", testAcquireRules},
		{"AcquireNeedsCurrentVersionAndLiveSelf", testAcquireGuards},
		{"ReleaseExactLeaseOnly", testRelease},
		{"ConcurrentAcquireOneWinner", testConcurrentAcquire},
		{"RequestDrain", testRequestDrain},
		{"RowsShowExpiredUntilRemoved", testRows},
		{"IncompatibleMemberRefused", testIncompatible},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC))
			s := open(t, clk)
			c.f(t, s, clk)
		})
	}
}

var ctx = context.Background()

func member(id string) membership.Member {
	return membership.Member{NodeID: id, Incarnation: id + "/1", ClusterAddr: "127.0.0.1:1" + id, APIAddr: "127.0.0.1:2" + id}
}

func join(t *testing.T, s membership.Store, m membership.Member) membership.View {
	t.Helper()
	v, err := s.Join(ctx, m, TTL, false)
	if err != nil {
		t.Fatalf("join %s: %v", m.Incarnation, err)
	}
	return v
}

func beat(t *testing.T, s membership.Store, m membership.Member) membership.View {
	t.Helper()
	v, err := s.Heartbeat(ctx, m.NodeID, m.Incarnation, TTL)
	if err != nil {
		t.Fatalf("heartbeat %s: %v", m.Incarnation, err)
	}
	return v
}

func ids(v membership.View) []string {
	var out []string
	for _, m := range v.Members {
		out = append(out, m.NodeID)
	}
	return out
}

func acquire(t *testing.T, s membership.Store, inc string, version uint64, ps ...uint32) map[uint32]uint64 {
	t.Helper()
	ls, err := s.Acquire(ctx, inc, version, ps)
	if err != nil {
		t.Fatalf("acquire %v for %s: %v", ps, inc, err)
	}
	out := map[uint32]uint64{}
	for i, l := range ls {
		if l.Owner != inc {
			t.Fatalf("acquire returned lease %+v for %s", l, inc)
		}
		if i > 0 && ls[i-1].Partition >= l.Partition {
			t.Fatalf("acquire result not sorted: %+v", ls)
		}
		out[l.Partition] = l.Epoch
	}
	return out
}

func view(t *testing.T, s membership.Store) membership.View {
	t.Helper()
	v, err := s.View(ctx)
	if err != nil {
		t.Fatalf("view: %v", err)
	}
	return v
}

func testJoinAndView(t *testing.T, s membership.Store, clk *clock.Fake) {
	v0 := view(t, s)
	if len(v0.Members) != 0 || len(v0.Leases) != 0 {
		t.Fatalf("empty store view: %+v", v0)
	}
	b, a := member("b"), member("a")
	v1 := join(t, s, b)
	if v1.Version <= v0.Version {
		t.Fatalf("join did not bump the version: %d -> %d", v0.Version, v1.Version)
	}
	v2 := join(t, s, a)
	if v2.Version <= v1.Version {
		t.Fatalf("second join did not bump the version: %d -> %d", v1.Version, v2.Version)
	}
	if got := ids(v2); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("members %v, want [a b] sorted", got)
	}
	got, ok := v2.Member("a")
	if !ok || got.Incarnation != a.Incarnation || got.ClusterAddr != a.ClusterAddr || got.APIAddr != a.APIAddr || got.Leaving {
		t.Fatalf("member a = %+v", got)
	}
	if want := clk.Now().Add(TTL); !got.LeaseUntil.Equal(want) {
		t.Fatalf("lease until %v, want now+ttl %v", got.LeaseUntil, want)
	}
	if !v2.Live(a.Incarnation) || v2.Live("a/other") || v2.Live("") {
		t.Fatal("Live answers wrong")
	}
	// Joining again as the same incarnation is an idempotent renewal.
	v3 := join(t, s, a)
	if v3.Version != v2.Version {
		t.Fatalf("re-join of the same incarnation bumped the version %d -> %d", v2.Version, v3.Version)
	}
	if vv := view(t, s); vv.Version != v3.Version || !slices.Equal(ids(vv), []string{"a", "b"}) {
		t.Fatalf("View disagrees with the last join: %+v", vv)
	}
}

func testHeartbeatRenews(t *testing.T, s membership.Store, clk *clock.Fake) {
	a, b := member("a"), member("b")
	join(t, s, a)
	v := join(t, s, b)
	for range 5 {
		clk.Advance(TTL - time.Second)
		beat(t, s, b)
		v2 := beat(t, s, a)
		if v2.Version != v.Version {
			t.Fatalf("renewals changed the version %d -> %d", v.Version, v2.Version)
		}
		if len(v2.Members) != 2 {
			t.Fatalf("members %v after renewals", ids(v2))
		}
	}
	// Exactly at lease_until the member is still live.
	clk.Advance(TTL)
	v3 := beat(t, s, a)
	if len(v3.Members) != 2 {
		t.Fatalf("member expired at exactly lease_until: %v", ids(v3))
	}
}

func testExpiry(t *testing.T, s membership.Store, clk *clock.Fake) {
	a, b := member("a"), member("b")
	join(t, s, a)
	v1 := join(t, s, b)
	clk.Advance(TTL - time.Second)
	beat(t, s, a)
	clk.Advance(2 * time.Second) // b's lease ended 1 s ago
	// Before anyone cleans up, b's row is not live in a read.
	if vv := view(t, s); !slices.Equal(ids(vv), []string{"a"}) {
		t.Fatalf("view shows expired members: %v", ids(vv))
	}
	v2 := beat(t, s, a)
	if !slices.Equal(ids(v2), []string{"a"}) {
		t.Fatalf("after b expired: members %v", ids(v2))
	}
	if v2.Version <= v1.Version {
		t.Fatalf("expiry did not bump the version (%d -> %d)", v1.Version, v2.Version)
	}
	// b's heartbeat does not revive it.
	_, err := s.Heartbeat(ctx, b.NodeID, b.Incarnation, TTL)
	if !errors.Is(err, membership.ErrMemberGone) {
		t.Fatalf("expired member's heartbeat: %v, want ErrMemberGone", err)
	}
	if vv := view(t, s); len(vv.Members) != 1 || vv.Version != v2.Version {
		t.Fatalf("expired member revived or version moved: %+v", vv)
	}
	// An expired row that nobody removed yet is gone for its own heartbeat.
	clk.Advance(TTL + time.Second)
	if _, err := s.Heartbeat(ctx, a.NodeID, a.Incarnation, TTL); !errors.Is(err, membership.ErrMemberGone) {
		t.Fatalf("heartbeat after own expiry: %v, want ErrMemberGone", err)
	}
	// It comes back only as a new incarnation, without takeOver.
	a2 := a
	a2.Incarnation = "a/2"
	v3 := join(t, s, a2)
	if m, _ := v3.Member("a"); m.Incarnation != "a/2" {
		t.Fatalf("rejoin: member a is %+v", m)
	}
	if v3.Version <= v2.Version {
		t.Fatal("rejoin did not bump the version")
	}
}

// testIncompatible: a member with another partition count or protocol
// version than a live member cannot join (its ring would name other
// owners); once the live members are gone, it can (a planned change).
func testIncompatible(t *testing.T, s membership.Store, clk *clock.Fake) {
	a := member("a")
	a.Partitions, a.Protocol, a.Version = 271, 2, "v9.9.9"
	v1 := join(t, s, a)
	if m, _ := v1.Member("a"); m.Partitions != 271 || m.Protocol != 2 || m.Version != "v9.9.9" {
		t.Fatalf("member row %+v: partitions, protocol and version not kept", m)
	}
	for _, bad := range []struct{ parts, proto int }{{31, 2}, {271, 1}} {
		b := member("b")
		b.Partitions, b.Protocol = bad.parts, bad.proto
		if _, err := s.Join(ctx, b, TTL, false); !errors.Is(err, membership.ErrIncompatible) {
			t.Fatalf("join with %d partitions, protocol %d beside a live 271/2: %v, want ErrIncompatible", bad.parts, bad.proto, err)
		}
	}
	if vv := view(t, s); vv.Version != v1.Version || len(vv.Members) != 1 {
		t.Fatalf("a refused join changed the view: %+v", vv)
	}
	ok := member("c")
	ok.Partitions, ok.Protocol = 271, 2
	join(t, s, ok)
	// All of them gone: a cluster may restart with another partition count.
	clk.Advance(TTL + time.Millisecond)
	d := member("d")
	d.Partitions, d.Protocol = 31, 2
	join(t, s, d)
}

func testSameNodeID(t *testing.T, s membership.Store, clk *clock.Fake) {
	a1 := member("a")
	v1 := join(t, s, a1)
	a2 := a1
	a2.Incarnation = "a/2"
	a2.ClusterAddr = "127.0.0.1:9999"
	if _, err := s.Join(ctx, a2, TTL, false); !errors.Is(err, membership.ErrSuperseded) {
		t.Fatalf("join over a live incarnation without takeOver: %v, want ErrSuperseded", err)
	}
	if vv := view(t, s); vv.Version != v1.Version {
		t.Fatal("a refused join changed the version")
	}
	v2, err := s.Join(ctx, a2, TTL, true)
	if err != nil {
		t.Fatalf("join with takeOver: %v", err)
	}
	if m, _ := v2.Member("a"); m.Incarnation != "a/2" || m.ClusterAddr != "127.0.0.1:9999" || v2.Version <= v1.Version {
		t.Fatalf("after takeover: %+v version %d", m, v2.Version)
	}
	if v2.Live(a1.Incarnation) {
		t.Fatal("replaced incarnation still live")
	}
	if _, err := s.Heartbeat(ctx, a1.NodeID, a1.Incarnation, TTL); !errors.Is(err, membership.ErrSuperseded) {
		t.Fatalf("old incarnation's heartbeat: %v, want ErrSuperseded", err)
	}
	if _, err := s.Leave(ctx, a1.NodeID, a1.Incarnation); !errors.Is(err, membership.ErrSuperseded) {
		t.Fatalf("old incarnation's leave: %v, want ErrSuperseded", err)
	}
	// Removing the old incarnation does not remove the new one.
	if err := s.Remove(ctx, a1.NodeID, a1.Incarnation); err != nil {
		t.Fatal(err)
	}
	if vv := view(t, s); !vv.Live("a/2") {
		t.Fatal("remove of the old incarnation removed the new one")
	}
	// Once the live row expired, another incarnation joins without takeOver.
	clk.Advance(TTL + time.Millisecond)
	a3 := a1
	a3.Incarnation = "a/3"
	join(t, s, a3)
}

func testLeaveAndRemove(t *testing.T, s membership.Store, clk *clock.Fake) {
	a, b := member("a"), member("b")
	join(t, s, a)
	v1 := join(t, s, b)
	got := acquire(t, s, b.Incarnation, v1.Version, 1, 2)
	if len(got) != 2 {
		t.Fatalf("b took %v", got)
	}
	v2, err := s.Leave(ctx, b.NodeID, b.Incarnation)
	if err != nil {
		t.Fatal(err)
	}
	if v2.Version <= v1.Version {
		t.Fatal("leave did not bump the version")
	}
	m, ok := v2.Member("b")
	if !ok || !m.Leaving || !v2.Live(b.Incarnation) {
		t.Fatalf("leaving member: %+v ok=%v", m, ok)
	}
	if rm := v2.RingNodes(); len(rm) != 1 || rm[0].NodeID != "a" {
		t.Fatalf("ring members while b leaves: %v", rm)
	}
	// Leaving twice changes nothing.
	if v3, err := s.Leave(ctx, b.NodeID, b.Incarnation); err != nil || v3.Version != v2.Version {
		t.Fatalf("second leave: version %d err %v", v3.Version, err)
	}
	// While b leaves, its leases stay: a cannot take them before b releases.
	if got := acquire(t, s, a.Incarnation, v2.Version, 1, 2); len(got) != 0 {
		t.Fatalf("a took %v from leaving b before release", got)
	}
	// A leaving member takes nothing.
	if got := acquire(t, s, b.Incarnation, v2.Version, 3); len(got) != 0 {
		t.Fatalf("leaving b took %v", got)
	}
	// Heartbeats keep a leaving member live (handoff may take a while).
	clk.Advance(TTL - time.Second)
	beat(t, s, a)
	if vv := beat(t, s, b); !vv.Live(b.Incarnation) {
		t.Fatal("leaving member expired despite heartbeats")
	}
	if err := s.Release(ctx, []membership.PartitionLease{{Partition: 1, Owner: b.Incarnation, Epoch: got1(t, s, 1)}}); err != nil {
		t.Fatal(err)
	}
	if got := acquire(t, s, a.Incarnation, v2.Version, 1, 2); len(got) != 1 || got[1] != 2 {
		t.Fatalf("a after b released 1: took %v, want {1: epoch 2}", got)
	}
	if err := s.Remove(ctx, b.NodeID, b.Incarnation); err != nil {
		t.Fatal(err)
	}
	v4 := view(t, s)
	if v4.Version <= v2.Version || !slices.Equal(ids(v4), []string{"a"}) {
		t.Fatalf("after remove: %v version %d", ids(v4), v4.Version)
	}
	if err := s.Remove(ctx, b.NodeID, b.Incarnation); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if vv := view(t, s); vv.Version != v4.Version {
		t.Fatal("removing a missing row bumped the version")
	}
	// b is gone: its lease on 2 can be taken now.
	if got := acquire(t, s, a.Incarnation, v4.Version, 2); got[2] != 2 {
		t.Fatalf("a took %v after b was removed, want {2: epoch 2}", got)
	}
}

func got1(t *testing.T, s membership.Store, p uint32) uint64 {
	t.Helper()
	v := view(t, s)
	l, ok := v.Lease(p)
	if !ok {
		t.Fatalf("no lease row for partition %d", p)
	}
	return l.Epoch
}

func testAcquireRules(t *testing.T, s membership.Store, clk *clock.Fake) {
	a, b := member("a"), member("b")
	join(t, s, a)
	v := join(t, s, b)
	got := acquire(t, s, a.Incarnation, v.Version, 5, 3, 3, 7)
	if len(got) != 3 || got[3] != 1 || got[5] != 1 || got[7] != 1 {
		t.Fatalf("first acquire: %v, want partitions 3,5,7 at epoch 1", got)
	}
	vv := view(t, s)
	if len(vv.Leases) != 3 || vv.Leases[0].Partition != 3 || vv.Leases[2].Partition != 7 {
		t.Fatalf("view leases %+v", vv.Leases)
	}
	// Taking from a live owner that did not release: nothing.
	if got := acquire(t, s, b.Incarnation, v.Version, 3, 5, 9); len(got) != 1 || got[9] != 1 {
		t.Fatalf("b took %v, want only the free partition 9", got)
	}
	// Re-acquiring one's own lease bumps its epoch (a lost reply is retried).
	if got := acquire(t, s, a.Incarnation, v.Version, 3); got[3] != 2 {
		t.Fatalf("re-acquire of own lease: %v, want epoch 2", got)
	}
	// Released leases are taken with the next epoch.
	if err := s.Release(ctx, []membership.PartitionLease{{Partition: 5, Owner: a.Incarnation, Epoch: 1}}); err != nil {
		t.Fatal(err)
	}
	if l, _ := view(t, s).Lease(5); l.Owner != "" || l.Epoch != 1 {
		t.Fatalf("released lease row %+v, want owner '' epoch kept", l)
	}
	if got := acquire(t, s, b.Incarnation, v.Version, 5); got[5] != 2 {
		t.Fatalf("b after release: %v, want epoch 2", got)
	}
	// An owner whose lease expired (not yet removed by anyone) loses its
	// partitions to a live member.
	clk.Advance(TTL - time.Second)
	beat(t, s, b)
	clk.Advance(2 * time.Second) // a expired 1 s ago; no heartbeat removed it
	vb, err := s.View(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if vb.Version != v.Version {
		// The store may remove expired rows lazily; then acquire on the new version.
		v = vb
	}
	got = acquire(t, s, b.Incarnation, v.Version, 3, 7)
	if got[3] != 3 || got[7] != 2 {
		t.Fatalf("b taking from expired a: %v, want 3 at epoch 3 and 7 at epoch 2", got)
	}
}

func testAcquireGuards(t *testing.T, s membership.Store, clk *clock.Fake) {
	a := member("a")
	v1 := join(t, s, a)
	b := member("b")
	v2 := join(t, s, b)
	if got := acquire(t, s, a.Incarnation, v1.Version, 1); len(got) != 0 {
		t.Fatalf("acquire on a stale version took %v", got)
	}
	if got := acquire(t, s, "c/1", v2.Version, 1); len(got) != 0 {
		t.Fatalf("a non-member took %v", got)
	}
	if got := acquire(t, s, a.Incarnation, v2.Version, 1); len(got) != 1 {
		t.Fatalf("a on the current version took %v", got)
	}
	// An expired member takes nothing even before anyone removed its row.
	clk.Advance(TTL - time.Second)
	beat(t, s, b)
	clk.Advance(2 * time.Second)
	vv := view(t, s)
	if got := acquire(t, s, a.Incarnation, vv.Version, 2); len(got) != 0 {
		t.Fatalf("expired member took %v", got)
	}
	if got := acquire(t, s, a.Incarnation, vv.Version); len(got) != 0 {
		t.Fatalf("empty acquire took %v", got)
	}
}

func testRelease(t *testing.T, s membership.Store, clk *clock.Fake) {
	a, b := member("a"), member("b")
	join(t, s, a)
	v := join(t, s, b)
	acquire(t, s, a.Incarnation, v.Version, 1, 2)
	// Wrong epoch, wrong owner, unknown partition: ignored.
	err := s.Release(ctx, []membership.PartitionLease{
		{Partition: 1, Owner: a.Incarnation, Epoch: 7},
		{Partition: 2, Owner: b.Incarnation, Epoch: 1},
		{Partition: 9, Owner: a.Incarnation, Epoch: 1},
		{Partition: 2, Owner: "", Epoch: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []uint32{1, 2} {
		if l, _ := view(t, s).Lease(p); l.Owner != a.Incarnation || l.Epoch != 1 {
			t.Fatalf("partition %d after bogus releases: %+v", p, l)
		}
	}
	if err := s.Release(ctx, []membership.PartitionLease{{Partition: 2, Owner: a.Incarnation, Epoch: 1}, {Partition: 1, Owner: a.Incarnation, Epoch: 1}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []uint32{1, 2} {
		if l, _ := view(t, s).Lease(p); l.Owner != "" || l.Epoch != 1 {
			t.Fatalf("partition %d after release: %+v", p, l)
		}
	}
	if err := s.Release(ctx, nil); err != nil {
		t.Fatalf("empty release: %v", err)
	}
}

func testConcurrentAcquire(t *testing.T, s membership.Store, clk *clock.Fake) {
	const parts = 40
	ms := []membership.Member{member("a"), member("b"), member("c")}
	var v membership.View
	for _, m := range ms {
		v = join(t, s, m)
	}
	all := make([]uint32, parts)
	for i := range all {
		all[i] = uint32(i)
	}
	// Every member grabs every partition at once (in different orders); each
	// partition ends with exactly one owner at epoch 1.
	var wg sync.WaitGroup
	results := make([]map[uint32]uint64, len(ms))
	errs := make([]error, len(ms))
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ps := slices.Clone(all)
			if i%2 == 1 {
				slices.Reverse(ps)
			}
			ls, err := s.Acquire(ctx, m.Incarnation, v.Version, ps)
			errs[i] = err
			results[i] = map[uint32]uint64{}
			for _, l := range ls {
				results[i][l.Partition] = l.Epoch
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("acquire by %s: %v", ms[i].NodeID, err)
		}
	}
	owners := map[uint32]string{}
	for i, r := range results {
		for p, e := range r {
			if o, dup := owners[p]; dup {
				t.Fatalf("partition %d taken by %s and %s", p, o, ms[i].NodeID)
			}
			if e != 1 {
				t.Fatalf("partition %d epoch %d, want 1", p, e)
			}
			owners[p] = ms[i].NodeID
		}
	}
	vv := view(t, s)
	for p := range uint32(parts) {
		l, ok := vv.Lease(p)
		if !ok || l.Owner == "" || fmt.Sprint(owners[p]) == "" || l.Owner != owners[p]+"/1" {
			t.Fatalf("partition %d: lease %+v, acquire said %q", p, l, owners[p])
		}
	}
}

func testRequestDrain(t *testing.T, s membership.Store, clk *clock.Fake) {
	a, b := member("a"), member("b")
	join(t, s, a)
	v1 := join(t, s, b)
	if got := acquire(t, s, b.Incarnation, v1.Version, 1); len(got) != 1 {
		t.Fatalf("b took %v", got)
	}
	m, err := s.RequestDrain(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if m.Incarnation != b.Incarnation || !m.Leaving {
		t.Fatalf("drained row %+v", m)
	}
	v2 := view(t, s)
	if v2.Version <= v1.Version {
		t.Fatal("a drain request did not bump the version")
	}
	if mb, ok := v2.Member("b"); !ok || !mb.Leaving || !v2.Live(b.Incarnation) {
		t.Fatalf("drained member in the view: %+v ok=%v", mb, ok)
	}
	if rm := v2.RingNodes(); len(rm) != 1 || rm[0].NodeID != "a" {
		t.Fatalf("ring members while b is drained: %v", rm)
	}
	// Its own heartbeat sees the mark and keeps it; its leases stay until it
	// releases them; it takes nothing new.
	if vb := beat(t, s, b); !func() bool { mb, _ := vb.Member("b"); return mb.Leaving }() {
		t.Fatal("heartbeat of a drained member cleared the leaving mark")
	}
	if got := acquire(t, s, a.Incarnation, v2.Version, 1); len(got) != 0 {
		t.Fatalf("a took %v from drained b before it released", got)
	}
	if got := acquire(t, s, b.Incarnation, v2.Version, 2); len(got) != 0 {
		t.Fatalf("drained b took %v", got)
	}
	// Twice: no new version. Its own Leave afterwards: no new version.
	if _, err := s.RequestDrain(ctx, "b"); err != nil || view(t, s).Version != v2.Version {
		t.Fatalf("second drain request: %v, version %d -> %d", err, v2.Version, view(t, s).Version)
	}
	if v3, err := s.Leave(ctx, b.NodeID, b.Incarnation); err != nil || v3.Version != v2.Version {
		t.Fatalf("leave after a drain request: version %d err %v", v3.Version, err)
	}
	if _, err := s.RequestDrain(ctx, "nobody"); !errors.Is(err, membership.ErrNoSuchMember) {
		t.Fatalf("drain of an unknown node: %v, want ErrNoSuchMember", err)
	}
	// A new incarnation of b joins as a normal member again.
	b2 := b
	b2.Incarnation = "b/2"
	if v4, err := s.Join(ctx, b2, TTL, true); err != nil {
		t.Fatal(err)
	} else if mb, _ := v4.Member("b"); mb.Leaving {
		t.Fatal("a new incarnation inherited the drain mark")
	}
	// An expired member cannot be drained.
	clk.Advance(TTL + time.Second)
	if _, err := s.RequestDrain(ctx, "a"); !errors.Is(err, membership.ErrNoSuchMember) {
		t.Fatalf("drain of an expired node: %v, want ErrNoSuchMember", err)
	}
}

func testRows(t *testing.T, s membership.Store, clk *clock.Fake) {
	a, b := member("a"), member("b")
	join(t, s, b)
	join(t, s, a)
	rows, now, err := s.Rows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].NodeID != "a" || rows[1].NodeID != "b" || rows[1].Incarnation != b.Incarnation ||
		rows[1].ClusterAddr != b.ClusterAddr || rows[1].APIAddr != b.APIAddr || !now.Equal(clk.Now()) {
		t.Fatalf("rows %+v at %v", rows, now)
	}
	// Nobody beats: both expire, and stay as rows until removed.
	clk.Advance(TTL + time.Second)
	v1 := view(t, s)
	if len(v1.Members) != 0 {
		t.Fatalf("expired members in the view: %v", ids(v1))
	}
	rows, now, err = s.Rows(ctx)
	if err != nil || len(rows) != 2 || !rows[0].LeaseUntil.Before(now) {
		t.Fatalf("rows after expiry: %+v at %v (%v)", rows, now, err)
	}
	// Forgetting a dead member: Remove by the incarnation its row shows.
	if err := s.Remove(ctx, "b", rows[1].Incarnation); err != nil {
		t.Fatal(err)
	}
	if v2 := view(t, s); v2.Version <= v1.Version {
		t.Fatal("removing an expired row did not bump the version")
	}
	if rows, _, _ := s.Rows(ctx); len(rows) != 1 || rows[0].NodeID != "a" {
		t.Fatalf("rows after removing b: %+v", rows)
	}
}
