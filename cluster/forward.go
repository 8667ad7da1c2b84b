package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/ownership"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
	"github.com/sequencer-im/sequencer/ring"
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

func (n *Node) newFwdItem(ctx context.Context, req sequencer.SendRequest) *fwdItem {
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
	guard   *time.Timer  // armed while items wait for a batch to return
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

// enqueue queues one unit of items (in their order) for the peer at addr.
func (n *Node) enqueue(addr string, unit []*fwdItem) {
	n.fwdMu.Lock()
	pq := n.peers[addr]
	if pq == nil {
		pq = &peerQueue{addr: addr}
		n.peers[addr] = pq
	}
	pq.pending = append(pq.pending, unit)
	pq.items += len(unit)
	n.startDrain(pq)
	n.fwdMu.Unlock()
}

// startDrain starts a batch to pq's peer when the policy allows it, or arms
// the stall guard. fwdMu is held.
func (n *Node) startDrain(pq *peerQueue) {
	if pq.items == 0 || pq.workers >= MaxForwardsInFlight || n.peers[pq.addr] != pq {
		return
	}
	if pol := n.fwdPolicy; pq.workers >= pol.eager && pq.items < pol.minBatch {
		if quiet := time.Since(pq.lastOut); quiet < pol.stall {
			if pq.guard == nil {
				pq.guardN++
				armed := pq.guardN
				pq.guard = time.AfterFunc(pol.stall-quiet, func() {
					n.fwdMu.Lock()
					defer n.fwdMu.Unlock()
					if pq.guardN == armed {
						pq.guard = nil
						n.startDrain(pq)
					}
				})
			}
			return
		}
	}
	pq.workers++
	go n.drainPeer(pq)
}

// drainPeer sends the peer's queued items, one batch at a time, until none are
// left.
func (n *Node) drainPeer(pq *peerQueue) {
	for {
		n.fwdMu.Lock()
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
			pq.lastOut = time.Now()
		}
		if pq.items == 0 && pq.guard != nil { // nothing waits any more
			pq.guard.Stop()
			pq.guard = nil
			pq.guardN++
		}
		if len(batch) == 0 && len(big) == 0 {
			pq.workers--
			if pq.workers == 0 && n.peers[pq.addr] == pq {
				delete(n.peers, pq.addr)
			}
			n.fwdMu.Unlock()
			return
		}
		n.fwdMu.Unlock()
		if len(batch) > 0 {
			n.forwardBatch(pq.addr, batch)
		}
		for len(big) > 0 {
			k, b := 0, 0
			for k < len(big) && k < MaxForwardItems && (k == 0 || b+itemSize(big[k].req) <= MaxForwardBytes) {
				b += itemSize(big[k].req)
				k++
			}
			if err := n.forwardBatch(pq.addr, big[:k]); err != nil {
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
func (n *Node) forwardBatch(addr string, batch []*fwdItem) error {
	// The batch waits as long as its most patient item.
	var deadline time.Time
	for _, it := range batch {
		dl, ok := it.ctx.Deadline()
		if !ok {
			dl = time.Now().Add(n.cfg.ForwardTimeout)
		}
		if dl.After(deadline) {
			deadline = dl
		}
	}
	timeout := time.Until(deadline)
	ctx, cancel := context.WithDeadline(n.fwdCtx, deadline)
	defer cancel()
	// Tracing: the forward's span is a child of the first item's caller
	// (a batch carrying several callers' items has one parent).
	if sc := trace.SpanContextFromContext(batch[0].ctx); sc.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, sc)
	}
	n.mu.RLock()
	self, version := n.core.Self(), n.core.View().Version
	n.mu.RUnlock()
	msg := &clusterv1.ForwardBatch{
		FromNode:          self.NodeID,
		FromIncarnation:   self.Incarnation,
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
	n.met.forwardBatch(len(batch))
	reply, err := n.tr.Forward(ctx, addr, msg)
	if err == nil && len(reply.GetResults()) != len(batch) {
		err = fmt.Errorf("node at %s answered %d results for %d items", addr, len(reply.GetResults()), len(batch))
	}
	if err != nil {
		var re *RefusedError
		o := fwdOutcome{kind: fwdNoAnswer, err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrUnknownOutcome,
			fmt.Sprintf("forward to %s: %v", addr, err))}
		result := "transport_error"
		if !errors.As(err, &re) {
			n.suspect()
		}
		if errors.As(err, &re) {
			// Nothing stored: this node is not a live member in the
			// receiver's view (it is presumed dead, or the receiver lags).
			o = fwdOutcome{kind: fwdRetry, err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner, re.Error())}
			result = "refused"
		}
		for _, it := range batch {
			n.met.forward(result)
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
			n.met.forward("ok")
		case ownershipErr(err):
			o = fwdOutcome{kind: fwdRetry, err: err}
			n.met.forward(sequencer.ErrorCode(err).String())
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			// The owner ran out of time: not an answer.
			o = fwdOutcome{kind: fwdNoAnswer, err: err}
			n.met.forward(sequencer.ErrorCode(err).String())
		default:
			o = fwdOutcome{kind: fwdAnswered, err: err}
			n.met.forward(sequencer.ErrorCode(err).String())
		}
		it.done <- o
	}
	return nil
}

// await waits for it's outcome; it gives up (no answer) when ctx ends or the
// owner drops out of the membership (crashed: its reply will never come;
// sending again is safe, the resend key makes it idempotent).
func (n *Node) await(ctx context.Context, ownerID string, it *fwdItem) fwdOutcome {
	for {
		select {
		case o := <-it.done:
			return o
		default:
		}
		n.mu.RLock()
		changed := n.changed
		_, member := n.core.View().Member(ownerID)
		n.mu.RUnlock()
		if !member {
			n.met.forward("owner_gone")
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

// HandleForward implements Handler: a batch forwarded by another node. The
// sender must be a live member at its current incarnation (else the batch
// is refused, nothing stored); every item is validated with the API's rules
// (sequencer.NewSendRequest, the node's MaxBody), then handled like the
// items of a local SendBatch, never forwarded again.
func (n *Node) HandleForward(ctx context.Context, b *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
	if err := n.checkSender(ctx, b); err != nil {
		n.met.received("refused", len(b.Items))
		return nil, err
	}
	if b.TimeoutMs > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(b.TimeoutMs)*time.Millisecond)
		defer cancel()
	}
	out := make([]sequencer.SendOutcome, len(b.Items))
	reqs := make([]sequencer.SendRequest, 0, len(b.Items))
	idx := make([]int, 0, len(b.Items))
	for i, it := range b.Items {
		req, err := sequencer.NewSendRequest(it.ConvId, it.FromUid, it.ClientMsgId, it.MsgType, it.Body, n.cfg.MaxBody)
		if err != nil {
			out[i].Err = err
			continue
		}
		reqs = append(reqs, req)
		idx = append(idx, i)
	}
	n.met.received("accepted", len(reqs))
	n.met.received("invalid", len(b.Items)-len(reqs))
	if len(reqs) > 0 {
		vout := make([]sequencer.SendOutcome, len(reqs))
		n.sendMany(ctx, reqs, vout, true)
		for k, i := range idx {
			out[i] = vout[k]
		}
	}
	return encodeReplies(n.cfg.NodeID, out), nil
}

// checkSender refuses a batch whose sender is not a live member at the
// incarnation it names. When the sender's view is newer than ours, the
// membership is read once more before refusing (rate-limited).
func (n *Node) checkSender(ctx context.Context, b *clusterv1.ForwardBatch) error {
	live := func() (bool, uint64) {
		n.mu.RLock()
		defer n.mu.RUnlock()
		return n.core.Live(b.FromNode, b.FromIncarnation)
	}
	ok, version := live()
	if ok {
		return nil
	}
	if b.MembershipVersion > version && n.viewReads.Allow() {
		rctx, cancel := n.opCtx(ctx)
		v, err := n.store.View(rctx)
		cancel()
		if err == nil {
			n.observe(v)
			if ok, version = live(); ok {
				return nil
			}
		}
	}
	return &RefusedError{Msg: fmt.Sprintf("node %q at incarnation %q is not a live member in membership view %d of node %s",
		b.FromNode, b.FromIncarnation, version, n.cfg.NodeID)}
}

// SendBatch implements the API's Sender for a batch: every item is routed
// like Send. Items this node owns go to the local writer in one SendBatch
// call; items owned elsewhere are queued per owner and forwarded in batches;
// the rest (partition not writable yet, owner unknown) and retries go one
// by one. Items of one conversation keep their order (their seqs follow
// item order when they succeed).
func (n *Node) SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.ForwardTimeout)
		defer cancel()
	}
	n.sendMany(ctx, reqs, out, false)
}

