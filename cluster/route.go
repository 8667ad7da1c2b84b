package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ownership"
	"github.com/sequencer-im/sequencer/ring"
)

// router is the routing job of a node: it sends each request where the
// ownership core's Dispatch says (the local writer, or the owner through the
// forwarder), and reads every attempt's result into the client's outcome in
// one place (outcome).
type router struct {
	*member
	fwd *forwarder // queues and batches the sends owned by other nodes
	// wall is the requests' own time (the handoff wait and the retry
	// backoff), real time like their deadlines (ctx), not the node's clock:
	// the node's loops (heartbeat, reconciliation, Leave's wait) run on the
	// clock, and the simulation's sends run while its fake clock stands
	// still.
	wall clock.Clock
}

// newRouter builds the router of m, with its forwarder.
func newRouter(m *member) *router {
	r := &router{member: m, wall: clock.Real{}}
	r.fwd = newForwarder(forwarderDeps{
		clk:      m.cfg.Clock,
		forward:  m.tr.Forward,
		route:    r.fwdRoute,
		member:   m.isMember,
		self:     m.whoami,
		suspect:  m.suspect,
		refused:  m.peerRefused,
		met:      m.met,
		timeout:  m.cfg.ForwardTimeout,
		slowLink: m.cfg.SlowLink,
	})
	if p, ok := m.tr.(Prober); ok {
		r.fwd.probe = p.Probe
	}
	return r
}

// Location is where a conversation lives now, by this node's view.
type Location = ownership.Location

// locate answers where convID lives by the current view. It fails with a
// retryable error wrapping sequencer.ErrNotOwner when the view has no
// members, and sequencer.ErrShuttingDown after Leave.
func (n *router) locate(convID string) (Location, error) {
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
	loc, err := n.locate(convID)
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
// error; the client resends with the same client_msg_id. A send whose ctx
// says an earlier attempt's outcome is unknown (sequencer.EarlierOutcomeUnknown: a
// node redirected it here after its forward got no answer) is never
// answered with a retryable error.
func (n *Node) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	return n.send(ctx, req, false, sequencer.EarlierOutcomeUnknown(ctx))
}

// ownershipErr reports errors that mean "not written: the writer is
// elsewhere or changing"; sending again (same resend key) is safe.
func ownershipErr(err error) bool {
	return errors.Is(err, sequencer.ErrNotOwner) || errors.Is(err, sequencer.ErrOwnershipMoving) ||
		errors.Is(err, sequencer.ErrStaleEpoch)
}

// dispatch asks the core where a send for partition p goes now (its one
// write check for routing: ownership.Core.Dispatch), with the channel closed
// at the core's next change.
func (n *router) dispatch(p uint32) (ownership.Destination, <-chan struct{}) {
	now := n.clk.Now()
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.core.Dispatch(p, now), n.changed
}

// attempt is the result of one try of a send: in the local writer, or
// through the forwarder (fwd); the zero attempt is none made.
type attempt struct {
	local     bool                 // the local writer's answer: res, err and cut
	forwarded bool                 // the forwarder's outcome: fwd
	res       sequencer.SendResult // local
	err       error                // local
	cut       bool                 // local: the writer gave up because this node could write nothing (writerCtx)
	fwd       fwdOutcome
}

// localAttempt and fwdAttempt are the attempts made in the local writer and
// through the forwarder.
func localAttempt(res sequencer.SendResult, err error, cut bool) attempt {
	return attempt{local: true, res: res, err: err, cut: cut}
}
func fwdAttempt(o fwdOutcome) attempt { return attempt{forwarded: true, fwd: o} }

// then is what the router does after an outcome.
type then uint8

const (
	thenAnswer  then = iota // final: answer the client with res and err
	thenRetry               // no answer: route again at the core's next change, after the backoff when backoff is set, or until the handoff wait ends
	thenReroute             // no answer: route again at once (handed back by the forwarder, or cut from the local writer)
)

// verdict is the client's outcome of a send after one Dispatch answer and
// its attempt (outcome).
type verdict struct {
	then    then
	res     sequencer.SendResult
	err     error // the answer (thenAnswer), or the reason of the retry
	unknown bool  // an attempt may have stored it: no error that says "not stored" may answer it any more
	backoff bool  // thenRetry: wait the backoff (the answer came from a writer, whose view may differ)
}

