package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ownership"
	"github.com/sequencer-im/sequencer/ring"
)

// Location is where a conversation lives now, by this node's view.
type Location = ownership.Location

// Locate answers where convID lives by the current view. It fails with a
// retryable error wrapping sequencer.ErrNotOwner when the view has no
// members, and sequencer.ErrShuttingDown after Leave.
func (n *Node) Locate(convID string) (Location, error) {
	p := ring.PartitionOf(convID, n.partitions)
	now := n.clk.Now()
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.core.Locate(p, now)
}

// Route implements sequencer.Router: the owner of convID by this node's view,
// with its API address, the partition, the owner's lease epoch (0 while the
// owner has not taken the lease yet) and the membership version.
func (n *Node) Route(ctx context.Context, convID string) (sequencer.Route, error) {
	loc, err := n.Locate(convID)
	if err != nil {
		return sequencer.Route{}, err
	}
	return sequencer.Route{NodeID: loc.NodeID, Address: loc.APIAddr, Partition: loc.Partition, Epoch: loc.Epoch,
		MembershipVersion: loc.MembershipVersion}, nil
}

// Send implements the API's Sender: it stores req on the node that owns its
// conversation, here (the local writer) or forwarded to the owner by the
// ring. While the partition is moving or not yet taken by its new owner, it
// waits up to HandoffWait for the handoff, then fails with a retryable
// error; the client resends with the same client_msg_id.
func (n *Node) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	return n.send(ctx, req, false, false)
}

// ownershipErr reports errors that mean "not written: the writer is
// elsewhere or changing"; sending again (same resend key) is safe.
func ownershipErr(err error) bool {
	return errors.Is(err, sequencer.ErrNotOwner) || errors.Is(err, sequencer.ErrOwnershipMoving) ||
		errors.Is(err, sequencer.ErrStaleEpoch)
}

