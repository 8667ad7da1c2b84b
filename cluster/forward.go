package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/ownership"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
	"github.com/sequencer-im/sequencer/ring"
)

// HandleForward implements Handler: a batch forwarded by another node. The
// batch must name its sender (else it is refused, nothing stored; see
// checkSender); every item is validated with the API's rules
// (sequencer.NewRequest: a Send, Edit or Recall; the node's MaxBody), then handled like the
// items of a local SendBatch: a live member's never forwarded again, a
// non-member's at most once more.
func (n *peerServer) HandleForward(ctx context.Context, b *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
	start := n.clk.Now() // the reply's served_us: the sender's slow-link check subtracts it
	member, err := n.checkSender(b)
	if err != nil {
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
		req, err := sequencer.NewRequest(sequencer.Kind(it.Kind), it.ConvId, it.FromUid, it.ClientMsgId, it.MsgType, it.Body,
			it.TargetMsgId, it.AsModerator, n.cfg.MaxBody)
		if err != nil {
			out[i].Err = err
			continue
		}
		reqs = append(reqs, req)
		idx = append(idx, i)
	}
	if member {
		n.met.received("accepted", len(reqs))
	} else {
		n.met.received("accepted_from_non_member", len(reqs))
	}
	n.met.received("invalid", len(b.Items)-len(reqs))
	if len(reqs) > 0 {
		vout := make([]sequencer.SendOutcome, len(reqs))
		// A live member's items are handled here or failed, never
		// forwarded again. A non-member routes by a view this node has
		// moved past (it is cut from the store, presumed dead): its items
		// are routed as this node's own clients' sends, so one more hop
		// at most takes them to the owner (that hop comes from a live
		// member, never forwarded again).
		n.sendMany(ctx, reqs, vout, member)
		for k, i := range idx {
			out[i] = vout[k]
		}
	}
	reply := encodeReplies(n.cfg.NodeID, out)
	reply.ServedUs = uint64(max(n.clk.Now().Sub(start), 0) / time.Microsecond)
	return reply, nil
}

// checkSender refuses a batch that names no sender (node id and
// incarnation), and reports whether the sender is a live member of this
// node's view. A sender that is not is served all the same: its items go
// through this node's own routing like its own clients' sends (see
// HandleForward), so nothing it asks is written without the owner's fence. That is how a node cut from
// the store but not from its peers (presumed dead by them) serves its
// clients: it forwards their sends to its partitions' next owners
// (ownership.Destination.Successor). Peers are authenticated by the
// transport (mutual TLS), not by the membership table. A sender whose view
// is newer than ours makes the heartbeat read the table now.
func (n *peerServer) checkSender(b *clusterv1.ForwardBatch) (member bool, err error) {
	if b.FromNode == "" || b.FromIncarnation == "" {
		return false, &RefusedError{Msg: fmt.Sprintf("a forwarded batch must name its sender's node id and incarnation (node %s)", n.cfg.NodeID)}
	}
	live, version := read(n.member, func(c *ownership.Core) bool { ok, _ := c.Live(b.FromNode, b.FromIncarnation); return ok }),
		read(n.member, func(c *ownership.Core) uint64 { return c.View().Version })
	if b.MembershipVersion > version {
		n.poke(n.wakeBeat)
	}
	return live, nil
}

// SendBatch implements the API's Sender for a batch: every item is routed
// like Send. Items this node owns go to the local writer in one SendBatch
// call; items owned elsewhere are queued per owner and forwarded in batches;
// the rest (partition not writable yet, owner unknown) and retries go one
// by one. Items of one conversation keep their order (their seqs follow
// item order when they succeed).
func (n *Node) SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome) {
	var cancel context.CancelFunc
	ctx, cancel = context.WithTimeout(ctx, n.cfg.ForwardTimeout) // this node's bound, as Send's
	defer cancel()
	n.sendMany(ctx, reqs, out, false)
}

