package actor

import (
	"context"
	"errors"
	"fmt"
	"github.com/sequencer-im/sequencer/internal/testwait"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// counterIDs issues 1, 2, 3, ... (idgen.Generator in production).
type counterIDs struct{ n atomic.Uint64 }

func (c *counterIDs) NextID() (uint64, error) { return c.n.Add(1), nil }

// gateStore blocks every Commit until the gate opens.
type gateStore struct {
	*memstore.Store
	gate    chan struct{}
	waiting atomic.Int64
}

func newGateStore() *gateStore { return &gateStore{Store: memstore.New(), gate: make(chan struct{})} }

func (s *gateStore) Commit(ctx context.Context, bs []persist.ConvBatch) error {
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	select {
	case <-s.gate:
	case <-ctx.Done():
		return fmt.Errorf("gate: %w: %w", sequencer.ErrUnknownOutcome, ctx.Err())
	}
	return s.Store.Commit(ctx, bs)
}

func req(conv, key string) sequencer.SendRequest {
	return sequencer.SendRequest{ConvID: conv, FromUID: 1, ClientMsgID: key, MsgType: 1, Body: []byte(key)}
}

func newNode(t *testing.T, cfg Config) *Conversations {
	t.Helper()
	if cfg.IDs == nil {
		cfg.IDs = &counterIDs{}
	}
	n, err := NewConversations(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})
	return n
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, 10*time.Second, time.Millisecond, what, cond)
}

// sendAsync starts a Send and returns where its answer will arrive.
type answer struct {
	res sequencer.SendResult
	err error
}

func sendAsync(n *Conversations, ctx context.Context, r sequencer.SendRequest) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		res, err := n.Send(ctx, r)
		ch <- answer{res, err}
	}()
	return ch
}

func TestSendAssignsContiguousSeqs(t *testing.T) {
	st := memstore.New()
	n := newNode(t, Config{Store: st})
	ctx := context.Background()
	for i := 1; i <= 5; i++ {
		res, err := n.Send(ctx, req("g:1", fmt.Sprint("k", i)))
		if err != nil || res.Seq != uint64(i) || res.Duplicate {
			t.Fatalf("send %d: %+v %v", i, res, err)
		}
	}
	res, err := n.Send(ctx, req("g:1", "k3"))
	if err != nil || res.Seq != 3 || !res.Duplicate {
		t.Fatalf("resend: %+v %v", res, err)
	}
	if _, err := n.Send(ctx, req("g:2", "k3")); sequencer.ErrorCode(err) != sequencer.CodeAlreadyExists {
		t.Fatalf("same key in another conversation: %v", err)
	}
}

// An idle conversation passivates; the next send spawns it anew, reloads
// the head from the store and continues at head+1.
func TestPassivationKeepsSeqsContiguous(t *testing.T) {
	st := memstore.New()
	m := metrics.New()
	n := newNode(t, Config{Store: st, Metrics: m, PassivateAfter: 5 * time.Millisecond})
	ctx := context.Background()
	for round := range 3 {
		for i := range 3 {
			res, err := n.Send(ctx, req("g:p", fmt.Sprint(round, "-", i)))
			if err != nil || res.Seq != uint64(round*3+i+1) {
				t.Fatalf("round %d send %d: %+v %v", round, i, res, err)
			}
		}
		waitFor(t, "passivation", func() bool { return n.LiveConversations() == 0 })
	}
	// A resend of a key committed before passivation is still a duplicate
	// (through the store, the memo is gone).
	res, err := n.Send(ctx, req("g:p", "0-1"))
	if err != nil || !res.Duplicate || res.Seq != 2 {
		t.Fatalf("resend after passivation: %+v %v", res, err)
	}
	if got := counterValue(t, m.Passivations); got < 3 {
		t.Fatalf("passivations metric %v, want >= 3", got)
	}
	waitFor(t, "passivation", func() bool { return n.LiveConversations() == 0 })
	if got := gaugeValue(t, m.LiveConvs); got != 0 {
		t.Fatalf("live conversations metric %v", got)
	}
}

// A conversation does not passivate while a batch is in flight.
func TestNoPassivationWhileBusy(t *testing.T) {
	st := newGateStore()
	n := newNode(t, Config{Store: st, PassivateAfter: time.Millisecond})
	ch := sendAsync(n, context.Background(), req("g:b", "k1"))
	waitFor(t, "commit in flight", func() bool { return st.waiting.Load() == 1 })
	// Many passivation timeouts pass while the commit is blocked.
	deadline := time.Now().Add(30 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n.LiveConversations() != 1 {
			t.Fatal("conversation passivated with a batch in flight")
		}
		time.Sleep(time.Millisecond)
	}
	close(st.gate)
	if a := <-ch; a.err != nil || a.res.Seq != 1 {
		t.Fatalf("%+v", a)
	}
	waitFor(t, "passivation", func() bool { return n.LiveConversations() == 0 })
}

