package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// Limits of one forwarded batch (a request to one peer). A unit (the items
// of one Send or SendBatch call for that peer) is never split unless it
// alone passes them.
const (
	MaxForwardItems = 1000
	MaxForwardBytes = 4 << 20
)

// fwdItem is one attempt of a send: waiting to be forwarded, or forwarded
// and waiting for its answer.
type fwdItem struct {
	ctx  context.Context // the caller's (bounded): the item is dropped unsent once it ends
	req  sequencer.SendRequest
	done chan fwdOutcome // buffered: the batch never blocks on a caller that left
}

type fwdKind int

const (
	fwdAnswered    fwdKind = iota // the owner's answer: res or err
	fwdRetry                      // not stored (an ownership error at the owner, the batch refused): the caller may route again
	fwdNoAnswer                   // outcome unknown, and not sent again: ctx ended, the link stalled, or handed back (see forwarder.resend)
	fwdUnreachable                // not sent: the link to the owner stalled moments ago and no probe has answered since (see forwarder.down)
)

type fwdOutcome struct {
	kind fwdKind
	res  sequencer.SendResult
	err  error
	// resent: an earlier attempt got no answer (it may have stored the
	// item), so a retryable error is no final answer, and Duplicate was
	// cleared (the client sent the message once).
	resent bool
	// stalled: no answer because the link to the owner made no progress
	// (its probe failed) while the route still names that owner; err is a
	// deadline_exceeded (outcome unknown) the caller answers at once.
	stalled bool
}

func newFwdItem(ctx context.Context, req sequencer.SendRequest) *fwdItem {
	return &fwdItem{ctx: ctx, req: req, done: make(chan fwdOutcome, 1)}
}

// fwdRoute is where the route function sends a conversation's items now.
type fwdRoute struct {
	remote bool   // another node owns it: forward to it; else the local path (or a wait) takes the item
	addr   string // the owner's cluster address
	owner  string // the owner's node id
}

// peerQueue holds the items waiting for one peer. Every batch is one
// request to the peer (HTTP/2 and connect on both nodes, a fixed cost of
// about 140 µs of CPU per batch on the 2-core test machine), so a busy node
// should send few large batches, and a quiet one a lone item at once:
//
//   - up to 2 batches leave as soon as they have an item;
//   - past that, new items queue, and each batch that returns takes
//     everything queued meanwhile (adaptive, like the group commit);
//   - another batch (up to MaxForwardsInFlight, the owner commits them in
//     parallel) leaves when 128 items wait, or when no batch left for 20 ms
//     (the batches in flight are slow, e.g. an item of theirs waits for a
//     handoff on the owner: the queue does not wait for them).
//
// A unit (the items of one call for this peer) is never split between
// concurrent batches, so items of one conversation from one call reach the
// owner in order.
type peerQueue struct {
	addr    string
	pending [][]*fwdItem // units, in arrival order
	items   int          // items in pending
	workers int          // drain goroutines running (<= MaxForwardsInFlight)
	lastOut time.Time    // when the last batch left
	guard   clock.Timer  // armed while items wait for a batch to return
	guardN  uint64       // which guard is armed (a stopped one may still fire)
}

// MaxForwardsInFlight bounds the concurrent batches to one peer.
const MaxForwardsInFlight = 16

// forwardPolicy decides when a batch leaves (see peerQueue).
type forwardPolicy struct {
	eager    int           // batches that leave as soon as they have an item
	minBatch int           // past eager: items waiting that make another batch leave
	stall    time.Duration // past eager: another batch leaves when none left for this long
}

// defaultForwardPolicy is every node's. With 256 closed-loop senders on the
// 2-core machine, 16 eager batches (about 8 items each) cost 52-68 µs of
// CPU per forwarded send in the test process, 2 (about 60 items) 34-42
// (cluster/README.md).
var defaultForwardPolicy = forwardPolicy{eager: 2, minBatch: 128, stall: 20 * time.Millisecond}