// sendMany answers every item of reqs in out. forwarded: the items came
// from another node (handled here or failed, never forwarded again).
func (n *Node) sendMany(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome, forwarded bool) {
	var local []int
	remote := map[string][]int{} // owner's cluster address -> item indexes
	owners := map[string]string{}
	var slow []int
	n.mu.RLock()
	active := n.core.Phase() == ownership.PhaseActive
	for i := range reqs {
		dst := n.core.Route(ring.PartitionOf(reqs[i].ConvID, n.partitions))
		switch {
		case !active:
			slow = append(slow, i)
		case dst.Way == ownership.WayLocal:
			local = append(local, i)
		case dst.Way == ownership.WayForward && !forwarded:
			remote[dst.Owner.ClusterAddr] = append(remote[dst.Owner.ClusterAddr], i)
			owners[dst.Owner.ClusterAddr] = dst.Owner.NodeID
		default:
			slow = append(slow, i) // answered by send: waits, refusals, forwarded items not ours
		}
	}
	n.mu.RUnlock()

	// Forward first, so the peers work while the local writer does.
	type sent struct {
		owner string
		idx   []int
		items []*fwdItem
	}
	var fwd []sent
	for addr, idx := range remote {
		items := make([]*fwdItem, len(idx))
		for k, i := range idx {
			items[k] = n.newFwdItem(ctx, reqs[i])
		}
		n.enqueue(addr, items)
		fwd = append(fwd, sent{owners[addr], idx, items})
	}
	// retry: items to send again one by one (no final answer yet).
	retry := make([]retryKind, len(reqs))
	if len(local) > 0 {
		lreqs := make([]sequencer.SendRequest, len(local))
		lout := make([]sequencer.SendOutcome, len(local))
		for k, i := range local {
			lreqs[k] = reqs[i]
		}
		n.local.SendBatch(ctx, lreqs, lout)
		for k, i := range local {
			out[i] = lout[k]
			if lout[k].Err != nil && ownershipErr(lout[k].Err) {
				retry[i] = retryNotStored
			}
		}
	}
	for _, f := range fwd {
		for k, i := range f.idx {
			o := n.await(ctx, f.owner, f.items[k])
			out[i] = sequencer.SendOutcome{Result: o.res, Err: o.err}
			switch o.kind {
			case fwdRetry:
				retry[i] = retryNotStored
			case fwdNoAnswer:
				retry[i] = retryUnknown
			}
		}
	}
	for _, i := range slow {
		retry[i] = retryNotStored
	}
	n.sendSlow(ctx, reqs, out, retry, forwarded)
}