// outcome is the ONE reading of Dispatch's answer dst and of the attempt
// made by it (a: the zero attempt when none was made: refuse, wait, or a
// forwarded item this node does not own) into the client's outcome. unknownBefore: an
// earlier attempt got no answer (it may have stored the message); forwarded:
// the request came from another node (handled here or failed, never
// forwarded again). Send and SendBatch both route by it.
func (n *router) outcome(ctx context.Context, dst ownership.Destination, a attempt, unknownBefore, forwarded bool) verdict {
	v := verdict{unknown: unknownBefore}
	switch {
	case dst.Way == ownership.WayRefuse:
		return verdict{err: unknownIf(unknownBefore, dst.Err), unknown: unknownBefore}
	case dst.Way == ownership.WayWait && dst.Cut && !unknownBefore:
		// This node would write the partition but cannot (its membership
		// lease is not renewed, it is stepping down or in trouble): no
		// wait here ends sooner than the store answering again, so say
		// so at once and let the client go to the next owner. Nothing
		// was tried: the error is final.
		return verdict{err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("node %s cannot write partition %d now: %v", n.cfg.NodeID, dst.Partition, dst.Err))}
	case dst.Way == ownership.WayWait:
		v.then, v.err = thenRetry, dst.Err
		return v
	case dst.Way == ownership.WayForward && forwarded:
		// Not forwarded again. After this node's own attempt got no answer
		// (its writer was cut), the answer must say so: the sender takes a
		// retryable error as "not stored".
		return verdict{err: unknownIf(unknownBefore, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("forwarded send for partition %d reached %s, but its ring (version %d) names %s", dst.Partition, n.cfg.NodeID, dst.Version, dst.Owner.NodeID))),
			unknown: unknownBefore}
	case !a.local && !a.forwarded: // no attempt
		v.then, v.err = thenRetry, dst.Err
		return v
	case a.local:
		switch {
		case a.err != nil && a.cut:
			// This node can write nothing any more (cut from the store):
			// its attempt has an unknown outcome; the route goes on, to
			// the partition's next owner once it took over.
			v.then, v.err, v.unknown = thenReroute, a.err, true
		case a.err == nil || !ownershipErr(a.err) && !(unknownBefore && sequencer.ErrorCode(a.err).Retryable()):
			v.res, v.err = ownResend(a.res, unknownBefore), a.err
		default:
			v.then, v.err, v.backoff = thenRetry, a.err, true
		}
		return v
	}
	o := a.fwd
	v.unknown = unknownBefore || o.resent
	switch o.kind {
	case fwdAnswered:
		if o.err == nil || !v.unknown || !sequencer.ErrorCode(o.err).Retryable() {
			v.res, v.err = ownResend(o.res, v.unknown), o.err
			return v
		}
		// A retryable error after an attempt with no answer: that
		// attempt may have stored it, so this is no final answer.
		v.then, v.err, v.backoff = thenRetry, o.err, true
	case fwdUnreachable:
		// The owner's link is down (a probe went unanswered): not sent.
		// Say so at once and let the client go elsewhere; after an
		// attempt without an answer, the outcome is unknown
		// (deadline_exceeded), never "not stored".
		v.err = o.err
		if v.unknown {
			v.err = sequencer.Wrap(sequencer.CodeDeadlineExceeded,
				fmt.Errorf("%w: %w", context.DeadlineExceeded, errLinkStalled), o.err.Error()+"; an earlier attempt's outcome is unknown")
		}
		v.err = elsewhere(dst.Owner, v.err)
	case fwdRetry:
		if dst.Successor && !v.unknown {
			// This node cannot write, and the next owner has not taken
			// the partition over yet (or could not be reached): nothing
			// was stored; say so at once.
			v.err = o.err
			return v
		}
		v.then, v.err, v.backoff = thenRetry, o.err, true // the owner's view may be ahead or behind ours
	case fwdNoAnswer:
		switch {
		case o.stalled:
			// The link to the owner makes no progress: outcome unknown
			// (deadline_exceeded, never an error that says "not
			// stored"); the client re-routes and resends.
			v.err = elsewhere(dst.Owner, o.err)
		case ctx.Err() != nil:
			v.err = fmt.Errorf("forward to node %s: %w (%v)", dst.Owner.NodeID, ctx.Err(), o.err)
		default:
			// Handed back by the forwarder: the route no longer names
			// another node (a takeover: this node may be the owner now).
			v.then, v.err, v.unknown = thenReroute, o.err, true
		}
	}
	return v
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
// either way; docs/API.md "duplicate"). Every answer is outcome's.
func (n *router) send(ctx context.Context, req sequencer.SendRequest, forwarded, unknownBefore bool) (sequencer.SendResult, error) {
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
	// own time (n.wall), like its deadline (ctx).
	wait, waitC := n.wall.NewTimer(n.cfg.HandoffWait)
	defer wait.Stop()
	backoff := 20 * time.Millisecond
	for {
		// The route: local, forwarded, or wait for a change. The local
		// writer asks for the fence again when it commits (Fence); the
		// store checks that fence in the commit's transaction.
		dst, changed := n.dispatch(p)
		var a attempt
		switch {
		case dst.Way == ownership.WayLocal:
			wctx, stop := n.writerCtx(ctx)
			res, err := n.local.Send(wctx, req)
			a = localAttempt(res, err, writerCut(ctx, wctx))
			stop()
		case dst.Way == ownership.WayForward && !forwarded:
			o, slow := n.slowLink(ctx, dst, unknownBefore)
			if !slow {
				o = n.fwd.send(ctx, req, fwdRoute{remote: true, addr: dst.Owner.ClusterAddr, owner: dst.Owner.NodeID})
			}
			a = fwdAttempt(o)
		}
		v := n.outcome(ctx, dst, a, unknownBefore, forwarded)
		unknownBefore = v.unknown
		switch v.then {
		case thenAnswer:
			return v.res, v.err
		case thenReroute:
			// An attempt without an answer: from now on no wait ends it
			// (unknownBefore), only an answer or ctx.
			continue
		}
		retryAfter := time.Duration(0) // 0: wait for a local change
		if v.backoff {
			retryAfter = backoff
		}
		waitOver := waitC
		if unknownBefore {
			// An earlier attempt may have stored it: an error now would
			// say "not stored, ever". Only an answer or ctx ends this.
			waitOver = nil
		}
		if werr := n.waitChange(ctx, changed, waitOver, retryAfter); werr != nil {
			if errors.Is(werr, errHandoffWait) {
				return sequencer.SendResult{}, v.err
			}
			return sequencer.SendResult{}, fmt.Errorf("%w (while waiting: %v)", werr, v.err)
		}
		if retryAfter > 0 {
			backoff = min(2*backoff, 500*time.Millisecond)
		}
	}
}