// forwarder carries sends to the nodes that own them: one queue per peer,
// batches by the forwardPolicy, one request per batch over the transport,
// and every item's outcome handed back (answered, not stored, or no answer:
// see fwdKind). It owns the retry of an attempt that got no answer (a
// transport error, the owner ran out of time or left the membership): the
// item is sent again with the same key to the owner the route names then,
// until an answer or the end of its caller's context, or handed back to the
// caller when the route no longer names another node (after a takeover the
// local writer takes it). A batch whose link to the peer makes no progress
// (its probe fails) ends without an answer at once; while the route still
// names that peer, the caller answers deadline_exceeded (outcome unknown),
// so that a client re-routes instead of waiting for the link.
//
// Its dependencies are injected: the transport's Forward (and Probe), the
// route function (where a conversation's sends go now), the membership test
// of an owner, the clock (the stall guard, the retry's backoff, the probe's
// timing and the owner's time budget), who this node is (self), and what a
// transport failure means for the failure detector (suspect).
type forwarder struct {
	forwarderDeps

	mu     sync.Mutex            // guards peers, probes, down and policy
	peers  map[string]*peerQueue // items waiting, by owner address
	probes map[string]*probeCall // probes in flight, by peer address
	// down: peers whose link stalled (a probe went unanswered), by
	// address, with when; a send to one is answered at once, not sent,
	// until a probe (every downProbe) answers again (see markDown).
	down   map[string]time.Time
	links  linkTimes // the links' share of the forwards' round trips (slowlink.go)
	policy forwardPolicy
	ctx    context.Context // batches in flight; canceled by close
	cancel context.CancelFunc
}

// forwarderDeps are what a forwarder is given.
type forwarderDeps struct {
	clk     clock.Clock // nil: the real clock
	forward func(ctx context.Context, addr string, b *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error)
	// probe asks the peer at addr for any answer over the link forwards
	// use (Prober); nil: links are not probed.
	probe func(ctx context.Context, addr string) error
	// route answers where convID's sends go now, and a channel closed at
	// the next change of the node's view.
	route func(convID string) (fwdRoute, <-chan struct{})
	// member reports whether nodeID is in the node's membership view (a
	// node that left will never answer), and a channel closed at the next
	// change of the view.
	member  func(nodeID string) (bool, <-chan struct{})
	self    func() (nodeID, incarnation string, version uint64)
	suspect func() // a peer failed at the transport level
	// refused: the peer at addr refused a connection (no process listens
	// on its cluster port); nil: not reported.
	refused func(addr string)
	met     *clusterMetrics
	timeout time.Duration // how long an item without a deadline waits (Config.ForwardTimeout)
	// probeAfter and probeTimeout: a batch without an answer after
	// probeAfter has its link probed; a probe without an answer within
	// probeTimeout ends the batches in flight to that peer (stalled).
	// Zero: ForwardProbeAfter and ForwardProbeTimeout.
	probeAfter, probeTimeout time.Duration
	// slowLink: Config.SlowLink (0: no link is slow).
	slowLink time.Duration
}

// The stall guard of a forward (forwarder): a batch not answered within
// ForwardProbeAfter has its link probed (one probe per peer at a time), and
// again every ForwardProbeAfter while the probes answer; a probe without an
// answer within ForwardProbeTimeout ends the batch without an answer. An
// owner that is merely slow (a handoff, a slow store) answers the probe, so
// its batches wait; a link that lost its peer (a blackhole, a frozen
// process) is given up about 1.5 s after the batch left instead of at the
// HTTP/2 ping timeout (4 s) or the caller's deadline.
const (
	ForwardProbeAfter   = 500 * time.Millisecond
	ForwardProbeTimeout = time.Second
)

// The backoff between the attempts of an item that got no answer from an
// owner the route still names: doubled per attempt from fwdBackoffMin up to
// fwdBackoffMax, cut short by a change of the node's view.
const (
	fwdBackoffMin = 20 * time.Millisecond
	fwdBackoffMax = 500 * time.Millisecond
)

func newForwarder(d forwarderDeps) *forwarder {
	d.clk = clock.Or(d.clk)
	if d.probeAfter <= 0 {
		d.probeAfter = ForwardProbeAfter
	}
	if d.probeTimeout <= 0 {
		d.probeTimeout = ForwardProbeTimeout
	}
	f := &forwarder{forwarderDeps: d, peers: map[string]*peerQueue{}, probes: map[string]*probeCall{}, down: map[string]time.Time{},
		policy: defaultForwardPolicy}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f
}