// send routes req. A forwarded request is handled here or failed, never
// forwarded again.
//
// A forward that gets no answer (transport error, the owner dropped out of
// the membership, the owner gave up for lack of time) is not an answer: the
// forwarder sends it again, with the same client_msg_id (idempotent), to the
// current owner until an answer comes or ctx ends (bounded by ForwardTimeout
// when ctx has no deadline); then the error is ctx's (canceled or deadline
// exceeded: the outcome is unknown). When the route no longer names another
// node (a takeover), the forwarder hands it back and it goes the local way.
// When the link to the owner makes no progress, the answer is at once
// deadline_exceeded (outcome unknown), so that the client re-routes.
// Ownership errors (the partition is moving or not taken yet) are retried
// within HandoffWait; their final answer is the retryable error (nothing was
// stored).
//
// After a forward without an answer (or when unknownBefore: the caller's
// earlier attempt got none), no retryable error answers the send any more
// (the earlier attempt may have stored it): only a result, a final error or
// the end of ctx does. An answer that says duplicate may be this
// node's own resend finding the first attempt stored: the client did not
// resend, so the answer says duplicate: false (the ids are the stored ones
// either way; docs/API.md "duplicate").
func (n *Node) send(ctx context.Context, req sequencer.SendRequest, forwarded, unknownBefore bool) (sequencer.SendResult, error) {
	if !forwarded {
		// This node's own bound (the caller's deadline when sooner): a send
		// it cannot place is answered by then, deadline_exceeded (outcome
		// unknown: the client resends with the same key), never held.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.ForwardTimeout)
		defer cancel()
	}
	p := ring.PartitionOf(req.ConvID, n.partitions)
	// The handoff wait and the retry backoff (waitChange) are this request's
	// own time, like its deadline (ctx), which runs on real time: they use
	// time.Timer, not the node's clock. The node's loops (heartbeat,
	// reconciliation, Leave's wait) run on the clock; the simulation's sends
	// run while its fake clock stands still.
	wait := time.NewTimer(n.cfg.HandoffWait)
	defer wait.Stop()
	backoff := 20 * time.Millisecond
	for {
		// The route: local, forwarded, or wait for a change. The local
		// writer asks for the fence again when it commits (Fence); the
		// store checks that fence in the commit's transaction.
		now := n.clk.Now()
		n.mu.RLock()
		dst, changed := n.core.Dispatch(p, now), n.changed
		var cutOff error
		if dst.Way == ownership.WayLocal || (dst.Way == ownership.WayWait && dst.Owner.NodeID == n.cfg.NodeID) {
			// The node part of the one predicate: could this node write
			// anything now (member, not in trouble, lease renewed)?
			cutOff = n.core.NodeWritable(now)
		}
		n.mu.RUnlock()
		if cutOff != nil && !unknownBefore {
			// This node would write the partition but cannot (its membership
			// lease is not renewed, it is stepping down or in trouble): no
			// wait here ends sooner than the store answering again, so say
			// so at once and let the client go to the next owner. Nothing
			// was tried: the error is final.
			return sequencer.SendResult{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
				fmt.Sprintf("node %s cannot write partition %d now: %v", n.cfg.NodeID, p, cutOff))
		}

		var err error
		retryAfter := time.Duration(0) // 0: wait for a local change
		switch dst.Way {
		case ownership.WayRefuse:
			return sequencer.SendResult{}, unknownIf(unknownBefore, dst.Err)
		case ownership.WayWait:
			err = dst.Err
		case ownership.WayLocal:
			wctx, stop := n.writerCtx(ctx)
			res, lerr := n.local.Send(wctx, req)
			cut := writerCut(ctx, wctx)
			stop()
			if lerr != nil && cut {
				// This node can write nothing any more (cut from the store):
				// its attempt has an unknown outcome; the route goes on, to
				// the partition's next owner once it took over.
				unknownBefore = true
				continue
			}
			if lerr == nil || !ownershipErr(lerr) && !(unknownBefore && sequencer.ErrorCode(lerr).Retryable()) {
				return ownResend(res, unknownBefore), lerr
			}
			err = lerr
			retryAfter = backoff
		case ownership.WayForward:
			if forwarded {
				// Not forwarded again. After this node's own attempt got no
				// answer (its writer was cut), the answer must say so: the
				// sender takes a retryable error as "not stored".
				return sequencer.SendResult{}, unknownIf(unknownBefore, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
					fmt.Sprintf("forwarded send for partition %d reached %s, but its ring (version %d) names %s", p, n.cfg.NodeID, dst.Version, dst.Owner.NodeID)))
			}
			if rtt, slow := n.fwd.linkSlow(dst.Owner.ClusterAddr); slow && !unknownBefore && sequencer.FollowsRedirects(ctx) && dst.Owner.APIAddr != "" {
				// The client reaches the owner faster itself: not sent.
				return sequencer.SendResult{}, elsewhere(dst.Owner, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
					fmt.Sprintf("the cluster link to node %s is slow (%v per forward); not sent", dst.Owner.NodeID, rtt.Round(time.Millisecond))))
			}
			o := n.fwd.send(ctx, req, fwdRoute{remote: true, addr: dst.Owner.ClusterAddr, owner: dst.Owner.NodeID})
			unknownBefore = unknownBefore || o.resent
			switch o.kind {
			case fwdAnswered:
				if o.err == nil || !unknownBefore || !sequencer.ErrorCode(o.err).Retryable() {
					return ownResend(o.res, unknownBefore), o.err
				}
				// A retryable error after an attempt with no answer: that
				// attempt may have stored it, so this is no final answer.
				err = o.err
				retryAfter = backoff
			case fwdUnreachable:
				// The owner's link is down (a probe went unanswered): not
				// sent. Say so at once and let the client go elsewhere;
				// after an attempt without an answer, the outcome is
				// unknown (deadline_exceeded), never "not stored".
				if unknownBefore {
					return sequencer.SendResult{}, elsewhere(dst.Owner, sequencer.Wrap(sequencer.CodeDeadlineExceeded,
						fmt.Errorf("%w: %w", context.DeadlineExceeded, errLinkStalled), o.err.Error()+"; an earlier attempt's outcome is unknown"))
				}
				return sequencer.SendResult{}, elsewhere(dst.Owner, o.err)
			case fwdRetry:
				if dst.Successor && !unknownBefore {
					// This node cannot write, and the next owner has not
					// taken the partition over yet (or could not be
					// reached): nothing was stored; say so at once.
					return sequencer.SendResult{}, o.err
				}
				err = o.err
				retryAfter = backoff // the owner's view may be ahead or behind ours
			case fwdNoAnswer:
				switch {
				case o.stalled:
					// The link to the owner makes no progress: outcome
					// unknown (deadline_exceeded, never an error that says
					// "not stored"); the client re-routes and resends.
					return sequencer.SendResult{}, elsewhere(dst.Owner, o.err)
				case ctx.Err() != nil:
					return sequencer.SendResult{}, fmt.Errorf("forward to node %s: %w (%v)", dst.Owner.NodeID, ctx.Err(), o.err)
				}
				// Handed back by the forwarder: the route no longer names
				// another node (a takeover: this node may be the owner now).
				// The handoff wait starts over: the conversation is moving.
				unknownBefore = true
				wait.Reset(n.cfg.HandoffWait)
				continue
			}
		}

		waitOver := wait.C
		if unknownBefore {
			// An earlier attempt may have stored it: an error now would
			// say "not stored, ever". Only an answer or ctx ends this.
			waitOver = nil
		}
		if werr := n.waitChange(ctx, changed, waitOver, retryAfter); werr != nil {
			if errors.Is(werr, errHandoffWait) {
				return sequencer.SendResult{}, err
			}
			return sequencer.SendResult{}, fmt.Errorf("%w (while waiting: %v)", werr, err)
		}
		if retryAfter > 0 {
			backoff = min(2*backoff, 500*time.Millisecond)
		}
	}
}