type retryKind uint8

const (
	retryNone      retryKind = iota // answered
	retryNotStored                  // not stored (or never tried): may be answered with its error
	retryUnknown                    // outcome unknown: only an answer or the end of ctx ends it
)

// sendSlow sends the items marked in retry one by one through send, the
// items of one conversation in item order, conversations in parallel. A
// not-stored item is not sent again when a later item of its conversation
// already succeeded (its seq would come after); its error answers it then
// (final: nothing was stored). After an item of a conversation fails with a
// retryable error, the later items of that conversation are answered the
// same without being tried. Once ctx ended, items not answered get ctx's
// error (not an answer: the outcome is unknown).
func (n *Node) sendSlow(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome, retry []retryKind, forwarded bool) {
	byConv := map[string][]int{}
	var order []string
	for i := range reqs {
		if retry[i] == retryNone {
			continue
		}
		c := reqs[i].ConvID
		if _, ok := byConv[c]; !ok {
			order = append(order, c)
		}
		byConv[c] = append(byConv[c], i)
	}
	if len(order) == 0 {
		return
	}
	// lastOK[conv]: the index of the last item of conv that succeeded
	// without a retry.
	lastOK := map[string]int{}
	for i := range reqs {
		if retry[i] == retryNone && out[i].Err == nil {
			lastOK[reqs[i].ConvID] = i
		}
	}
	run := func(c string) {
		var failed error
		last, hasLast := lastOK[c]
		for _, i := range byConv[c] {
			switch {
			case ctx.Err() != nil:
				if out[i].Err != nil {
					out[i] = sequencer.SendOutcome{Err: fmt.Errorf("%w (%v)", ctx.Err(), out[i].Err)}
				} else {
					out[i] = sequencer.SendOutcome{Err: ctx.Err()}
				}
			case hasLast && last > i && retry[i] == retryNotStored:
				if out[i].Err == nil {
					out[i].Err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner, "not sent again: a later message of its conversation was stored first")
				}
			case failed != nil && retry[i] == retryNotStored:
				out[i] = sequencer.SendOutcome{Err: failed}
			default:
				res, err := n.send(ctx, reqs[i], forwarded, retry[i] == retryUnknown)
				out[i] = sequencer.SendOutcome{Result: res, Err: err}
				if err != nil && ownershipErr(err) {
					failed = err
				}
			}
		}
	}
	if len(order) == 1 {
		run(order[0])
		return
	}
	var wg sync.WaitGroup
	for _, c := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(c)
		}()
	}
	wg.Wait()
}