// linkSlow reports whether the link to the peer at addr is slow by the
// recent forwards (Config.SlowLink), and its average link time. A verdict
// "slow" that aged out (linkFresh) is measured again by a probe in the
// background while the sends are still kept off the link; without a prober,
// this one send is let through to measure it.
func (f *forwarder) linkSlow(addr string) (time.Duration, bool) {
	avg, slow, remeasure := f.links.slow(addr, f.clk.Now(), f.slowLink)
	if !remeasure {
		return avg, slow
	}
	if f.probe == nil {
		return avg, false
	}
	go f.measureLink(addr)
	return avg, slow
}

// measureLink times one probe of the link to addr (the peer answers it at
// once, so its round trip is the link's) and notes it. A probe without an
// answer notes nothing: the verdict stays, and is measured again after
// linkFresh.
//
// Not probeLink: a probe already under way, shared, would time only its
// rest and could make a slow link look fast.
func (f *forwarder) measureLink(addr string) {
	sent := f.clk.Now()
	if err := f.probeOnce(addr); err != nil {
		return
	}
	now := f.clk.Now()
	f.links.note(addr, now.Sub(sent), now, f.slowLink)
}

// close fails the batches in flight (their items get no answer).
func (f *forwarder) close() { f.cancel() }

// enqueue queues one unit of items (in their order) for the peer at addr.
func (f *forwarder) enqueue(addr string, unit []*fwdItem) {
	f.mu.Lock()
	pq := f.peers[addr]
	if pq == nil {
		pq = &peerQueue{addr: addr}
		f.peers[addr] = pq
	}
	pq.pending = append(pq.pending, unit)
	pq.items += len(unit)
	f.startDrain(pq)
	f.mu.Unlock()
}

// startDrain starts a batch to pq's peer when the policy allows it, or arms
// the stall guard. f.mu is held.
func (f *forwarder) startDrain(pq *peerQueue) {
	if pq.items == 0 || pq.workers >= MaxForwardsInFlight || f.peers[pq.addr] != pq {
		return
	}
	if pol := f.policy; pq.workers >= pol.eager && pq.items < pol.minBatch {
		if quiet := f.clk.Now().Sub(pq.lastOut); quiet < pol.stall {
			if pq.guard == nil {
				pq.guardN++
				armed := pq.guardN
				pq.guard = clock.AfterFunc(f.clk, pol.stall-quiet, func() {
					f.mu.Lock()
					defer f.mu.Unlock()
					if pq.guardN == armed {
						pq.guard = nil
						f.startDrain(pq)
					}
				})
			}
			return
		}
	}
	pq.workers++
	go f.drainPeer(pq)
}