// The per-conversation bound and the node-wide bound answer
// resource_exhausted at once.
func TestOverload(t *testing.T) {
	st := newGateStore()
	n := newNode(t, Config{Store: st, MaxQueuePerConv: 2, MaxPending: 5})
	ctx := context.Background()
	a1 := sendAsync(n, ctx, req("g:o", "k1"))
	waitFor(t, "commit in flight", func() bool { return st.waiting.Load() == 1 })
	// The conversation holds 2: k1 in flight and the first of k2 and k3 to
	// reach its actor; the other is refused at once. Which one is up to
	// their goroutines (the node counts a send before its actor gets it:
	// waiting for that count did not order them, and k3 once got in first).
	a2, a3 := sendAsync(n, ctx, req("g:o", "k2")), sendAsync(n, ctx, req("g:o", "k3"))
	var held <-chan answer
	select {
	case a := <-a2:
		if sequencer.ErrorCode(a.err) != sequencer.CodeResourceExhausted {
			t.Fatalf("per-conversation bound: k2 answered first with %+v, want resource_exhausted", a)
		}
		held = a3
	case a := <-a3:
		if sequencer.ErrorCode(a.err) != sequencer.CodeResourceExhausted {
			t.Fatalf("per-conversation bound: k3 answered first with %+v, want resource_exhausted", a)
		}
		held = a2
	case <-time.After(10 * time.Second):
		t.Fatal("per-conversation bound: neither of two sends beyond it was refused")
	}
	waitFor(t, "two pending", func() bool { return n.pending.Load() == 2 })
	// Fill the node: 2 + 3 more in other conversations.
	var others []<-chan answer
	for i := range 3 {
		others = append(others, sendAsync(n, ctx, req(fmt.Sprint("g:x", i), fmt.Sprint("x", i))))
	}
	waitFor(t, "node full", func() bool { return n.pending.Load() == 5 })
	if _, err := n.Send(ctx, req("g:y", "k")); sequencer.ErrorCode(err) != sequencer.CodeResourceExhausted {
		t.Fatalf("node-wide bound: %v", err)
	}
	close(st.gate)
	for i, ch := range append([]<-chan answer{a1, held}, others...) {
		if a := <-ch; a.err != nil {
			t.Fatalf("send %d: %v", i, a.err)
		}
	}
	head, _ := st.LoadHead(ctx, "g:o")
	if head != 2 {
		t.Fatalf("head %d: refused sends consumed seqs", head)
	}
	if n.pending.Load() != 0 {
		t.Fatalf("pending %d after all answered", n.pending.Load())
	}
}

// Close lets queued and in-flight batches commit, refuses new sends, and
// stops every actor.
func TestCloseDrains(t *testing.T) {
	st := newGateStore()
	n := newNode(t, Config{Store: st})
	ctx := context.Background()
	var chans []<-chan answer
	chans = append(chans, sendAsync(n, ctx, req("g:c", "k0")))
	waitFor(t, "commit in flight", func() bool { return st.waiting.Load() == 1 })
	for i := 1; i <= 4; i++ {
		chans = append(chans, sendAsync(n, ctx, req("g:c", fmt.Sprint("k", i))))
	}
	waitFor(t, "queued", func() bool { return n.pending.Load() == 5 })
	closed := make(chan error, 1)
	go func() { closed <- n.Close(ctx) }()
	waitFor(t, "closing", func() bool { return n.closed.Load() })
	if _, err := n.Send(ctx, req("g:c", "late")); !errors.Is(err, sequencer.ErrShuttingDown) {
		t.Fatalf("send after close: %v", err)
	}
	close(st.gate)
	seqs := map[uint64]bool{}
	for i, ch := range chans {
		a := <-ch
		if a.err != nil || seqs[a.res.Seq] || a.res.Seq < 1 || a.res.Seq > 5 {
			t.Fatalf("send %d: %+v", i, a)
		}
		seqs[a.res.Seq] = true
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if n.LiveConversations() != 0 {
		t.Fatalf("%d actors after close", n.LiveConversations())
	}
}

// fakeOwnership refuses the conversations in moving and records the
// fences the store refused.
type fakeOwnership struct {
	mu      sync.Mutex
	moving  map[string]bool
	epoch   uint64
	refused []persist.Fence
}

func (o *fakeOwnership) Refused(fences []persist.Fence) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refused = append(o.refused, fences...)
}

func (o *fakeOwnership) Fence(conv string) (persist.Fence, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.moving[conv] {
		return persist.Fence{}, fmt.Errorf("conversation %s: %w", conv, sequencer.ErrOwnershipMoving)
	}
	return persist.Fence{Partition: 1, Owner: "n1", Epoch: o.epoch}, nil
}