var errHandoffWait = errors.New("handoff wait over")

// unknownIf answers err, or, when an earlier attempt of this send got no
// answer (it may have stored it), deadline_exceeded (outcome unknown): a
// retryable error says "not stored", which would be a guess. Found by the
// availability run (db-answers-lost on n1, a raw client's send forwarded
// to n1): n1's writer was cut mid-commit, the commit had landed, and n1
// answered the forward "unavailable" (its ring named another owner by then).
func unknownIf(unknownBefore bool, err error) error {
	if !unknownBefore || !sequencer.ErrorCode(err).Retryable() {
		return err
	}
	return sequencer.Wrap(sequencer.CodeDeadlineExceeded, context.DeadlineExceeded,
		err.Error()+"; an earlier attempt's outcome is unknown")
}

// elsewhere marks err (a forward that did not reach owner) with the
// owner's client address, so the API edge can send the client there: the
// cut may be between the nodes only.
func elsewhere(owner membership.Member, err error) error {
	if owner.APIAddr == "" {
		return err
	}
	return &sequencer.OwnerElsewhere{NodeID: owner.NodeID, Addr: owner.APIAddr, Err: err}
}

// ownResend clears Duplicate on the answer to a resend this node made on its
// own (an earlier attempt of the same call got no answer): the client sent
// the message once.
func ownResend(res sequencer.SendResult, resentByNode bool) sequencer.SendResult {
	if resentByNode {
		res.Duplicate = false
	}
	return res
}

// waitChange waits for a change of the node's state (changed closed), for
// retryAfter when > 0, for the end of the handoff wait (errHandoffWait) or
// of ctx (its error).
func (n *Node) waitChange(ctx context.Context, changed <-chan struct{}, waitOver <-chan time.Time, retryAfter time.Duration) error {
	var retry <-chan time.Time
	if retryAfter > 0 {
		t := time.NewTimer(retryAfter)
		defer t.Stop()
		retry = t.C
	}
	select {
	case <-changed:
	case <-retry:
	case <-waitOver:
		return errHandoffWait
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// MembershipVersion is the version of the membership view this node routes
// by (api.MembershipViewer: every Send answer carries it, so a client's
// cached owners learned under an older view are asked again).
func (n *Node) MembershipVersion() uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.core.View().Version
}