// drainPeer sends the peer's queued items, one batch at a time, until none are
// left.
func (f *forwarder) drainPeer(pq *peerQueue) {
	for {
		f.mu.Lock()
		var batch []*fwdItem
		var big []*fwdItem // a unit past the limits alone: sent in pieces, in order, by this goroutine
		bytes := 0
		for len(pq.pending) > 0 {
			unit := pq.pending[0]
			live := unit[:0:0]
			ub := 0
			for _, it := range unit {
				if it.ctx.Err() == nil { // its caller left: not sent
					live = append(live, it)
					ub += itemSize(it.req)
				}
			}
			if len(batch) > 0 && (len(batch)+len(live) > MaxForwardItems || bytes+ub > MaxForwardBytes) {
				break
			}
			pq.pending = pq.pending[1:]
			pq.items -= len(unit)
			if len(batch) == 0 && (len(live) > MaxForwardItems || ub > MaxForwardBytes) {
				big = live
				break
			}
			batch = append(batch, live...)
			bytes += ub
		}
		if len(batch) > 0 || len(big) > 0 {
			pq.lastOut = f.clk.Now()
		}
		if pq.items == 0 && pq.guard != nil { // nothing waits any more
			pq.guard.Stop()
			pq.guard = nil
			pq.guardN++
		}
		if len(batch) == 0 && len(big) == 0 {
			pq.workers--
			if pq.workers == 0 && f.peers[pq.addr] == pq {
				delete(f.peers, pq.addr)
			}
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		if len(batch) > 0 {
			f.forwardBatch(pq.addr, batch)
		}
		for len(big) > 0 {
			k, b := 0, 0
			for k < len(big) && k < MaxForwardItems && (k == 0 || b+itemSize(big[k].req) <= MaxForwardBytes) {
				b += itemSize(big[k].req)
				k++
			}
			if err := f.forwardBatch(pq.addr, big[:k]); err != nil {
				// The rest of the unit is not sent after a piece of which
				// an item got no answer: the rest would be stored before
				// that item's resend, out of item order.
				for _, it := range big[k:] {
					it.done <- fwdOutcome{kind: fwdNoAnswer, err: err}
				}
				break
			}
			big = big[k:]
		}
	}
}

func itemSize(r sequencer.SendRequest) int {
	return len(r.ConvID) + len(r.ClientMsgID) + len(r.Body) + 32
}

// forwardBatch sends one batch and hands every item its outcome. It returns
// the error when the batch got no per-item answer, or when an item got none
// (the owner ran out of time for it: errItemUnanswered).
func (f *forwarder) forwardBatch(addr string, batch []*fwdItem) error {
	ctx, cancel, budget := f.batchContext(batch)
	defer cancel(nil)
	// Tracing: the forward's span is a child of the first item's caller
	// (a batch carrying several callers' items has one parent).
	if sc := trace.SpanContextFromContext(batch[0].ctx); sc.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, sc)
	}
	nodeID, incarnation, version := f.self()
	msg := &clusterv1.ForwardBatch{
		FromNode:          nodeID,
		FromIncarnation:   incarnation,
		MembershipVersion: version,
		// The owner gives up a little earlier, so its answer (even "deadline
		// exceeded") arrives before this node stops waiting.
		TimeoutMs: uint32(min(max(budget*9/10/time.Millisecond, 1), math.MaxUint32)),
		Items:     make([]*clusterv1.ForwardItem, len(batch)),
	}
	items := make([]clusterv1.ForwardItem, len(batch)) // one allocation per batch, not per item
	for i, it := range batch {
		f := &items[i]
		f.ConvId, f.FromUid, f.ClientMsgId = it.req.ConvID, it.req.FromUID, it.req.ClientMsgID
		f.MsgType, f.Body = int32(it.req.MsgType), it.req.Body
		f.Kind, f.TargetMsgId, f.AsModerator = int32(it.req.Kind), it.req.TargetMsgID, it.req.AsModerator
		msg.Items[i] = f
	}
	f.met.forwardBatch(len(batch))
	var stopWatch func()
	if f.probe != nil {
		stopWatch = f.watch(addr, func() { cancel(errLinkStalled) })
	}
	sent := f.clk.Now()
	reply, err := f.forward(ctx, addr, msg)
	if stopWatch != nil {
		stopWatch()
	}
	if err == nil {
		now := f.clk.Now()
		f.links.note(addr, now.Sub(sent)-time.Duration(reply.GetServedUs())*time.Microsecond, now, f.slowLink)
	}
	if err == nil && len(reply.GetResults()) != len(batch) {
		err = fmt.Errorf("node at %s answered %d results for %d items", addr, len(reply.GetResults()), len(batch))
	}
	if err != nil {
		var re *RefusedError
		o := fwdOutcome{kind: fwdNoAnswer, err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrUnknownOutcome,
			fmt.Sprintf("forward to %s: %v", addr, err))}
		result := "transport_error"
		switch {
		case errors.As(err, &re):
			// Nothing stored: the receiver refused the batch.
			o = fwdOutcome{kind: fwdRetry, err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner, re.Error())}
			result = "refused"
		case errors.Is(err, ErrNotSent):
			// Nothing stored: no connection to the owner could be opened
			// (it crashed, or this node is cut off); route again.
			o = fwdOutcome{kind: fwdRetry, err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
				fmt.Sprintf("forward to %s: %v", addr, err))}
			result = "not_sent"
			f.suspect()
			if f.refused != nil && errors.Is(err, syscall.ECONNREFUSED) {
				f.refused(addr)
			}
		case errors.Is(context.Cause(ctx), errLinkStalled):
			o = fwdOutcome{kind: fwdNoAnswer, stalled: true, err: sequencer.Wrap(sequencer.CodeDeadlineExceeded,
				fmt.Errorf("%w: %w", context.DeadlineExceeded, errLinkStalled),
				fmt.Sprintf("forward to %s: outcome unknown", addr))}
			result = "stalled"
			f.suspect()
			f.markDown(addr, batch[0].req.ConvID)
		default:
			f.suspect()
		}
		for _, it := range batch {
			f.met.forward(result)
			it.done <- o
		}
		return o.err
	}
	var unanswered error
	for i, it := range batch {
		r := reply.Results[i]
		if r.NodeId == "" {
			r.NodeId = reply.NodeId
		}
		res, err := decodeReply(r)
		var o fwdOutcome
		switch {
		case err == nil:
			o = fwdOutcome{kind: fwdAnswered, res: res}
			f.met.forward("ok")
		case ownershipErr(err):
			o = fwdOutcome{kind: fwdRetry, err: err}
			f.met.forward(sequencer.ErrorCode(err).String())
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			// The owner ran out of time: not an answer.
			o = fwdOutcome{kind: fwdNoAnswer, err: err}
			f.met.forward(sequencer.ErrorCode(err).String())
			unanswered = err
		default:
			o = fwdOutcome{kind: fwdAnswered, err: err}
			f.met.forward(sequencer.ErrorCode(err).String())
		}
		it.done <- o
	}
	if unanswered != nil {
		return fmt.Errorf("%w: %w", errItemUnanswered, unanswered)
	}
	return nil
}

