package ownership

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ring"
)

// TestQueriesFollowWritable enumerates the ownership states of a node (phase
// x trouble x what it knows of a partition x lease freshness x the ring's
// owner x whether its view lists it) and checks that Route, Locate and
// Serving say what the one predicate, Writable, says: a send goes local
// exactly when the ring names this node and Writable gives a fence, waits
// with Writable's own reason otherwise (or, when the node can write nothing
// at all, goes to the ring's next owner), Locate reports this node's epoch only
// when Writable does, and a serving node can write every partition it holds
// and is not handing off.
func TestQueriesFollowWritable(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	now := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	members := []membership.Member{
		{NodeID: "a", Incarnation: "a/1", ClusterAddr: "a:1"},
		{NodeID: "b", Incarnation: "b/1", ClusterAddr: "b:1"},
	}
	cfg := Config{NodeID: "a", Ring: ring.Config{Partitions: 16}, MemberTTL: ttl}
	r, err := ring.New([]ring.Node{{NodeID: "a", Address: "a:1"}, {NodeID: "b", Address: "b:1"}}, cfg.Ring)
	if err != nil {
		t.Fatal(err)
	}
	var ours, theirs uint32
	foundOurs, foundTheirs := false, false
	for p := range uint32(16) {
		o, _ := r.Owner(p)
		if o.NodeID == "a" && !foundOurs {
			ours, foundOurs = p, true
		}
		if o.NodeID == "b" && !foundTheirs {
			theirs, foundTheirs = p, true
		}
	}
	if !foundOurs || !foundTheirs {
		t.Fatal("the ring gives no partition to one of the nodes")
	}
	next, err := ring.New([]ring.Node{{NodeID: "b", Address: "b:1"}}, cfg.Ring)
	if err != nil {
		t.Fatal(err)
	}
	parts := []Part{{}, {Held: true, Epoch: 7}, {Held: true, HandingOff: true, Epoch: 7}}
	renewals := []time.Duration{0, ttl / 2, ttl + time.Millisecond}
	checked := 0
	for phase := PhaseNew; phase <= PhaseLeft; phase++ {
		for trouble := TroubleNone; trouble <= TroubleSuperseded; trouble++ {
			for _, part := range parts {
				for _, age := range renewals {
					for _, inView := range []bool{true, false} {
						for _, p := range []uint32{ours, theirs} {
							c, err := New(cfg, membership.Member{})
							if err != nil {
								t.Fatal(err)
							}
							c.self = membership.Member{NodeID: "a", Incarnation: "a/1", ClusterAddr: "a:1"}
							c.phase, c.trouble, c.renewed, c.ring, c.next = phase, trouble, now.Add(-age), r, next
							c.view = membership.View{Version: 3, Members: members}
							if !inView {
								c.view.Members = members[1:]
							}
							c.parts[p] = part
							name := fmt.Sprintf("%s/%s/%+v/age=%v/inView=%v/p=%d", phase, trouble, part, age, inView, p)
							checkQueries(t, name, c, p, now)
							checked++
						}
					}
				}
			}
		}
	}
	if want := 6 * 5 * 3 * 3 * 2 * 2; checked != want {
		t.Fatalf("checked %d states, want %d", checked, want)
	}
}