// sendMany answers every item of reqs in out. forwarded: the items came
// from another node (handled here or failed, never forwarded again).
func (n *router) sendMany(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome, forwarded bool) {
	var local []int
	remote := map[string][]int{} // owner's cluster address -> item indexes
	var slow []int
	dsts := make([]ownership.Destination, len(reqs))
	now := n.clk.Now()
	n.mu.RLock()
	for i := range reqs {
		dst := n.core.Dispatch(ring.PartitionOf(reqs[i].ConvID, n.partitions), now)
		dsts[i] = dst
		switch {
		case dst.Way == ownership.WayLocal:
			local = append(local, i)
		case dst.Way == ownership.WayForward && !forwarded:
			remote[dst.Owner.ClusterAddr] = append(remote[dst.Owner.ClusterAddr], i)
		default:
			slow = append(slow, i) // answered by send: waits, refusals, forwarded items not ours
		}
	}
	n.mu.RUnlock()

	// retry: items to send again one by one (no final answer yet).
	retry := make([]retryKind, len(reqs))
	// Forward first, so the peers work while the local writer does.
	var fwd sync.WaitGroup
	for addr, idx := range remote {
		fwd.Add(1)
		go func() {
			defer fwd.Done()
			ureqs := make([]sequencer.SendRequest, len(idx))
			for k, i := range idx {
				ureqs[k] = reqs[i]
			}
			dst := dsts[idx[0]]
			for k, o := range n.fwd.sendUnit(ctx, ureqs, fwdRoute{remote: true, addr: addr, owner: dst.Owner.NodeID}) {
				i := idx[k]
				out[i], retry[i] = n.settle(ctx, dsts[i], fwdAttempt(o), forwarded)
			}
		}()
	}
	if len(local) > 0 {
		lreqs := make([]sequencer.SendRequest, len(local))
		lout := make([]sequencer.SendOutcome, len(local))
		for k, i := range local {
			lreqs[k] = reqs[i]
		}
		wctx, stop := n.writerCtx(ctx)
		n.local.SendBatch(wctx, lreqs, lout)
		cut := writerCut(ctx, wctx)
		stop()
		for k, i := range local {
			out[i], retry[i] = n.settle(ctx, dsts[i], localAttempt(lout[k].Result, lout[k].Err, cut), forwarded)
		}
	}
	fwd.Wait()
	for _, i := range slow {
		retry[i] = retryNotStored
	}
	n.sendSlow(ctx, reqs, out, retry, forwarded)
}

// settle is an item's outcome (the router's one reading, outcome) as the
// batch keeps it: answered, or to send again one by one (sendSlow).
func (n *router) settle(ctx context.Context, dst ownership.Destination, a attempt, forwarded bool) (sequencer.SendOutcome, retryKind) {
	v := n.outcome(ctx, dst, a, false, forwarded)
	switch {
	case v.then == thenAnswer:
		return sequencer.SendOutcome{Result: v.res, Err: v.err}, retryNone
	case v.unknown:
		return sequencer.SendOutcome{Err: v.err}, retryUnknown // an attempt without an answer may have stored it
	}
	return sequencer.SendOutcome{Err: v.err}, retryNotStored
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
func (n *router) sendSlow(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome, retry []retryKind, forwarded bool) {
	var todo []int
	for i := range reqs {
		if retry[i] != retryNone {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
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
	byConversation(reqs, todo, func(idx []int) {
		var failed error
		c := reqs[idx[0]].ConvID
		last, hasLast := lastOK[c]
		for _, i := range idx {
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
	})
}

// byConversation runs run once per conversation of the items idx (indexes
// into reqs) with that conversation's indexes in their order, the
// conversations in parallel; it returns when all are done.
func byConversation(reqs []sequencer.SendRequest, idx []int, run func(idx []int)) {
	byConv := map[string][]int{}
	var order []string
	for _, i := range idx {
		c := reqs[i].ConvID
		if _, ok := byConv[c]; !ok {
			order = append(order, c)
		}
		byConv[c] = append(byConv[c], i)
	}
	if len(order) == 1 {
		run(byConv[order[0]])
		return
	}
	var wg sync.WaitGroup
	for _, c := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(byConv[c])
		}()
	}
	wg.Wait()
}
