package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/internal/testwait"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// heldCall is one batch the fake transport holds until released.
type heldCall struct {
	items   int
	release chan error // nil: answer every item ok; else the transport error
}

// TestForwarderOnItsOwn drives the forwarder alone, with a fake transport
// that holds each batch and a fake clock: two batches leave at once; past
// them items wait and the batch that returns takes them all; minBatch
// waiting items make another leave; when no batch left for the stall time
// (moved on the fake clock) one more leaves; a transport error is no answer
// for its items and tells the failure detector.
func TestForwarderOnItsOwn(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC))
	calls := make(chan heldCall, 16)
	var suspected atomic.Int32
	f := newForwarder(forwarderDeps{
		clk: clk,
		forward: func(ctx context.Context, addr string, b *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
			if addr != "b:1" || b.FromNode != "a" || b.FromIncarnation != "a/1" || b.MembershipVersion != 4 {
				return nil, fmt.Errorf("batch from %s/%s at view %d to %s", b.FromNode, b.FromIncarnation, b.MembershipVersion, addr)
			}
			c := heldCall{items: len(b.Items), release: make(chan error)}
			calls <- c
			if err := <-c.release; err != nil {
				return nil, err
			}
			out := make([]sequencer.SendOutcome, len(b.Items))
			for i := range out {
				out[i].Result = sequencer.SendResult{MsgID: uint64(100 + i), Seq: uint64(1 + i)}
			}
			return encodeReplies("b", out), nil
		},
		self:    func() (string, string, uint64) { return "a", "a/1", 4 },
		suspect: func() { suspected.Add(1) },
		timeout: time.Minute,
	})
	defer f.close()
	f.mu.Lock()
	f.policy = forwardPolicy{eager: 2, minBatch: 5, stall: 20 * time.Millisecond}
	f.mu.Unlock()

	var items []*fwdItem
	send := func(k int) {
		for range k {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			t.Cleanup(cancel)
			it := newFwdItem(ctx, sequencer.SendRequest{ConvID: "c", FromUID: 1, ClientMsgID: fmt.Sprint(len(items)), MsgType: 1})
			items = append(items, it)
			f.enqueue("b:1", []*fwdItem{it})
		}
	}
	next := func(what string) heldCall {
		t.Helper()
		select {
		case c := <-calls:
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("no batch left: %s", what)
			return heldCall{}
		}
	}
	none := func(what string) {
		t.Helper()
		select {
		case c := <-calls:
			t.Fatalf("a batch of %d left: %s", c.items, what)
		case <-time.After(50 * time.Millisecond):
		}
	}
	waiting := func() (items, workers int) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if pq := f.peers["b:1"]; pq != nil {
			return pq.items, pq.workers
		}
		return 0, 0
	}

	send(1)
	c1 := next("first")
	send(1)
	c2 := next("second: two leave at once")
	if c1.items != 1 || c2.items != 1 {
		t.Fatalf("first batches carry %d and %d items, want 1 and 1", c1.items, c2.items)
	}
	send(3)
	none("3 items behind 2 batches, before the stall time")
	if n, w := waiting(); n != 3 || w != 2 {
		t.Fatalf("%d items wait behind %d batches, want 3 behind 2", n, w)
	}
	close(c1.release)
	if c3 := next("after a return"); c3.items != 3 {
		t.Fatalf("the batch after a return carries %d items, want 3", c3.items)
	} else {
		defer close(c3.release)
	}
	send(5)
	if c4 := next("5 items wait: minBatch"); c4.items != 5 {
		t.Fatalf("the minBatch batch carries %d items, want 5", c4.items)
	} else {
		defer close(c4.release)
	}
	send(1)
	none("one item, batches in flight, clock not moved")
	clk.Advance(20 * time.Millisecond)
	c5 := next("the stall guard on the fake clock")
	if c5.items != 1 {
		t.Fatalf("the stall batch carries %d items, want 1", c5.items)
	}
	c5.release <- errors.New("connection reset")
	o := <-items[len(items)-1].done
	if o.kind != fwdNoAnswer || !errors.Is(o.err, sequencer.ErrUnknownOutcome) {
		t.Fatalf("a transport error gave %+v, want no answer (unknown outcome)", o)
	}
	if suspected.Load() != 1 {
		t.Fatalf("suspect called %d times, want 1", suspected.Load())
	}
	close(c2.release)
	for i, it := range items[:2] {
		if o := <-it.done; o.kind != fwdAnswered || o.err != nil || o.res.MsgID == 0 {
			t.Fatalf("item %d: %+v", i, o)
		}
	}
}

