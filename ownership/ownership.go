// Package ownership is the pure state machine of one cluster node's right to
// write: its membership (joined, renewed, presumed dead, superseded,
// leaving), the ring built from its membership view, and the partitions it
// holds (held at an epoch, moving away). It is to package cluster what
// conv.Core is to package actor.
//
// It does no I/O, starts no goroutine and reads no clock. The shell (package
// cluster) tells it what happened, with the local time where time matters
// (Joined, Renewed, RenewFailed, Released, Acquired, Refused, ...), asks it
// what one reconcile round must do (Next) and carries that out against the
// membership table and the conversations, and asks it the one question "may
// this node write partition p now" (Writable: the fence to carry, or the
// reason not), from which where a send goes (Dispatch), who owns a
// conversation (Locate) and readiness (Serving) are derived. Its stories
// are in testdata/*.txt.
//
// The core never decides that a commit is safe: the store checks the fence of
// every commit (sequencer.Fence) against the shared lease table, which is
// where safety lives. The core's answers are what keep a node from trying
// when it knows it would be refused, and from serving when it cannot know.
package ownership

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ring"
)

// Phase is where a node is in its life.
type Phase int

const (
	PhaseNew          Phase = iota // not joined yet
	PhaseActive                    // a member: following the ring
	PhaseSteppingDown              // partitions dropped; rejoining as a new incarnation
	PhaseSuperseded                // another live process holds the node id: out for good
	PhaseLeaving                   // graceful leave: handing everything off
	PhaseLeft                      // left or halted: serves nothing
)

func (p Phase) String() string {
	return [...]string{"new", "active", "stepping-down", "superseded", "leaving", "left"}[p]
}

// Trouble is why an active node must step down.
type Trouble int

const (
	TroubleNone       Trouble = iota
	TroubleGone               // our member row expired or was removed: presumed dead
	TroubleFenced             // a commit was refused for a stale fence of ours
	TroubleLost               // the view shows a partition we hold at a newer epoch
	TroubleSuperseded         // another live process holds our node id
)

func (t Trouble) String() string {
	return [...]string{"none", "presumed dead (member row expired)", "fenced (a partition was taken over)",
		"partitions taken over", "superseded by another process with its node id"}[t]
}

// Part is what the node knows of one partition.
type Part struct {
	Held       bool   // this incarnation holds the lease at Epoch
	HandingOff bool   // being handed off: no new fences; released next
	Epoch      uint64 // valid while Held
}

// Config is what the core needs to know of its node.
type Config struct {
	NodeID string
	// Ring places partitions (its Partitions is the fixed count).
	Ring ring.Config
	// MemberTTL is how long a membership lease lives without renewal: a
	// node that has not renewed for longer may already be presumed dead,
	// so it must not write.
	MemberTTL time.Duration
}

// Core is one node's ownership state. It is not safe for concurrent use: the
// shell serializes calls (package cluster holds a mutex around it).
type Core struct {
	cfg        Config
	partitions int

	phase   Phase
	trouble Trouble
	self    membership.Member // NodeID, Incarnation, addresses
	view    membership.View
	ring    *ring.Ring
	// next is the ring of the view without this node: who takes this
	// node's partitions once it is presumed dead (see Dispatch).
	next    *ring.Ring
	parts   []Part
	renewed time.Time // local clock: when the last successful renewal (or join) was sent
	beatErr error     // the last failed renewal, nil after a success
	drained bool      // an operator's drain was seen (reported once)
	changes uint64    // bumped on every change of view, phase, trouble or parts
}

// New returns the core of a node that has not joined yet. self carries the
// node's id, addresses and version; its Incarnation is set by Joined.
func New(cfg Config, self membership.Member) (*Core, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("ownership: NodeID is required")
	}
	if cfg.MemberTTL <= 0 {
		return nil, errors.New("ownership: MemberTTL must be > 0")
	}
	empty, err := ring.New(nil, cfg.Ring)
	if err != nil {
		return nil, fmt.Errorf("ownership: %w", err)
	}
	self.NodeID = cfg.NodeID
	self.Partitions = empty.Partitions()
	return &Core{cfg: cfg, partitions: empty.Partitions(), self: self, ring: empty, next: empty,
		parts: make([]Part, empty.Partitions())}, nil
}