// errItemUnanswered: an item of a forwarded batch got no answer from the
// owner (it ran out of time), though others did.
var errItemUnanswered = errors.New("an item of the batch got no answer")

// downProbe is how often the link of a peer that is down (markDown) is
// probed until it answers.
const downProbe = 200 * time.Millisecond

// markDown records that the link to the peer at addr stalled: until a probe
// answers again (probed every downProbe, each bounded by probeTimeout, in
// one goroutine per peer), sends to it are answered at once (unreachable)
// instead of each waiting ForwardProbeAfter+ForwardProbeTimeout for the same
// verdict. conv is a conversation routed to it: probing stops when the route
// no longer names that address (the owner left the view).
func (f *forwarder) markDown(addr, conv string) {
	if f.probe == nil {
		return
	}
	f.mu.Lock()
	_, already := f.down[addr]
	if !already {
		f.down[addr] = f.clk.Now()
	}
	f.mu.Unlock()
	if already {
		return
	}
	f.met.peerDown(1)
	go func() {
		defer func() {
			f.mu.Lock()
			delete(f.down, addr)
			f.mu.Unlock()
			f.met.peerDown(-1)
		}()
		for {
			t, fired := clock.After(f.clk, downProbe)
			select {
			case <-f.ctx.Done():
				t.Stop()
				return
			case <-fired:
			}
			if f.probeLink(addr) {
				return
			}
			if r, _ := f.route(conv); !r.remote || r.addr != addr {
				return
			}
		}
	}()
}

// unreachable answers a send to dst at once when its link is down
// (markDown): not sent, so nothing was stored by this attempt.
func (f *forwarder) unreachable(dst fwdRoute) (fwdOutcome, bool) {
	f.mu.Lock()
	since, down := f.down[dst.addr]
	f.mu.Unlock()
	if !down {
		return fwdOutcome{}, false
	}
	f.met.forward("unreachable")
	return fwdOutcome{kind: fwdUnreachable, err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
		fmt.Sprintf("node %s does not answer over the cluster link (no answer to a probe for %v); not sent",
			dst.owner, f.clk.Now().Sub(since).Round(time.Millisecond)))}, true
}

// errLinkStalled ends a batch whose link to the peer made no progress (its
// probe got no answer).
var errLinkStalled = errors.New("no progress on the link to the owner (probe unanswered)")