var errHandoffWait = errors.New("handoff wait over")

// slowLink answers a send from a client that follows redirects
// (sequencer.FollowsRedirects) as unreachable, not sent, when the link to
// dst's owner is slower than Config.SlowLink: the client reaches the owner
// faster itself (outcome then names it). Not after an attempt without an
// answer, and only for an owner with a client address.
func (n *router) slowLink(ctx context.Context, dst ownership.Destination, unknownBefore bool) (fwdOutcome, bool) {
	if unknownBefore || dst.Owner.APIAddr == "" || !sequencer.FollowsRedirects(ctx) {
		return fwdOutcome{}, false
	}
	rtt, slow := n.fwd.linkSlow(dst.Owner.ClusterAddr)
	if !slow {
		return fwdOutcome{}, false
	}
	return fwdOutcome{kind: fwdUnreachable, err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
		fmt.Sprintf("the cluster link to node %s is slow (%v per forward); not sent", dst.Owner.NodeID, rtt.Round(time.Millisecond)))}, true
}

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
func (n *router) waitChange(ctx context.Context, changed <-chan struct{}, waitOver <-chan time.Time, retryAfter time.Duration) error {
	var retry <-chan time.Time
	if retryAfter > 0 {
		t, c := n.wall.NewTimer(retryAfter)
		defer t.Stop()
		retry = c
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

// fwdRoute is the forwarder's route function: where convID's sends go now
// by the ownership core (another node: forwarded; else the local way), and
// the channel closed at the core's next change.
func (n *router) fwdRoute(convID string) (fwdRoute, <-chan struct{}) {
	p := ring.PartitionOf(convID, n.partitions)
	now := n.clk.Now()
	n.mu.RLock()
	defer n.mu.RUnlock()
	d := n.core.Dispatch(p, now)
	return fwdRoute{remote: d.Way == ownership.WayForward, addr: d.Owner.ClusterAddr, owner: d.Owner.NodeID}, n.changed
}

// MembershipVersion is the version of the membership view this node routes
// by (api.MembershipViewer: every Send answer carries it, so a client's
// cached owners learned under an older view are asked again).
func (n *Node) MembershipVersion() uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.core.View().Version
}