// Partitions is the fixed partition count.
func (c *Core) Partitions() int { return c.partitions }

// Phase is the node's phase.
func (c *Core) Phase() Phase { return c.phase }

// Trouble is why the node must step down (TroubleNone if it need not).
func (c *Core) Trouble() Trouble { return c.trouble }

// Self is this node's member record (its current incarnation once joined).
func (c *Core) Self() membership.Member { return c.self }

// View is the newest membership view adopted.
func (c *Core) View() membership.View { return c.view }

// Ring is the ring of the current view.
func (c *Core) Ring() *ring.Ring { return c.ring }

// Part is what the node knows of partition p.
func (c *Core) Part(p uint32) Part { return c.parts[p] }

// RenewedAt is the local time the last successful renewal (or join) was
// sent.
func (c *Core) RenewedAt() time.Time { return c.renewed }

// Changes counts the changes so far: the shell wakes its waiters when it
// moved.
func (c *Core) Changes() uint64 { return c.changes }

func (c *Core) changed() { c.changes++ }

// Held counts the partitions held.
func (c *Core) Held() int {
	n := 0
	for _, st := range c.parts {
		if st.Held {
			n++
		}
	}
	return n
}

// HeldLeases returns the leases held, in partition order.
func (c *Core) HeldLeases() []membership.PartitionLease {
	var ls []membership.PartitionLease
	for i, st := range c.parts {
		if st.Held {
			ls = append(ls, membership.PartitionLease{Partition: uint32(i), Owner: c.self.Incarnation, Epoch: st.Epoch})
		}
	}
	return ls
}

// Events.

// Joined records that the membership table accepted self as a new
// incarnation and answered view v; sent is the local time the join was sent
// (the lease is proven from then on for MemberTTL). It clears every trouble.
func (c *Core) Joined(self membership.Member, v membership.View, sent time.Time) {
	c.self = self
	c.trouble, c.beatErr = TroubleNone, nil
	clear(c.parts)
	c.phase = PhaseActive
	c.adopt(v, sent)
	c.changed()
}

// JoinSuperseded records that a rejoin was refused because another live
// process holds the node id: the next round steps down for good.
func (c *Core) JoinSuperseded() {
	if c.trouble != TroubleSuperseded {
		c.trouble = TroubleSuperseded
		c.changed()
	}
}

// Renewed records a successful renewal of incarnation's lease answering v,
// sent at sent. It reports drain when this answer is the first to show our
// own row marked leaving by someone else (an operator's drain): the shell
// should then leave gracefully.
func (c *Core) Renewed(incarnation string, v membership.View, sent time.Time) (drain bool) {
	if incarnation != c.self.Incarnation {
		return false // rejoined meanwhile
	}
	c.beatErr = nil
	c.adopt(v, sent)
	if m, ok := v.Member(c.self.NodeID); ok && m.Leaving && m.Incarnation == c.self.Incarnation &&
		c.phase == PhaseActive && !c.drained {
		c.drained = true
		return true
	}
	return false
}

// RenewFailed records a failed renewal of incarnation's lease. It reports
// whether the node is now in trouble (the shell should reconcile at once);
// other errors are remembered for Ready and change nothing else.
func (c *Core) RenewFailed(incarnation string, err error) (trouble bool) {
	if incarnation != c.self.Incarnation {
		return false
	}
	var t Trouble
	switch {
	case errors.Is(err, membership.ErrSuperseded):
		t = TroubleSuperseded
	case errors.Is(err, membership.ErrMemberGone):
		t = TroubleGone
	default:
		c.beatErr = err
		return false
	}
	if c.trouble == TroubleNone || t == TroubleSuperseded {
		c.trouble = t
	}
	c.changed()
	return true
}

// Observed adopts a view read outside a renewal (it proves nothing about our
// own lease).
func (c *Core) Observed(v membership.View) { c.adopt(v, time.Time{}) }

