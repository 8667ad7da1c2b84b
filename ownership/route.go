package ownership

import (
	"fmt"
	"time"

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
	// Successor: the ring names this node, but it can write nothing now
	// (NodeWritable fails: its lease is not renewed, it is in trouble or
	// stepping down), so the send is forwarded to the partition's next
	// owner, the ring's owner without this node: the node that takes the
	// partition once this one is presumed dead. Until it has, it answers
	// not-owner (retryable, nothing stored); Err is this node's reason.
	Successor bool
	// Cut: the ring names this node, but it can write nothing now
	// (NodeWritable fails; Err says why). With no successor to forward to,
	// the send gets that answer at once instead of a wait (a router need
	// not ask the core a second time).
	Cut bool
}

// Dispatch answers where a send for partition p goes at now by the current
// view: refused when the node serves nothing; forwarded when the ring names
// another owner; local exactly when the ring names this node and Writable
// gives a fence; else wait (with Writable's reason).
func (c *Core) Dispatch(p uint32, now time.Time) Destination {
	d := Destination{Partition: p, Version: c.view.Version}
	if err := c.refusal(); err != nil {
		d.Way, d.Err = WayRefuse, err
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
	d.Way = WayLocal
	// Writable's two parts, each asked once: the node's, then the
	// partition's.
	if err := c.NodeWritable(now); err != nil {
		d.Way, d.Err, d.Cut = WayWait, err, true
		if m, ok := c.nextOwner(p); ok {
			d.Way, d.Owner, d.Successor = WayForward, m, true
		}
	} else if _, err := c.partWritable(p); err != nil {
		d.Way, d.Err = WayWait, err
	}
	return d
}

// successor is the owner of p by the ring without this node, when this
// node can write nothing now (NodeWritable fails) and the view names
// another node: where a send of a partition of this node goes while it is
// cut from the store (Dispatch).
func (c *Core) successor(p uint32, now time.Time) (membership.Member, bool) {
	if c.NodeWritable(now) == nil {
		return membership.Member{}, false
	}
	return c.nextOwner(p)
}

// nextOwner is the owner of p by the ring without this node.
func (c *Core) nextOwner(p uint32) (membership.Member, bool) {
	next, ok := c.next.Owner(p)
	if !ok {
		return membership.Member{}, false
	}
	m, _ := c.view.Member(next.NodeID)
	if m.NodeID == "" {
		m.NodeID = next.NodeID
	}
	if m.ClusterAddr == "" {
		m.ClusterAddr = next.Address
	}
	return m, true
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

// Locate answers where partition p lives by the current view at now: a
// retryable error wrapping sequencer.ErrNotOwner when the view has no
// members, and sequencer.ErrShuttingDown when the node serves nothing (as
// Route refuses). The epoch is this node's fence when it is the owner and
// Writable, else the view's lease of the owner's incarnation.
func (c *Core) Locate(p uint32, now time.Time) (Location, error) {
	if err := c.refusal(); err != nil {
		return Location{}, err
	}
	owner, ok := c.ring.Owner(p)
	if !ok {
		return Location{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("no members in membership view %d", c.view.Version))
	}
	loc := Location{NodeID: owner.NodeID, ClusterAddr: owner.Address, Partition: p, MembershipVersion: c.view.Version}
	m, _ := c.view.Member(owner.NodeID)
	if owner.NodeID == c.self.NodeID {
		f, err := c.Writable(p, now)
		if err == nil {
			loc.APIAddr, loc.Epoch = m.APIAddr, f.Epoch
			return loc, nil
		}
		next, ok := c.successor(p, now)
		if !ok {
			loc.APIAddr = m.APIAddr
			return loc, nil
		}
		// Where Dispatch sends it: the next owner (see Successor).
		m = next
		loc.NodeID, loc.ClusterAddr = m.NodeID, m.ClusterAddr
	}
	loc.APIAddr = m.APIAddr
	if l, ok := c.view.Lease(p); ok && l.Owner != "" && l.Owner == m.Incarnation {
		loc.Epoch = l.Epoch
	}
	return loc, nil
}