func checkQueries(t interface {
	Helper()
	Errorf(string, ...any)
}, name string, c *Core, p uint32, now time.Time) {
	t.Helper()
	fence, werr := c.Writable(p, now)
	owner, _ := c.ring.Owner(p)
	self := owner.NodeID == c.self.NodeID
	refused := c.phase == PhaseNew || c.phase == PhaseLeft || c.phase == PhaseSuperseded
	next, nextOK := c.next.Owner(p) // the ring without this node

	// Writable itself: a fence of this incarnation at the held epoch, or a
	// retryable reason.
	if werr == nil {
		st := c.parts[p]
		if !st.Held || st.HandingOff || c.trouble != TroubleNone || now.Sub(c.renewed) > c.cfg.MemberTTL ||
			(c.phase != PhaseActive && c.phase != PhaseLeaving) {
			t.Errorf("%s: Writable gave a fence", name)
		}
		if fence.Owner != c.self.Incarnation || fence.Epoch != st.Epoch || fence.Partition != p {
			t.Errorf("%s: fence %+v", name, fence)
		}
	} else if sequencer.ErrorCode(werr) != sequencer.CodeUnavailable ||
		!(errors.Is(werr, sequencer.ErrNotOwner) || errors.Is(werr, sequencer.ErrOwnershipMoving)) {
		t.Errorf("%s: Writable refused with %v, not a retryable ownership error", name, werr)
	}

	d := c.Dispatch(p, now)
	switch {
	case refused:
		if d.Way != WayRefuse {
			t.Errorf("%s: Route %s, want refuse", name, d.Way)
		}
	case !self:
		if d.Way != WayForward || d.Owner.NodeID != owner.NodeID {
			t.Errorf("%s: Route %s to %q, want forward to %s", name, d.Way, d.Owner.NodeID, owner.NodeID)
		}
	case werr == nil:
		if d.Way != WayLocal {
			t.Errorf("%s: Writable gives a fence but Route says %s (%v)", name, d.Way, d.Err)
		}
	case c.NodeWritable(now) != nil && nextOK:
		// Cut from the store (or in trouble): the ring's next owner,
		// which takes the partition once this node is presumed dead.
		if d.Way != WayForward || !d.Successor || d.Owner.NodeID != next.NodeID || d.Err == nil || d.Err.Error() != werr.Error() {
			t.Errorf("%s: Route %s to %q (successor %v, %v), want forward to the next owner %s with Writable's reason %v",
				name, d.Way, d.Owner.NodeID, d.Successor, d.Err, next.NodeID, werr)
		}
	default:
		if d.Way != WayWait || d.Err == nil || d.Err.Error() != werr.Error() {
			t.Errorf("%s: Route %s (%v), want wait with Writable's reason %v", name, d.Way, d.Err, werr)
		}
	}
	// Cut is Writable's node part, decided by Dispatch itself: the router
	// takes its fail-fast from it and asks the core nothing more.
	if wantCut := !refused && self && c.NodeWritable(now) != nil; d.Cut != wantCut {
		t.Errorf("%s: Route says cut %v, NodeWritable says %v", name, d.Cut, c.NodeWritable(now))
	}
	if d.Way == WayForward && d.Owner.NodeID == c.self.NodeID {
		t.Errorf("%s: Route forwards to this node itself", name)
	}

	loc, lerr := c.Locate(p, now)
	switch {
	case refused:
		if !errors.Is(lerr, sequencer.ErrShuttingDown) {
			t.Errorf("%s: Locate gave %v, want shutting down (as Route refuses)", name, lerr)
		}
	case lerr != nil:
		t.Errorf("%s: Locate: %v", name, lerr)
	case self && werr == nil && loc.Epoch != fence.Epoch:
		t.Errorf("%s: Locate epoch %d, Writable's fence %d", name, loc.Epoch, fence.Epoch)
	case self && werr != nil && loc.NodeID == c.self.NodeID && loc.Epoch != 0:
		t.Errorf("%s: Locate reports epoch %d of a partition this node may not write", name, loc.Epoch)
	case !refused && d.Way != WayRefuse && d.Owner.NodeID != "" && loc.NodeID != d.Owner.NodeID:
		t.Errorf("%s: Locate names %s, Route goes to %s", name, loc.NodeID, d.Owner.NodeID)
	}

	serr := c.Serving(now)
	st := c.parts[p]
	if serr == nil {
		if c.phase != PhaseActive {
			t.Errorf("%s: serving in phase %s", name, c.phase)
		}
		if _, ok := c.view.Member(c.self.NodeID); !ok {
			t.Errorf("%s: serving while not in its own view", name)
		}
		if st.Held && !st.HandingOff && werr != nil {
			t.Errorf("%s: serving, but may not write a partition it holds: %v", name, werr)
		}
	} else if c.phase == PhaseActive && st.Held && !st.HandingOff && werr == nil {
		if _, ok := c.view.Member(c.self.NodeID); ok {
			t.Errorf("%s: writable and in its view, but not serving: %v", name, serr)
		}
	}
}