// adopt takes v unless it is older than the current view and rebuilds the
// ring when the version changed. sent (when later than the last one) is the
// local time the read started: a view of our own live row proves the lease
// until sent+MemberTTL.
func (c *Core) adopt(v membership.View, sent time.Time) {
	if sent.After(c.renewed) {
		if sent.Sub(c.renewed) > c.cfg.MemberTTL && !c.renewed.IsZero() {
			c.changed() // writable again: sends waiting on Route retry
		}
		c.renewed = sent
	}
	if v.Version < c.view.Version {
		return
	}
	if v.Version != c.view.Version || c.view.Members == nil {
		r, err := ring.New(v.RingNodes(), c.cfg.Ring)
		if err != nil {
			return // keep the previous ring; the next view may do
		}
		others := slices.DeleteFunc(v.RingNodes(), func(m ring.Node) bool { return m.NodeID == c.cfg.NodeID })
		next, err := ring.New(others, c.cfg.Ring)
		if err != nil {
			return
		}
		c.ring, c.next = r, next
		c.changed()
	}
	c.view = v
}

// Refused records that the store refused commits carrying fences. A fence of
// this incarnation for a partition still held at that epoch means the
// partition was taken over (we were presumed dead): the node must step down.
// It reports whether that is news.
func (c *Core) Refused(fences []sequencer.Fence) (trouble bool) {
	for _, f := range fences {
		if f.Owner != c.self.Incarnation || int(f.Partition) >= len(c.parts) {
			continue
		}
		if st := c.parts[f.Partition]; st.Held && st.Epoch == f.Epoch && c.trouble == TroubleNone {
			c.trouble = TroubleFenced
			c.changed()
			trouble = true
		}
	}
	return trouble
}

// Round is what one reconcile round must do, in this order. The core already
// acted on its own state: a step-down has dropped every partition (Fence
// refuses from now on), and the partitions to release are marked moving.
type Round struct {
	// StepDown: stop every conversation, then release these leases (best
	// effort; they also expire with the member row). Reason says why.
	StepDown bool
	Reason   Trouble
	Leases   []membership.PartitionLease
	// Final: the node id belongs to another live process; after the step
	// down the node is out for good (Superseded must be called).
	Final bool
	// Rejoin: remove the row of Old (if it has an incarnation), then join as
	// a new incarnation (Joined or JoinSuperseded).
	Rejoin bool
	Old    membership.Member
	// Release: hand off these partitions: stop their conversations, then
	// release the leases and report Released (nothing on failure: they
	// stay moving and the next round retries).
	Release []membership.PartitionLease
	// Acquire: take the leases of these partitions for Incarnation, decided
	// on the view of Version; report Acquired.
	Acquire     []uint32
	Incarnation string
	Version     uint64
}

// Next decides one reconcile round: step down and rejoin when in trouble,
// else hand off what the ring moved away and take what is ours and
// takeable (see Decide).
func (c *Core) Next() Round {
	switch {
	case c.phase != PhaseActive && c.phase != PhaseSteppingDown:
		return Round{}
	case c.trouble == TroubleSuperseded:
		rd := c.stepDown(TroubleSuperseded)
		rd.Final = true
		return rd
	case c.phase == PhaseSteppingDown:
		return Round{Rejoin: true, Old: c.self}
	case c.trouble != TroubleNone:
		rd := c.stepDown(c.trouble)
		rd.Rejoin, rd.Old = true, c.self
		return rd
	}
	d := Decide(c.ring, &c.view, c.self.NodeID, c.self.Incarnation, c.parts)
	if len(d.Lost) > 0 {
		c.trouble = TroubleLost
		rd := c.stepDown(TroubleLost)
		rd.Rejoin, rd.Old = true, c.self
		return rd
	}
	var rd Round
	rd.Release = c.StartHandoff(d.Release)
	if len(d.Acquire) > 0 {
		rd.Acquire, rd.Incarnation, rd.Version = d.Acquire, c.self.Incarnation, c.view.Version
	}
	return rd
}