func (o *fakeOwnership) move(conv string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.moving[conv] = true
}

// StopConversations waits for the in-flight batch of a moving conversation,
// fails what was queued behind it (its fence is refused), and stops its
// actor; other conversations are untouched.
func TestStopConversationsForHandoff(t *testing.T) {
	st := newGateStore()
	own := &fakeOwnership{moving: map[string]bool{}, epoch: 3}
	n := newNode(t, Config{Store: st, Ownership: own})
	ctx := context.Background()
	// The store holds the lease the fence names: its commits land.
	if err := st.PutPartitionLeaseForTest(ctx, persist.Fence{Partition: 1, Owner: "n1", Epoch: 3}); err != nil {
		t.Fatal(err)
	}
	inflight := sendAsync(n, ctx, req("g:move", "k1"))
	waitFor(t, "commit in flight", func() bool { return st.waiting.Load() == 1 })
	queued := sendAsync(n, ctx, req("g:move", "k2"))
	waitFor(t, "queued", func() bool { return n.pending.Load() == 2 })
	own.move("g:move")
	// Admitted (the cluster routed it here), then refused when its batch
	// asks for the fence.
	late := sendAsync(n, ctx, req("g:move", "k3"))
	stopped := make(chan error, 1)
	go func() {
		stopped <- n.StopConversations(ctx, func(c string) bool { return c == "g:move" })
	}()
	select {
	case err := <-stopped:
		t.Fatalf("StopConversations returned with a batch in flight: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(st.gate)
	if a := <-inflight; a.err != nil || a.res.Seq != 1 {
		t.Fatalf("in-flight send: %+v", a)
	}
	if a := <-queued; !errors.Is(a.err, sequencer.ErrOwnershipMoving) {
		t.Fatalf("queued send: %+v", a)
	}
	if a := <-late; !errors.Is(a.err, sequencer.ErrOwnershipMoving) || sequencer.ErrorCode(a.err) != sequencer.CodeUnavailable {
		t.Fatalf("send to a moving conversation: %+v", a)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if n.LiveConversations() != 0 {
		t.Fatalf("%d actors left", n.LiveConversations())
	}
	// The stored row carries the fence's epoch path: nothing else written.
	if head, _ := st.LoadHead(ctx, "g:move"); head != 1 {
		t.Fatalf("head %d", head)
	}
}

// A commit refused for a stale fence fails its send as retryable (nothing
// was written) and is reported to Ownership.Refused, which is how the
// cluster learns it was taken over.
func TestStaleFenceReportedToOwnership(t *testing.T) {
	own := &fakeOwnership{moving: map[string]bool{}, epoch: 7}
	st := memstore.New()
	ctx := context.Background()
	// Another incarnation took partition 1 over (epoch 8).
	if err := st.PutPartitionLeaseForTest(ctx, persist.Fence{Partition: 1, Owner: "n2", Epoch: 8}); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, Config{Store: st, Ownership: own})
	_, err := n.Send(ctx, req("g:fenced", "k1"))
	if !errors.Is(err, sequencer.ErrStaleEpoch) || sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
		t.Fatalf("send: %v (code %v)", err, sequencer.ErrorCode(err))
	}
	if head, _ := st.LoadHead(ctx, "g:fenced"); head != 0 {
		t.Fatalf("a commit under a stale fence moved the head to %d", head)
	}
	own.mu.Lock()
	defer own.mu.Unlock()
	if want := (persist.Fence{Partition: 1, Owner: "n1", Epoch: 7}); len(own.refused) == 0 || own.refused[0] != want {
		t.Fatalf("refused fences reported: %v, want %v", own.refused, want)
	}
}

// A caller that gives up gets deadline_exceeded; the node stays consistent.
func TestCallerDeadline(t *testing.T) {
	st := newGateStore()
	n := newNode(t, Config{Store: st})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := n.Send(ctx, req("g:d", "k1"))
	if sequencer.ErrorCode(err) != sequencer.CodeDeadlineExceeded {
		t.Fatalf("got %v", err)
	}
	close(st.gate)
	// The resend learns the outcome: the row was in flight and landed.
	res, err := n.Send(context.Background(), req("g:d", "k1"))
	if err != nil || res.Seq != 1 {
		t.Fatalf("resend: %+v %v", res, err)
	}
	waitFor(t, "pending drained", func() bool { return n.pending.Load() == 0 })
}

// A caller that gives up while its send is queued behind a commit: the
// shell tells the core (its context's end is an input, not something the
// core asks), so the send is dropped without a seq and never stored.
func TestGivenUpSendsConsumeNoSeq(t *testing.T) {
	st := newGateStore()
	n := newNode(t, Config{Store: st})
	first := sendAsync(n, context.Background(), req("g:q", "k1"))
	waitFor(t, "commit in flight", func() bool { return st.waiting.Load() == 1 })
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := n.Send(canceled, req("g:q", "k2")); sequencer.ErrorCode(err) != sequencer.CodeCanceled {
		t.Fatalf("send with a canceled context: %v", err)
	}
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	out := make([]sequencer.SendOutcome, 2)
	n.SendBatch(past, []sequencer.SendRequest{req("g:q", "k3"), req("g:q", "k4")}, out)
	for i, o := range out {
		if sequencer.ErrorCode(o.Err) != sequencer.CodeDeadlineExceeded {
			t.Fatalf("batch item %d with a past deadline: %v", i, o.Err)
		}
	}
	close(st.gate)
	if a := <-first; a.err != nil || a.res.Seq != 1 {
		t.Fatalf("first send: %+v", a)
	}
	res, err := n.Send(context.Background(), req("g:q", "k5"))
	if err != nil || res.Seq != 2 {
		t.Fatalf("send after the given-up ones: %+v %v (want seq 2: they consumed none)", res, err)
	}
	for _, k := range []string{"k2", "k3", "k4"} {
		if _, err := st.FindByClientKey(context.Background(), sequencer.ClientKey{FromUID: 1, ClientMsgID: k}); !errors.Is(err, sequencer.ErrNotFound) {
			t.Fatalf("given-up send %s: lookup %v, want not found", k, err)
		}
	}
	waitFor(t, "pending drained", func() bool { return n.pending.Load() == 0 })
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// Sends racing with passivation are never lost: an actor leaves the router
// only while no send is on its way to it.
func TestSendRacingPassivation(t *testing.T) {
	st := memstore.New()
	n := newNode(t, Config{Store: st, PassivateAfter: time.Millisecond})
	var wg sync.WaitGroup
	for s := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := n.Send(ctx, sequencer.SendRequest{ConvID: fmt.Sprint("g:", i%3), FromUID: uint64(s + 1),
					ClientMsgID: fmt.Sprint(i), MsgType: 1})
				cancel()
				if err != nil {
					t.Errorf("sender %d send %d: %v", s, i, err)
					return
				}
				// Let the actors reach their passivation timeout now and then.
				if i%10 == 0 {
					time.Sleep(2 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	if n.pending.Load() != 0 {
		t.Fatalf("%d sends unanswered", n.pending.Load())
	}
	for c := range 3 {
		head, _ := st.LoadHead(context.Background(), fmt.Sprint("g:", c))
		if head != 8*20 {
			t.Fatalf("g:%d head %d, want %d", c, head, 8*20)
		}
	}
}

// The byte bound and the live-conversation bound answer resource_exhausted
// at once, consume nothing, and are given back when sends are answered.
func TestOverloadBytesAndConversations(t *testing.T) {
	st := newGateStore()
	big := req("g:b", "b1")
	big.Body = make([]byte, 1000)
	per := pendingSize(&big)
	n := newNode(t, Config{Store: st, MaxPendingBytes: 2*per + 200, MaxConversations: 2})
	ctx := context.Background()
	a1 := sendAsync(n, ctx, big)
	waitFor(t, "commit in flight", func() bool { return st.waiting.Load() == 1 })
	big2 := big
	big2.ClientMsgID = "b2"
	a2 := sendAsync(n, ctx, big2)
	waitFor(t, "two pending", func() bool { return n.pending.Load() == 2 })
	big3 := big
	big3.ClientMsgID = "b3"
	if _, err := n.Send(ctx, big3); sequencer.ErrorCode(err) != sequencer.CodeResourceExhausted {
		t.Fatalf("byte bound: %v", err)
	}
	// A second conversation is still allowed (small), a third is not.
	a3 := sendAsync(n, ctx, req("g:c2", "s1"))
	waitFor(t, "second conversation live", func() bool { return n.LiveConversations() == 2 })
	if _, err := n.Send(ctx, req("g:c3", "s2")); sequencer.ErrorCode(err) != sequencer.CodeResourceExhausted {
		t.Fatalf("conversation bound: %v", err)
	}
	close(st.gate)
	for i, ch := range []<-chan answer{a1, a2, a3} {
		if a := <-ch; a.err != nil {
			t.Fatalf("send %d: %v", i, a.err)
		}
	}
	if n.pending.Load() != 0 || n.pendingBytes.Load() != 0 {
		t.Fatalf("pending %d / %d bytes after all answered", n.pending.Load(), n.pendingBytes.Load())
	}
	if head, _ := st.LoadHead(ctx, "g:b"); head != 2 {
		t.Fatalf("head %d: the refused send consumed a seq", head)
	}
}
