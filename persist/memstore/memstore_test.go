package memstore_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/membership/membershiptest"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
	"github.com/sequencer-im/sequencer/persist/storetest"
)

var _ storetest.Hooks = (*memstore.Store)(nil)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) persist.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func one(conv string, id uint64, body []byte) persist.ConvBatch {
	return persist.ConvBatch{ConvID: conv, Messages: []sequencer.Message{
		{MsgID: id, ConvID: conv, Seq: 1, FromUID: 1, MsgType: 1, Body: body, ClientMsgID: conv}}}
}

// What the suite cannot see through the interface: rows are the store's own
// (a caller that reuses its buffers changes nothing stored), a value the
// schema cannot hold is refused, and nothing is done after ctx ended or
// after Close.
func TestStoreOwnsItsRows(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	body := []byte("hello")
	if err := s.Commit(ctx, []persist.ConvBatch{one("c", 1, body)}); err != nil {
		t.Fatal(err)
	}
	copy(body, "XXXXX")
	got, err := s.GetMessage(ctx, 1)
	if err != nil || string(got.Body) != "hello" {
		t.Fatalf("GetMessage = %q, %v after the caller reused its buffer", got.Body, err)
	}
	copy(got.Body, "YYYYY")
	if again, _ := s.GetMessage(ctx, 1); string(again.Body) != "hello" {
		t.Fatalf("a reader's change reached the store: %q", again.Body)
	}

	long := strings.Repeat("é", 65) // 65 characters
	if err := s.Commit(ctx, []persist.ConvBatch{one(long, 2, nil)}); !errors.Is(err, persist.ErrRejected) || persist.OutcomeOf(err) != persist.NotLanded {
		t.Fatalf("a 65-character conv_id: %v, want ErrRejected", err)
	}

	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Commit(done, []persist.ConvBatch{one("d", 3, nil)}); !errors.Is(err, sequencer.ErrStoreUnavailable) || persist.OutcomeOf(err) != persist.NotLanded {
		t.Fatalf("commit with an ended ctx: %v", err)
	}
	if h, _ := s.LoadHead(ctx, "d"); h != 0 {
		t.Fatalf("commit with an ended ctx moved the head to %d", h)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("Ping after Close: %v", err)
	}
	if _, err := s.LoadHead(ctx, "c"); !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("LoadHead after Close: %v", err)
	}
}

// PutWorkerLeaseForTest takes an id over behind its holder's back; Worker
// shows what a holder recorded.
func TestWorkerLeaseHooks(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	s := memstore.New()
	l, err := s.AcquireWorker(ctx, "a", now, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if l, err = s.RenewWorker(ctx, l, 4242, now, time.Minute); err != nil {
		t.Fatal(err)
	}
	if w := s.Worker(l.WorkerID); w.Holder != "a" || w.LastMs != 4242 || !w.Expires.Equal(now.Add(time.Minute)) || w.Token != l.Token {
		t.Fatalf("Worker(%d) = %+v after renew %+v", l.WorkerID, w, l)
	}
	thief := s.PutWorkerLeaseForTest(persist.WorkerLease{WorkerID: l.WorkerID, Holder: "thief", Expires: now.Add(time.Hour), LastMs: 4242})
	if thief.Token == l.Token {
		t.Fatal("a takeover kept the token")
	}
	if _, err := s.RenewWorker(ctx, l, 5000, now, time.Minute); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("renew after a takeover: %v", err)
	}
	// A free row left with a high LastMs is taken last.
	s.PutWorkerLeaseForTest(persist.WorkerLease{WorkerID: 0, Holder: "previous", LastMs: 99})
	for i := 0; i < 1023; i++ { // ids 1..1023
		if got, err := s.AcquireWorker(ctx, "b", now, time.Minute); err != nil || got.WorkerID == 0 {
			t.Fatalf("acquire %d: %+v, %v", i, got, err)
		}
	}
	last, err := s.AcquireWorker(ctx, "b", now, time.Minute)
	if err != nil || last.WorkerID != 0 || last.LastMs != 99 {
		t.Fatalf("last free id: %+v, %v; want id 0 with LastMs 99", last, err)
	}
}

// The server binary never links the in-memory store: no --store value can
// reach it.
func TestServerDoesNotLinkIt(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = "/usr/local/go/bin/go"
	}
	const self = "github.com/sequencer-im/sequencer/persist/memstore"
	deps := func(pkg string) []string {
		t.Helper()
		out, err := exec.Command(gobin, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		return strings.Fields(string(out))
	}
	server := deps("github.com/sequencer-im/sequencer/cmd/sequencer")
	if len(server) < 10 {
		t.Fatalf("go list -deps ./cmd/sequencer listed %d packages", len(server))
	}
	for _, d := range server {
		if d == self || d == "github.com/sequencer-im/sequencer/persist/faulty" {
			t.Errorf("the server links %s", d)
		}
	}
	// The check itself sees the package where it is linked.
	found := false
	for _, d := range deps("github.com/sequencer-im/sequencer/persist/faulty") {
		found = found || d == self
	}
	if !found {
		t.Fatal("go list -deps ./persist/faulty does not show memstore")
	}
}

// The store is also the cluster's membership table: the ONE membership
// conformance suite runs on it.
func TestMembershipConformance(t *testing.T) {
	membershiptest.Run(t, func(t *testing.T, clk *clock.Fake) membership.Store {
		return memstore.NewWithClock(clk).Membership()
	})
}

// A lease taken through the membership table fences commits: its owner
// commits at its epoch; once the owner's member row expired and another
// incarnation took the partition (epoch+1), the old fence is refused and
// nothing of it is stored; an unfenced commit is refused while a partition
// is held.
func TestCommitsAreFencedByTheMembershipTable(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC))
	s := memstore.NewWithClock(clk)
	const ttl = time.Second
	join := func(id string) membership.View {
		v, err := s.Join(ctx, membership.Member{NodeID: id, Incarnation: id + "/1", ClusterAddr: id + ":1"}, ttl, false)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := join("a")
	ls, err := s.Acquire(ctx, "a/1", v.Version, []uint32{3})
	if err != nil || len(ls) != 1 {
		t.Fatalf("acquire: %v %v", ls, err)
	}
	fa := persist.Fence{Partition: 3, Owner: "a/1", Epoch: ls[0].Epoch}
	b := one("c1", 1, []byte("x"))
	b.Fence = fa
	if err := s.Commit(ctx, []persist.ConvBatch{b}); err != nil {
		t.Fatalf("owner's commit: %v", err)
	}
	if err := s.Commit(ctx, []persist.ConvBatch{one("c2", 2, nil)}); !errors.Is(err, persist.ErrUnfenced) {
		t.Fatalf("unfenced commit while a partition is held: %v", err)
	}
	clk.Advance(2 * ttl) // a's row expires
	v = join("b")
	ls, err = s.Acquire(ctx, "b/1", v.Version, []uint32{3})
	if err != nil || len(ls) != 1 || ls[0].Epoch != fa.Epoch+1 {
		t.Fatalf("takeover: %v %v", ls, err)
	}
	stale := one("c1", 3, []byte("y"))
	stale.PrevHead, stale.Messages[0].Seq, stale.Fence = 1, 2, fa
	var sf *persist.StaleFenceError
	if err := s.Commit(ctx, []persist.ConvBatch{stale}); !errors.As(err, &sf) || len(sf.Fences) != 1 || sf.Fences[0] != fa {
		t.Fatalf("stale owner's commit: %v", err)
	}
	if h, _ := s.LoadHead(ctx, "c1"); h != 1 {
		t.Fatalf("head %d after the stale commit, want 1", h)
	}
}