// stepDown drops every partition at once and returns the leases that were
// held.
func (c *Core) stepDown(why Trouble) Round {
	rd := Round{StepDown: true, Reason: why, Leases: c.HeldLeases()}
	clear(c.parts)
	c.phase = PhaseSteppingDown
	c.changed()
	return rd
}

// Superseded records that a final step-down is done: the node is out.
func (c *Core) Superseded() {
	c.phase = PhaseSuperseded
	c.changed()
}

// StartHandoff marks the held partitions of ps moving (no new fences) and
// returns their leases, to be released once their conversations stopped.
func (c *Core) StartHandoff(ps []uint32) []membership.PartitionLease {
	var ls []membership.PartitionLease
	for _, p := range ps {
		if st := &c.parts[p]; st.Held {
			st.HandingOff = true
			ls = append(ls, membership.PartitionLease{Partition: p, Owner: c.self.Incarnation, Epoch: st.Epoch})
		}
	}
	if len(ls) > 0 {
		c.changed()
	}
	return ls
}

// Released records that leases were released: those still held at the same
// epoch are no longer held.
func (c *Core) Released(leases []membership.PartitionLease) {
	for _, l := range leases {
		if st := c.parts[l.Partition]; st.Held && st.Epoch == l.Epoch && l.Owner == c.self.Incarnation {
			c.parts[l.Partition] = Part{}
		}
	}
	c.changed()
}

// Acquired records leases taken for incarnation. They count only if the
// node is still that incarnation and active (a step-down in between makes
// them someone else's to take over).
func (c *Core) Acquired(incarnation string, leases []membership.PartitionLease) {
	if c.self.Incarnation != incarnation || c.phase != PhaseActive || c.trouble != TroubleNone {
		return
	}
	for _, l := range leases {
		c.parts[l.Partition] = Part{Held: true, Epoch: l.Epoch}
	}
	c.changed()
}

// Leave starts a graceful leave. It reports whether the node was an active
// member (its row is to be marked leaving), or an error if it is already
// leaving or left.
func (c *Core) Leave() (wasMember bool, err error) {
	switch c.phase {
	case PhaseNew:
		c.phase = PhaseLeft
		c.changed()
		return false, nil
	case PhaseLeaving, PhaseLeft:
		return false, errors.New("already leaving")
	}
	wasMember = c.phase == PhaseActive
	c.phase = PhaseLeaving
	c.changed()
	return wasMember, nil
}

// Left records that the node left (or stopped as a crash would): it holds
// and serves nothing.
func (c *Core) Left() {
	c.phase = PhaseLeft
	clear(c.parts)
	c.changed()
}

// Decision is the pure rule of ownership for one round.
type Decision struct {
	Release []uint32 // held but no longer ours by the ring (or already moving): hand off
	Acquire []uint32 // ours by the ring, not held, lease takeable by the view
	Lost    []uint32 // held, but the view shows a newer epoch: someone took it (we were presumed dead)
}

// Decide is the pure rule of ownership. For each partition:
//   - held but the view's lease has a higher epoch: lost (step down);
//   - held and (moving, or the ring names another owner, or this node is not
//     in the ring): release it (handoff);
//   - not held, ours by the ring, and the view's lease is free, ours, or held
//     by an incarnation that is not live: acquire it. A lease held by a live
//     incarnation is left alone until its owner releases it.
//
// view and r must be of the same version; parts is indexed by partition.
func Decide(r *ring.Ring, view *membership.View, selfID, incarnation string, parts []Part) Decision {
	var d Decision
	for i, st := range parts {
		p := uint32(i)
		owner, ok := r.Owner(p)
		ours := ok && owner.NodeID == selfID
		lease, hasLease := view.Lease(p)
		if st.Held {
			switch {
			case hasLease && lease.Epoch > st.Epoch:
				d.Lost = append(d.Lost, p)
			case st.HandingOff || !ours:
				d.Release = append(d.Release, p)
			}
			continue
		}
		if !ours {
			continue
		}
		if hasLease && lease.Owner != "" && lease.Owner != incarnation && view.Live(lease.Owner) {
			continue // a live owner hands it off first
		}
		d.Acquire = append(d.Acquire, p)
	}
	return d
}