// batchContext is the context of one batch: it waits as long as its most
// patient item (until the latest of the items' deadlines; an item without
// one waits f.timeout on the clock), and budget is that wait as the owner
// gets it. Context deadlines are compared with the injected clock (the real
// one in production; a test with a fake clock gives its items deadlines
// near the fake time, or none).
func (f *forwarder) batchContext(batch []*fwdItem) (context.Context, context.CancelCauseFunc, time.Duration) {
	now := f.clk.Now()
	var latest time.Time
	budget, open := time.Duration(0), false // open: an item has no deadline
	for _, it := range batch {
		dl, ok := it.ctx.Deadline()
		if !ok {
			open = true
			budget = max(budget, f.timeout)
			continue
		}
		if dl.After(latest) {
			latest = dl
		}
		budget = max(budget, dl.Sub(now))
	}
	ctx, cancel := context.WithCancelCause(f.ctx)
	if !open {
		dctx, dcancel := context.WithDeadline(ctx, latest)
		return dctx, func(cause error) { cancel(cause); dcancel() }, budget
	}
	t := clock.AfterFunc(f.clk, budget, func() { cancel(context.DeadlineExceeded) })
	return ctx, func(cause error) { t.Stop(); cancel(cause) }, budget
}

// probeCall is one probe of a peer's link, shared by the batches that wait
// for its verdict.
type probeCall struct {
	done  chan struct{}
	alive bool
}

// watch guards one batch in flight to addr: after probeAfter without an
// answer it probes the link (shared with the other batches to addr); a probe
// that answers re-arms the guard, one that does not calls stalled. The
// returned stop ends the guard once the batch returned.
func (f *forwarder) watch(addr string, stalled func()) (stop func()) {
	var mu sync.Mutex
	over := false
	var timer clock.Timer
	var arm func()
	arm = func() { // mu held
		timer = clock.AfterFunc(f.clk, f.probeAfter, func() {
			alive := f.probeLink(addr)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case over:
			case alive:
				arm()
			default:
				stalled()
			}
		})
	}
	mu.Lock()
	arm()
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		over = true
		timer.Stop()
	}
}

// probeLink reports whether the peer at addr answered a probe within
// probeTimeout; concurrent callers share one probe.
func (f *forwarder) probeLink(addr string) bool {
	f.mu.Lock()
	pc := f.probes[addr]
	if pc == nil {
		pc = &probeCall{done: make(chan struct{})}
		f.probes[addr] = pc
		go func() {
			err := f.probeOnce(addr)
			f.mu.Lock()
			delete(f.probes, addr)
			f.mu.Unlock()
			pc.alive = err == nil
			close(pc.done)
		}()
	}
	f.mu.Unlock()
	<-pc.done
	return pc.alive
}

// probeOnce probes the link to addr once, bounded by probeTimeout on the
// clock (and by close).
func (f *forwarder) probeOnce(addr string) error {
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	t := clock.AfterFunc(f.clk, f.probeTimeout, cancel)
	defer t.Stop()
	return f.probe(ctx, addr)
}

// send forwards req to dst's owner and returns the outcome, after sending
// it again as long as attempts get no answer (see resend).
func (f *forwarder) send(ctx context.Context, req sequencer.SendRequest, dst fwdRoute) fwdOutcome {
	if o, down := f.unreachable(dst); down {
		return o
	}
	it := newFwdItem(ctx, req)
	f.enqueue(dst.addr, []*fwdItem{it})
	return f.resend(ctx, req, dst, f.await(ctx, dst.owner, it))
}

