package ownership

import (
	"fmt"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/membership"
)

// Way is where a send for a partition goes now.
type Way int

const (
	WayRefuse  Way = iota // the node does not serve (not started, left, superseded): final
	WayWait               // not writable anywhere yet (no owner, stepping down, not taken, moving): wait for a change
	WayLocal              // this node holds the partition: the local writer takes it
	WayForward            // another node owns it by the ring: forward to Owner
)

func (w Way) String() string { return [...]string{"refuse", "wait", "local", "forward"}[w] }

// Destination is the answer of Route.
type Destination struct {
	Way Way
	// Err says why for WayRefuse (wrapping sequencer.ErrShuttingDown) and
	// WayWait (wrapping sequencer.ErrNotOwner or ErrOwnershipMoving, both
	// retryable).
	Err error
	// Owner is the ring's owner of the partition (for WayForward, with the
	// address to dial in ClusterAddr).
	Owner     membership.Member
	Partition uint32
	Version   uint64 // the membership view's version
}

// Route answers where a send for partition p goes by the current view. It
// does not check the lease's freshness: Fence does that when the commit
// takes its fence.
func (c *Core) Route(p uint32) Destination {
	d := Destination{Partition: p, Version: c.view.Version}
	if c.phase == PhaseNew || c.phase == PhaseLeft || c.phase == PhaseSuperseded {
		d.Way = WayRefuse
		d.Err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrShuttingDown,
			fmt.Sprintf("cluster node %s is %s", c.cfg.NodeID, c.phase))
		return d
	}
	owner, ok := c.ring.Owner(p)
	if !ok {
		d.Way = WayWait
		d.Err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("no members in membership view %d", c.view.Version))
		return d
	}
	m, _ := c.view.Member(owner.NodeID)
	if m.NodeID == "" {
		m.NodeID = owner.NodeID
	}
	if m.ClusterAddr == "" {
		m.ClusterAddr = owner.Address
	}
	d.Owner = m
	if owner.NodeID != c.self.NodeID {
		d.Way = WayForward
		return d
	}
	d.Way = WayWait
	switch st := c.parts[p]; {
	case c.trouble != TroubleNone || c.phase == PhaseSteppingDown:
		d.Err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("node %s is stepping down", c.self.NodeID))
	case !st.Held:
		d.Err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("partition %d not taken yet by its owner %s", p, c.self.NodeID))
	case st.Moving:
		d.Err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrOwnershipMoving,
			fmt.Sprintf("partition %d is moving away from %s", p, c.self.NodeID))
	default:
		d.Way = WayLocal
	}
	return d
}

// Location is where a conversation's partition lives by this node's view.
type Location struct {
	NodeID            string // owner by the ring
	ClusterAddr       string // the owner's node-to-node address
	APIAddr           string // the owner's client API address ("" if it did not advertise one)
	Partition         uint32
	Epoch             uint64 // the owner's lease epoch if known (0: not taken yet or unknown)
	MembershipVersion uint64
}

// Locate answers where partition p lives by the current view: a retryable
// error wrapping sequencer.ErrNotOwner when the view has no members, and
// sequencer.ErrShuttingDown when the node does not serve.
func (c *Core) Locate(p uint32) (Location, error) {
	if c.phase == PhaseNew || c.phase == PhaseLeft {
		return Location{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrShuttingDown, "cluster node not running")
	}
	owner, ok := c.ring.Owner(p)
	if !ok {
		return Location{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("no members in membership view %d", c.view.Version))
	}
	loc := Location{NodeID: owner.NodeID, ClusterAddr: owner.Address, Partition: p, MembershipVersion: c.view.Version}
	m, _ := c.view.Member(owner.NodeID)
	loc.APIAddr = m.APIAddr
	switch {
	case owner.NodeID == c.self.NodeID && c.parts[p].Held:
		loc.Epoch = c.parts[p].Epoch
	default:
		if l, ok := c.view.Lease(p); ok && l.Owner != "" && l.Owner == m.Incarnation {
			loc.Epoch = l.Epoch
		}
	}
	return loc, nil
}