// Queries.

// refusal is why the node serves nothing at all (not started, left,
// superseded): a final answer for Route and Locate; nil otherwise.
func (c *Core) refusal() error {
	if c.phase == PhaseNew || c.phase == PhaseLeft || c.phase == PhaseSuperseded {
		return sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrShuttingDown,
			fmt.Sprintf("cluster node %s is %s", c.cfg.NodeID, c.phase))
	}
	return nil
}

// NodeWritable is the part of Writable that does not depend on the
// partition (a node that fails it writes nothing, so a send it owns gets an
// answer at once instead of a wait): the node is an active (or leaving) member, not in trouble, and
// its membership lease was renewed within MemberTTL of now.
func (c *Core) NodeWritable(now time.Time) error {
	if c.trouble != TroubleNone {
		return sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("node %s is %s", c.self.NodeID, c.trouble))
	}
	if c.phase != PhaseActive && c.phase != PhaseLeaving {
		return sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("node %s is %s", c.self.NodeID, c.phase))
	}
	if d := now.Sub(c.renewed); d > c.cfg.MemberTTL {
		return sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("node %s has not renewed its membership for %v", c.self.NodeID, d.Round(time.Millisecond)))
	}
	return nil
}

// Writable is the ONE answer in memory to "may this node commit for a
// conversation of partition p at now": the fence the commit must carry when
// the node is an active (or leaving) member not in trouble, renewed within
// MemberTTL, holding p and not handing it off. Otherwise an error wrapping
// sequencer.ErrNotOwner or sequencer.ErrOwnershipMoving (both retryable:
// nothing was written). Route's local way, Serving and Locate's epoch are
// derived from it. The store checks the fence again inside the commit's
// transaction: that is the other place, and the one safety rests on.
func (c *Core) Writable(p uint32, now time.Time) (sequencer.Fence, error) {
	if err := c.NodeWritable(now); err != nil {
		return sequencer.Fence{}, err
	}
	return c.partWritable(p)
}

// partWritable is the part of Writable that depends on the partition: p is
// held and not handed off (the fence at its epoch).
func (c *Core) partWritable(p uint32) (sequencer.Fence, error) {
	switch st := c.parts[p]; {
	case !st.Held:
		return sequencer.Fence{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("partition %d is not held by node %s", p, c.self.NodeID))
	case st.HandingOff:
		return sequencer.Fence{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrOwnershipMoving,
			fmt.Sprintf("partition %d is moving away from node %s", p, c.self.NodeID))
	}
	return sequencer.Fence{Partition: p, Owner: c.self.Incarnation, Epoch: c.parts[p].Epoch}, nil
}

// Serving reports whether this node can take sends at now (readiness): it
// is a member that could write what it holds (Writable's node part), with
// itself in its membership view, and not leaving.
func (c *Core) Serving(now time.Time) error {
	switch c.phase {
	case PhaseNew:
		return errors.New("cluster: not started")
	case PhaseLeaving, PhaseLeft:
		return sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrShuttingDown, "cluster: node is leaving")
	}
	if err := c.NodeWritable(now); err != nil {
		if d := now.Sub(c.renewed); d > c.cfg.MemberTTL && c.trouble == TroubleNone && c.phase == PhaseActive {
			return fmt.Errorf("cluster: membership not renewed for %v (last error: %v)", d.Round(time.Millisecond), c.beatErr)
		}
		return fmt.Errorf("cluster: %w", err)
	}
	if _, ok := c.view.Member(c.self.NodeID); !ok {
		return errors.New("cluster: this node is not in the membership view yet")
	}
	return nil
}

// Live reports whether nodeID is a live member at incarnation in the current
// view, and the view's version.
func (c *Core) Live(nodeID, incarnation string) (bool, uint64) {
	m, ok := c.view.Member(nodeID)
	return ok && incarnation != "" && m.Incarnation == incarnation, c.view.Version
}