// sendUnit forwards reqs (the items of one call owned by dst's owner) as
// one unit and returns each item's outcome. The items that got no answer
// are then sent again one by one as send does, those of one conversation in
// item order (conversations in parallel); after one ends without an answer,
// the later ones of its conversation are left as they are.
func (f *forwarder) sendUnit(ctx context.Context, reqs []sequencer.SendRequest, dst fwdRoute) []fwdOutcome {
	out := make([]fwdOutcome, len(reqs))
	if o, down := f.unreachable(dst); down {
		for k := range out {
			out[k] = o
		}
		return out
	}
	items := make([]*fwdItem, len(reqs))
	for k := range reqs {
		items[k] = newFwdItem(ctx, reqs[k])
	}
	f.enqueue(dst.addr, items)
	var again []int
	for k, it := range items {
		if out[k] = f.await(ctx, dst.owner, it); out[k].kind == fwdNoAnswer {
			again = append(again, k)
		}
	}
	byConversation(reqs, again, func(idx []int) {
		for _, k := range idx {
			if out[k] = f.resend(ctx, reqs[k], dst, out[k]); out[k].kind == fwdNoAnswer {
				return
			}
		}
	})
	return out
}

// resend carries on after an attempt of req to dst ended with o. An attempt
// without an answer is not an answer: req is sent again, with the same key,
// to the owner the route names, after a backoff on the clock (cut short by
// a change of the node's view) when that is the same owner. It returns the
// first answer (fwdAnswered, fwdRetry; resent set when an attempt went
// unanswered), or no answer when ctx ended (err wraps ctx.Err()), when the
// link to the owner the route still names stalled (stalled set), or when
// the route no longer names another node: the item is handed back to the
// caller (after a takeover the local writer takes it, or it waits for the
// handoff).
func (f *forwarder) resend(ctx context.Context, req sequencer.SendRequest, dst fwdRoute, o fwdOutcome) fwdOutcome {
	backoff := fwdBackoffMin
	for resent := false; ; resent = true {
		if o.kind != fwdNoAnswer {
			if resent {
				o.resent = true
				o.res.Duplicate = false // found stored by this node's own resend: the client sent it once
			}
			return o
		}
		o.resent = true
		if err := ctx.Err(); err != nil {
			if !errors.Is(o.err, err) {
				o.err = fmt.Errorf("%w (%v)", err, o.err)
			}
			return o
		}
		next, changed := f.route(req.ConvID)
		if !next.remote || (o.stalled && next.owner == dst.owner) {
			return o
		}
		if next == dst {
			t, fired := clock.After(f.clk, backoff)
			select {
			case <-fired:
			case <-changed:
			case <-ctx.Done():
			}
			t.Stop()
			if err := ctx.Err(); err != nil {
				return fwdOutcome{kind: fwdNoAnswer, resent: true, err: fmt.Errorf("%w (%v)", err, o.err)}
			}
			backoff = min(2*backoff, fwdBackoffMax)
			if next, _ = f.route(req.ConvID); !next.remote {
				return o
			}
		}
		dst = next
		if _, down := f.unreachable(dst); down {
			// Not sent again to a peer that does not answer: the outcome
			// of the attempts so far is unknown (deadline_exceeded), so the
			// client re-routes.
			return fwdOutcome{kind: fwdNoAnswer, stalled: true, resent: true, err: sequencer.Wrap(sequencer.CodeDeadlineExceeded,
				fmt.Errorf("%w: %w", context.DeadlineExceeded, errLinkStalled),
				fmt.Sprintf("forward to node %s: outcome unknown", dst.owner))}
		}
		it := newFwdItem(ctx, req)
		f.enqueue(dst.addr, []*fwdItem{it})
		o = f.await(ctx, dst.owner, it)
	}
}

// await waits for it's outcome; it gives up (no answer) when ctx ends or the
// owner drops out of the membership (crashed: its reply will never come;
// sending again is safe, the resend key makes it idempotent).
func (f *forwarder) await(ctx context.Context, ownerID string, it *fwdItem) fwdOutcome {
	for {
		select {
		case o := <-it.done:
			return o
		default:
		}
		member, changed := f.member(ownerID)
		if !member {
			f.met.forward("owner_gone")
			return fwdOutcome{kind: fwdNoAnswer, err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrUnknownOutcome,
				fmt.Sprintf("node %s left the membership while a send was forwarded to it", ownerID))}
		}
		select {
		case o := <-it.done:
			return o
		case <-changed:
		case <-ctx.Done():
			return fwdOutcome{kind: fwdNoAnswer, err: ctx.Err()}
		}
	}
}
