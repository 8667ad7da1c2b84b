package cluster

import (
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ring"
)

// partState is what this node knows of one partition it may hold.
type partState struct {
	held   bool   // this incarnation holds the lease at epoch
	moving bool   // being handed off: no new fences, lease about to be released
	epoch  uint64 // valid while held
}

// plan is what one reconcile round does.
type plan struct {
	release []uint32 // held but no longer ours by the ring (or already moving): hand off
	acquire []uint32 // ours by the ring, not held, lease takeable by the view
	lost    []uint32 // held, but the view shows a newer epoch: someone took it (we were presumed dead)
}

// decide is the pure rule of ownership. For each partition:
//   - held and (moving, or the ring names another owner, or this node is not
//     in the ring): release it (handoff);
//   - held but the view's lease has a higher epoch: lost (step down);
//   - not held, ours by the ring, and the view's lease is free, ours, or held
//     by an incarnation that is not live: acquire it. A lease held by a live
//     incarnation is left alone until its owner releases it.
//
// view and r must be of the same Version; self is this node's id and
// incarnation; parts is indexed by partition.
func decide(r *ring.Ring, view *membership.View, selfID, incarnation string, parts []partState) plan {
	var pl plan
	for i, st := range parts {
		p := uint32(i)
		owner, ok := r.Owner(p)
		ours := ok && owner.NodeID == selfID
		lease, hasLease := view.Lease(p)
		if st.held {
			switch {
			case hasLease && lease.Epoch > st.epoch:
				pl.lost = append(pl.lost, p)
			case st.moving || !ours:
				pl.release = append(pl.release, p)
			}
			continue
		}
		if !ours {
			continue
		}
		if hasLease && lease.Owner != "" && lease.Owner != incarnation && view.Live(lease.Owner) {
			continue // a live owner hands it off first
		}
		pl.acquire = append(pl.acquire, p)
	}
	return pl
}