// fwdCall is one batch the scripted transport holds until the test answers
// it (or the batch's context ends).
type fwdCall struct {
	addr   string
	b      *clusterv1.ForwardBatch
	ctx    context.Context
	answer chan fwdAnswer
}

// fwdAnswer answers a held batch: a transport error, or every item stored
// (dup: found stored, a resend).
type fwdAnswer struct {
	err error
	dup bool
}

// fwdBench is a forwarder on its own: a fake clock, a scripted transport
// and probe, and a route the test moves.
type fwdBench struct {
	t      *testing.T
	clk    *clock.Fake
	f      *forwarder
	calls  chan fwdCall
	probes chan fwdCall // a probe: answer with nil or an error; unanswered until its context ends

	mu      sync.Mutex
	dst     fwdRoute
	members map[string]bool
	changed chan struct{}
	suspect atomic.Int32
}

// newFwdBench starts the fake clock at the real time: context deadlines
// (real time) are read against it.
func newFwdBench(t *testing.T, probing bool) *fwdBench {
	b := &fwdBench{t: t, clk: clock.NewFake(time.Now()), calls: make(chan fwdCall, 16), probes: make(chan fwdCall, 16),
		dst: fwdRoute{remote: true, addr: "b:1", owner: "b"}, members: map[string]bool{"a": true, "b": true, "c": true},
		changed: make(chan struct{})}
	d := forwarderDeps{
		clk: b.clk,
		forward: func(ctx context.Context, addr string, fb *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
			c := fwdCall{addr: addr, b: fb, ctx: ctx, answer: make(chan fwdAnswer, 1)}
			b.calls <- c
			select {
			case a := <-c.answer:
				if a.err != nil {
					return nil, a.err
				}
				out := make([]sequencer.SendOutcome, len(fb.Items))
				for i := range out {
					out[i].Result = sequencer.SendResult{MsgID: uint64(100 + i), Seq: uint64(1 + i), Duplicate: a.dup}
				}
				return encodeReplies(addr, out), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
		route: func(string) (fwdRoute, <-chan struct{}) {
			b.mu.Lock()
			defer b.mu.Unlock()
			return b.dst, b.changed
		},
		member: func(id string) (bool, <-chan struct{}) {
			b.mu.Lock()
			defer b.mu.Unlock()
			return b.members[id], b.changed
		},
		self:    func() (string, string, uint64) { return "a", "a/1", 4 },
		suspect: func() { b.suspect.Add(1) },
		timeout: time.Minute,
	}
	if probing {
		d.probe = func(ctx context.Context, addr string) error {
			c := fwdCall{addr: addr, ctx: ctx, answer: make(chan fwdAnswer, 1)}
			b.probes <- c
			select {
			case a := <-c.answer:
				return a.err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	b.f = newForwarder(d)
	t.Cleanup(b.f.close)
	return b
}

// view changes the route and the membership, and wakes the waiters.
func (b *fwdBench) view(dst fwdRoute, gone ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dst = dst
	for _, id := range gone {
		delete(b.members, id)
	}
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *fwdBench) next(ch chan fwdCall, what string) fwdCall {
	b.t.Helper()
	return recv(b.t, ch, what)
}

// recv takes the next value of ch; the test fails when none comes within
// 10 s.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("nothing came: %s", what)
		var zero T
		return zero
	}
}

func (b *fwdBench) none(ch chan fwdCall, what string) {
	b.t.Helper()
	select {
	case c := <-ch:
		b.t.Fatalf("a call to %s came: %s", c.addr, what)
	case <-time.After(50 * time.Millisecond):
	}
}

// send runs forwarder.send in the background.
func (b *fwdBench) send(ctx context.Context, key string) chan fwdOutcome {
	done := make(chan fwdOutcome, 1)
	dst, _ := b.f.route("c")
	go func() {
		done <- b.f.send(ctx, sequencer.SendRequest{ConvID: "c", FromUID: 1, ClientMsgID: key, MsgType: 1}, dst)
	}()
	return done
}

func (b *fwdBench) outcome(done chan fwdOutcome, what string) fwdOutcome {
	b.t.Helper()
	return recv(b.t, done, what)
}

// TestForwarderResendsWithoutAnswer: the forwarder owns the retry of an
// attempt without an answer. A transport error is sent again to the same
// owner after the backoff on the injected clock (not before), and the
// answer found stored by that resend says duplicate: false (the client sent
// it once); a change of the route sends it at once to the new owner; an
// owner that leaves the membership mid-forward is not waited for; a route
// that turns local hands the item back unanswered; the caller's deadline
// ends it without an answer.
func TestForwarderResendsWithoutAnswer(t *testing.T) {
	b := newFwdBench(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	done := b.send(ctx, "k1")
	c := b.next(b.calls, "the first attempt")
	c.answer <- fwdAnswer{err: errors.New("connection reset")}
	b.none(b.calls, "a resend before the backoff passed on the clock")
	b.clk.Advance(fwdBackoffMin)
	c = b.next(b.calls, "the resend after the backoff")
	if c.addr != "b:1" || c.b.Items[0].ClientMsgId != "k1" {
		t.Fatalf("resent to %s with key %s, want b:1 and k1", c.addr, c.b.Items[0].ClientMsgId)
	}
	c.answer <- fwdAnswer{dup: true}
	if o := b.outcome(done, "after the resend"); o.kind != fwdAnswered || o.err != nil || !o.resent || o.res.Duplicate {
		t.Fatalf("resend answered %+v, want answered, resent, not duplicate", o)
	}
	if b.suspect.Load() != 1 {
		t.Fatalf("suspect called %d times, want 1", b.suspect.Load())
	}

	// The route moves while the item waits out its backoff: sent at once.
	done = b.send(ctx, "k2")
	b.next(b.calls, "k2").answer <- fwdAnswer{err: errors.New("connection refused")}
	b.none(b.calls, "k2 resent before the backoff")
	b.view(fwdRoute{remote: true, addr: "c:1", owner: "c"})
	if c := b.next(b.calls, "k2 after the route moved"); c.addr != "c:1" {
		t.Fatalf("k2 resent to %s, want c:1 (the new owner)", c.addr)
	} else {
		c.answer <- fwdAnswer{}
	}
	if o := b.outcome(done, "k2"); o.kind != fwdAnswered || o.err != nil || !o.resent {
		t.Fatalf("k2: %+v", o)
	}

	// The owner leaves the membership while its batch hangs: the item is
	// sent to the route's owner now, without waiting for the hung batch.
	done = b.send(ctx, "k3")
	hung := b.next(b.calls, "k3 to c")
	b.view(fwdRoute{remote: true, addr: "b:1", owner: "b"}, "c")
	if c := b.next(b.calls, "k3 after c left"); c.addr != "b:1" {
		t.Fatalf("k3 resent to %s, want b:1", c.addr)
	} else {
		c.answer <- fwdAnswer{}
	}
	if o := b.outcome(done, "k3"); o.kind != fwdAnswered || o.err != nil || !o.resent {
		t.Fatalf("k3: %+v", o)
	}
	hung.answer <- fwdAnswer{} // answers nobody

	// No answer, and the route turns local (a takeover): handed back.
	done = b.send(ctx, "k4")
	c = b.next(b.calls, "k4")
	b.view(fwdRoute{})
	c.answer <- fwdAnswer{err: errors.New("connection reset")}
	if o := b.outcome(done, "k4"); o.kind != fwdNoAnswer || o.stalled || !o.resent || ctx.Err() != nil {
		t.Fatalf("k4 after the route turned local: %+v, want no answer, handed back", o)
	}
	b.none(b.calls, "k4 sent again after it was handed back")

	// The caller's deadline ends an item waiting out its backoff.
	b.view(fwdRoute{remote: true, addr: "b:1", owner: "b"})
	sctx, scancel := context.WithCancel(ctx)
	done = b.send(sctx, "k5")
	b.next(b.calls, "k5").answer <- fwdAnswer{err: errors.New("connection reset")}
	scancel()
	if o := b.outcome(done, "k5"); o.kind != fwdNoAnswer || !errors.Is(o.err, context.Canceled) {
		t.Fatalf("k5 after its caller left: %+v", o)
	}
}

// TestForwarderStalledLink: a batch without an answer has its link probed
// after probeAfter on the injected clock; a probe that answers (a slow
// owner) lets it wait and probes again later; a probe without an answer
// within probeTimeout ends the batch with no answer, stalled, as a
// deadline_exceeded that wraps context.DeadlineExceeded (never an error
// that says "not stored"), and the caller gets it at once while the route
// still names that owner. The link is then down: sends to that owner are
// answered at once (unreachable, not sent) until a probe answers. When the
// route names another owner, the item is sent there instead.
func TestForwarderStalledLink(t *testing.T) {
	b := newFwdBench(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	done := b.send(ctx, "slow")
	c := b.next(b.calls, "the batch")
	b.none(b.probes, "a probe before probeAfter")
	b.clk.Advance(ForwardProbeAfter)
	b.next(b.probes, "the first probe").answer <- fwdAnswer{} // the owner is slow, the link alive
	b.none(b.probes, "a second probe at once")
	b.clk.Advance(ForwardProbeAfter)
	b.next(b.probes, "the probe after another probeAfter").answer <- fwdAnswer{}
	c.answer <- fwdAnswer{}
	if o := b.outcome(done, "slow"); o.kind != fwdAnswered || o.err != nil || o.resent {
		t.Fatalf("a slow owner's answer: %+v", o)
	}
	// The answered probe's call is gone before the next batch is guarded
	// (a guard that fires while it is still there shares its verdict).
	testwait.For(t, 10*time.Second, time.Millisecond, "the answered probe finished", func() bool {
		b.f.mu.Lock()
		defer b.f.mu.Unlock()
		return len(b.f.probes) == 0
	})

	done = b.send(ctx, "stalled")
	c = b.next(b.calls, "the batch into a dead link")
	b.clk.Advance(ForwardProbeAfter)
	b.next(b.probes, "the probe of the dead link") // never answered
	b.clk.Advance(ForwardProbeTimeout - time.Millisecond)
	select {
	case o := <-done:
		t.Fatalf("a verdict before probeTimeout: %+v", o)
	case <-time.After(50 * time.Millisecond):
	}
	b.clk.Advance(time.Millisecond)
	o := b.outcome(done, "stalled")
	if o.kind != fwdNoAnswer || !o.stalled || sequencer.ErrorCode(o.err) != sequencer.CodeDeadlineExceeded ||
		!errors.Is(o.err, context.DeadlineExceeded) {
		t.Fatalf("a stalled link gave %+v (code %v), want no answer, stalled, deadline_exceeded", o, sequencer.ErrorCode(o.err))
	}
	if c.ctx.Err() == nil {
		t.Fatal("the stalled batch's context is still live")
	}
	b.none(b.calls, "a resend into the stalled link")

	// The link is down now: a send to that owner is answered at once
	// (unreachable: not sent, so nothing stored), until a probe (every
	// downProbe) answers again.
	if o := b.outcome(b.send(ctx, "down"), "down"); o.kind != fwdUnreachable || sequencer.ErrorCode(o.err) != sequencer.CodeUnavailable {
		t.Fatalf("a send to an owner whose link is down: %+v (code %v), want unreachable, unavailable", o, sequencer.ErrorCode(o.err))
	}
	b.none(b.calls, "a send into a link that is down")
	b.clk.Advance(downProbe)
	b.next(b.probes, "the down link's probe").answer <- fwdAnswer{}
	testwait.For(t, 10*time.Second, time.Millisecond, "the link up again after its probe answered", func() bool {
		_, down := b.f.unreachable(b.dst)
		return !down
	})

	// Stalled, but the route names another owner by now: sent there.
	done = b.send(ctx, "moved")
	b.next(b.calls, "the batch into a dead link again")
	b.clk.Advance(ForwardProbeAfter)
	b.next(b.probes, "the probe")
	b.view(fwdRoute{remote: true, addr: "c:1", owner: "c"})
	b.clk.Advance(ForwardProbeTimeout)
	if c := b.next(b.calls, "the resend to the new owner"); c.addr != "c:1" {
		t.Fatalf("resent to %s, want c:1", c.addr)
	} else {
		c.answer <- fwdAnswer{}
	}
	if o := b.outcome(done, "moved"); o.kind != fwdAnswered || o.err != nil || !o.resent {
		t.Fatalf("moved: %+v", o)
	}
}

// TestForwarderBudgetOnTheClock: the owner's time budget is the caller's
// deadline read on the injected clock (9/10 of it), and an item without a
// deadline waits the forwarder's timeout on that clock.
func TestForwarderBudgetOnTheClock(t *testing.T) {
	b := newFwdBench(t, false)
	ctx, cancel := context.WithDeadline(context.Background(), b.clk.Now().Add(10*time.Second))
	defer cancel()
	done := b.send(ctx, "budget")
	c := b.next(b.calls, "the batch")
	if c.b.TimeoutMs != 9000 {
		t.Fatalf("budget %d ms, want 9000 (9/10 of the 10 s left on the clock)", c.b.TimeoutMs)
	}
	c.answer <- fwdAnswer{}
	b.outcome(done, "budget")

	done = b.send(context.Background(), "open")
	c = b.next(b.calls, "the batch without a deadline")
	if want := uint32(time.Minute * 9 / 10 / time.Millisecond); c.b.TimeoutMs != want {
		t.Fatalf("budget %d ms without a deadline, want %d", c.b.TimeoutMs, want)
	}
	b.clk.Advance(time.Minute - time.Millisecond)
	select {
	case <-c.ctx.Done():
		t.Fatal("the batch ended before its timeout on the clock")
	case <-time.After(50 * time.Millisecond):
	}
	b.clk.Advance(time.Millisecond)
	select {
	case <-c.ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the batch did not end at its timeout on the clock")
	}
	b.view(fwdRoute{}) // no resend: handed back
	if o := b.outcome(done, "open"); o.kind != fwdNoAnswer {
		t.Fatalf("a batch that ran out of time: %+v", o)
	}
}

// A unit past the batch limits goes in pieces, in order; when an item of a
// piece gets no answer (the owner ran out of time for it) the rest of the
// unit is not sent, so the item's resend cannot land after later items of
// its conversation.
func TestForwarderPiecesStopAtAnUnansweredItem(t *testing.T) {
	var calls atomic.Int32
	f := newForwarder(forwarderDeps{
		forward: func(ctx context.Context, addr string, b *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
			calls.Add(1)
			out := make([]sequencer.SendOutcome, len(b.Items))
			for i := range out {
				if i < len(out)/2 {
					out[i].Result = sequencer.SendResult{MsgID: uint64(100 + i), Seq: uint64(1 + i)}
				} else {
					out[i].Err = sequencer.Wrap(sequencer.CodeDeadlineExceeded, context.DeadlineExceeded, "the owner ran out of time")
				}
			}
			return encodeReplies("b", out), nil
		},
		self:    func() (string, string, uint64) { return "a", "a/1", 4 },
		suspect: func() {},
		timeout: time.Minute,
	})
	defer f.close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	unit := make([]*fwdItem, MaxForwardItems+MaxForwardItems/2)
	for k := range unit {
		unit[k] = newFwdItem(ctx, sequencer.SendRequest{ConvID: "c", FromUID: 1, ClientMsgID: fmt.Sprint(k), MsgType: 1})
	}
	f.enqueue("b:1", unit)
	for k, it := range unit {
		var o fwdOutcome
		select {
		case o = <-it.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("item %d: no outcome", k)
		}
		answered := k < MaxForwardItems/2
		if (o.kind == fwdAnswered) != answered || (!answered && o.kind != fwdNoAnswer) {
			t.Fatalf("item %d: outcome kind %d (%v), want answered=%v", k, o.kind, o.err, answered)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d pieces sent, want 1: the second went out after items of the first got no answer", n)
	}
}
