package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/cluster/membership"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
	"github.com/sequencer-im/sequencer/ring"
)

// Location is where a conversation lives now, by this node's view.
type Location struct {
	NodeID            string // owner by the ring
	ClusterAddr       string // the owner's node-to-node address
	APIAddr           string // the owner's client API address ("" if it did not advertise one)
	Partition         uint32
	Epoch             uint64 // the owner's lease epoch if known (0: not taken yet or unknown)
	MembershipVersion uint64
}

// Locate answers where convID lives by the current view. It fails with a
// retryable error wrapping sequencer.ErrNotOwner when the view has no
// members, and sequencer.ErrShuttingDown after Leave.
func (n *Node) Locate(convID string) (Location, error) {
	p := ring.PartitionOf(convID, n.partitions)
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.phase == phaseNew || n.phase == phaseLeft {
		return Location{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrShuttingDown, "cluster node not running")
	}
	owner, ok := n.ring.Owner(p)
	if !ok {
		return Location{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("no members in membership view %d", n.view.Version))
	}
	loc := Location{NodeID: owner.NodeID, ClusterAddr: owner.Address, Partition: p, MembershipVersion: n.view.Version}
	m, _ := n.view.Member(owner.NodeID)
	loc.APIAddr = m.APIAddr
	switch {
	case owner.NodeID == n.self.NodeID && n.parts[p].held:
		loc.Epoch = n.parts[p].epoch
	default:
		if l, ok := n.view.Lease(p); ok && l.Owner != "" && l.Owner == m.Incarnation {
			loc.Epoch = l.Epoch
		}
	}
	return loc, nil
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
	return n.send(ctx, req, false)
}

// ownershipErr reports errors that mean "not written: the writer is
// elsewhere or changing"; sending again (same resend key) is safe.
func ownershipErr(err error) bool {
	return errors.Is(err, sequencer.ErrNotOwner) || errors.Is(err, sequencer.ErrOwnershipMoving) ||
		errors.Is(err, sequencer.ErrStaleEpoch)
}

