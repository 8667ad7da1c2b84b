package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// fwdItem is one send waiting to be forwarded, or forwarded and waiting for
// its answer.
type fwdItem struct {
	ctx  context.Context // the caller's (bounded): the item is dropped unsent once it ends
	req  sequencer.SendRequest
	done chan fwdOutcome // buffered: the batch never blocks on a caller that left
}

type fwdKind int

const (
	fwdAnswered fwdKind = iota // a final answer: res or err
	fwdRetry                   // not stored (ownership error, refused batch): retry within HandoffWait
	fwdNoAnswer                // outcome unknown: retry with the same key until ctx ends
)

type fwdOutcome struct {
	kind fwdKind
	res  sequencer.SendResult
	err  error
}

func newFwdItem(ctx context.Context, req sequencer.SendRequest) *fwdItem {
	return &fwdItem{ctx: ctx, req: req, done: make(chan fwdOutcome, 1)}
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
// see fwdKind). It knows nothing of ownership: the caller routes (Node.send,
// Node.sendMany) and retries. Its dependencies are injected: the transport's
// Forward, the clock (the stall guard and its quiet time), who this node is
// (self), and what a transport failure means for the failure detector
// (suspect).
type forwarder struct {
	forwarderDeps

	mu     sync.Mutex            // guards peers and policy
	peers  map[string]*peerQueue // items waiting, by owner address
	policy forwardPolicy
	ctx    context.Context // batches in flight; canceled by close
	cancel context.CancelFunc
}

// forwarderDeps are what a forwarder is given.
type forwarderDeps struct {
	clk     clock.Clock // nil: the real clock
	forward func(ctx context.Context, addr string, b *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error)
	self    func() (nodeID, incarnation string, version uint64)
	suspect func() // a peer failed at the transport level
	met     *clusterMetrics
	timeout time.Duration // how long an item without a deadline waits (Config.ForwardTimeout)
}

func newForwarder(d forwarderDeps) *forwarder {
	d.clk = clock.Or(d.clk)
	f := &forwarder{forwarderDeps: d, peers: map[string]*peerQueue{}, policy: defaultForwardPolicy}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f
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
				// The rest of the unit is not sent after a piece without
				// an answer: its items would overtake the piece's.
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
// the error when the batch got no per-item answer.
func (f *forwarder) forwardBatch(addr string, batch []*fwdItem) error {
	// The batch waits as long as its most patient item. Context deadlines
	// are real time, whatever the injected clock: this is the one place the
	// forwarder reads the wall clock, to turn them into the owner's budget.
	var deadline time.Time
	realNow := time.Now()
	for _, it := range batch {
		dl, ok := it.ctx.Deadline()
		if !ok {
			dl = realNow.Add(f.timeout)
		}
		if dl.After(deadline) {
			deadline = dl
		}
	}
	timeout := deadline.Sub(realNow)
	ctx, cancel := context.WithDeadline(f.ctx, deadline)
	defer cancel()
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
		TimeoutMs: uint32(max(timeout*9/10/time.Millisecond, 1)),
		Items:     make([]*clusterv1.ForwardItem, len(batch)),
	}
	items := make([]clusterv1.ForwardItem, len(batch)) // one allocation per batch, not per item
	for i, it := range batch {
		f := &items[i]
		f.ConvId, f.FromUid, f.ClientMsgId = it.req.ConvID, it.req.FromUID, it.req.ClientMsgID
		f.MsgType, f.Body = int32(it.req.MsgType), it.req.Body
		msg.Items[i] = f
	}
	f.met.forwardBatch(len(batch))
	reply, err := f.forward(ctx, addr, msg)
	if err == nil && len(reply.GetResults()) != len(batch) {
		err = fmt.Errorf("node at %s answered %d results for %d items", addr, len(reply.GetResults()), len(batch))
	}
	if err != nil {
		var re *RefusedError
		o := fwdOutcome{kind: fwdNoAnswer, err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrUnknownOutcome,
			fmt.Sprintf("forward to %s: %v", addr, err))}
		result := "transport_error"
		if !errors.As(err, &re) {
			f.suspect()
		}
		if errors.As(err, &re) {
			// Nothing stored: this node is not a live member in the
			// receiver's view (it is presumed dead, or the receiver lags).
			o = fwdOutcome{kind: fwdRetry, err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner, re.Error())}
			result = "refused"
		}
		for _, it := range batch {
			f.met.forward(result)
			it.done <- o
		}
		return o.err
	}
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
		default:
			o = fwdOutcome{kind: fwdAnswered, err: err}
			f.met.forward(sequencer.ErrorCode(err).String())
		}
		it.done <- o
	}
	return nil
}