// send routes req. A forwarded request is handled here or failed, never
// forwarded again.
func (n *Node) send(ctx context.Context, req sequencer.SendRequest, forwarded bool) (sequencer.SendResult, error) {
	p := ring.PartitionOf(req.ConvID, n.partitions)
	wait := time.NewTimer(n.cfg.HandoffWait)
	defer wait.Stop()
	backoff := 20 * time.Millisecond
	for {
		n.mu.RLock()
		ph, r, version, selfID, changed := n.phase, n.ring, n.view.Version, n.self.NodeID, n.changed
		st := n.parts[p]
		flagged := n.gone || n.fenced || n.superseded
		var ownerM membership.Member
		owner, hasOwner := r.Owner(p)
		if hasOwner {
			ownerM, _ = n.view.Member(owner.NodeID)
		}
		n.mu.RUnlock()

		var err error
		retryAfter := time.Duration(0) // 0: wait for a local change
		switch {
		case ph == phaseNew || ph == phaseLeft || ph == phaseSuperseded:
			return sequencer.SendResult{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrShuttingDown,
				fmt.Sprintf("cluster node %s is %s", n.cfg.NodeID, ph))
		case !hasOwner:
			err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
				fmt.Sprintf("no members in membership view %d", version))
		case owner.NodeID == selfID:
			switch {
			case flagged || ph == phaseSteppingDown:
				err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
					fmt.Sprintf("node %s is stepping down", selfID))
			case !st.held:
				err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
					fmt.Sprintf("partition %d not taken yet by its owner %s", p, selfID))
			case st.moving:
				err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrOwnershipMoving,
					fmt.Sprintf("partition %d is moving away from %s", p, selfID))
			default:
				res, lerr := n.local.Send(ctx, req)
				if lerr == nil || !ownershipErr(lerr) {
					return res, lerr
				}
				err = lerr
				retryAfter = backoff
			}
		case forwarded:
			return sequencer.SendResult{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
				fmt.Sprintf("forwarded send for partition %d reached %s, but its ring (version %d) names %s", p, selfID, version, owner.NodeID))
		default:
			if ownerM.ClusterAddr == "" {
				ownerM.ClusterAddr = owner.Address
			}
			res, ferr := n.forward(ctx, owner.NodeID, ownerM.ClusterAddr, req, version)
			if ferr == nil || !ownershipErr(ferr) {
				return res, ferr
			}
			err = ferr
			retryAfter = backoff // the owner's view may be ahead or behind ours
		}

		if werr := n.waitChange(ctx, changed, wait.C, retryAfter); werr != nil {
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

// forward sends req to the owner and waits for its answer.
func (n *Node) forward(ctx context.Context, ownerID, addr string, req sequencer.SendRequest, version uint64) (sequencer.SendResult, error) {
	timeout := n.cfg.ForwardTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if timeout <= 0 {
		return sequencer.SendResult{}, context.DeadlineExceeded
	}
	fctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg := &clusterv1.ForwardSend{
		ConvId:            req.ConvID,
		FromUid:           req.FromUID,
		ClientMsgId:       req.ClientMsgID,
		MsgType:           int32(req.MsgType),
		Body:              req.Body,
		FromNode:          n.cfg.NodeID,
		MembershipVersion: version,
		// The owner gives up a little earlier, so its answer (even "deadline
		// exceeded") arrives before this node stops waiting.
		TimeoutMs: uint32(max(timeout*9/10/time.Millisecond, 1)),
	}
	type result struct {
		reply *clusterv1.ForwardReply
		err   error
	}
	done := make(chan result, 1)
	go func() {
		reply, err := n.tr.Forward(fctx, addr, msg)
		done <- result{reply, err}
	}()
	// Wait for the reply; give up early if the owner drops out of the
	// membership (crashed: its reply will never come). Sending again is
	// safe: the resend key makes it idempotent.
	var reply *clusterv1.ForwardReply
	var err error
	for waiting := true; waiting; {
		n.mu.RLock()
		changed := n.changed
		_, member := n.view.Member(ownerID)
		n.mu.RUnlock()
		if !member {
			cancel()
			n.met.forward("owner_gone")
			return sequencer.SendResult{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
				fmt.Sprintf("node %s left the membership while a send was forwarded to it", ownerID))
		}
		select {
		case r := <-done:
			reply, err, waiting = r.reply, r.err, false
		case <-changed:
		}
	}
	if err != nil {
		n.met.forward("transport_error")
		if ctx.Err() != nil {
			return sequencer.SendResult{}, fmt.Errorf("forward to node %s: %w", ownerID, ctx.Err())
		}
		return sequencer.SendResult{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrUnknownOutcome,
			fmt.Sprintf("forward to node %s at %s", ownerID, addr)+": "+err.Error())
	}
	res, err := decodeReply(reply)
	if err != nil {
		n.met.forward(sequencer.ErrorCode(err).String())
	} else {
		n.met.forward("ok")
	}
	return res, err
}

// HandleForward implements Handler: a send forwarded by another node.
func (n *Node) HandleForward(ctx context.Context, req *clusterv1.ForwardSend) *clusterv1.ForwardReply {
	if req.TimeoutMs > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMs)*time.Millisecond)
		defer cancel()
	}
	res, err := n.send(ctx, sequencer.SendRequest{
		ConvID:      req.ConvId,
		FromUID:     req.FromUid,
		ClientMsgID: req.ClientMsgId,
		MsgType:     int16(req.MsgType),
		Body:        req.Body,
	}, true)
	reply := encodeReply(res, err)
	reply.NodeId = n.cfg.NodeID
	return reply
}

// SendBatch implements the API's Sender for a batch: every item is routed
// like Send. Items of one conversation are sent one after the other, in
// order (so their seqs follow item order); conversations run in parallel.
func (n *Node) SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome) {
	byConv := make(map[string][]int)
	var order []string
	for i := range reqs {
		c := reqs[i].ConvID
		if _, ok := byConv[c]; !ok {
			order = append(order, c)
		}
		byConv[c] = append(byConv[c], i)
	}
	var wg sync.WaitGroup
	for _, c := range order {
		idx := byConv[c]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, i := range idx {
				res, err := n.send(ctx, reqs[i], false)
				out[i] = sequencer.SendOutcome{Result: res, Err: err}
			}
		}()
	}
	wg.Wait()
}
