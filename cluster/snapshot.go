package cluster

import (
	"time"

	"github.com/sequencer-im/sequencer/membership"
)

// Snapshot is a read-only copy of what this node knows of the cluster (for
// the web console): the members and partition leases of its last membership
// read, with its own held leases filled in from its current state.
type Snapshot struct {
	NodeID     string
	Phase      string
	Version    uint64
	Members    []membership.Member
	Partitions []PartitionOwner // indexed by partition
	// StoreNow is the store's clock at the last read; ReadAt is this node's
	// clock when that read started. A member heartbeated last at
	// LeaseUntil-MemberTTL by the store's clock.
	StoreNow  time.Time
	ReadAt    time.Time
	MemberTTL time.Duration
}

// PartitionOwner is one partition's lease as this node knows it.
type PartitionOwner struct {
	Owner     string // node id of the live member holding the lease; "" when free or its holder is gone
	Epoch     uint64 // the lease's epoch (0: never taken)
	RingOwner string // the node the ring assigns it to
}

// Snapshot returns a copy of this node's view.
func (n *Node) Snapshot() Snapshot {
	n.mu.RLock()
	defer n.mu.RUnlock()
	c := n.core
	self, view, r := c.Self(), c.View(), c.Ring()
	s := Snapshot{
		NodeID: self.NodeID, Phase: c.Phase().String(), Version: view.Version,
		Members: append([]membership.Member(nil), view.Members...), StoreNow: view.Now, ReadAt: c.RenewedAt(),
		MemberTTL: n.cfg.MemberTTL, Partitions: make([]PartitionOwner, n.partitions),
	}
	byInc := make(map[string]string, len(view.Members))
	for _, m := range view.Members {
		byInc[m.Incarnation] = m.NodeID
	}
	for _, l := range view.Leases {
		if int(l.Partition) < len(s.Partitions) {
			s.Partitions[l.Partition] = PartitionOwner{Owner: byInc[l.Owner], Epoch: l.Epoch}
		}
	}
	for p := range s.Partitions {
		if st := c.Part(uint32(p)); st.Held {
			s.Partitions[p].Owner, s.Partitions[p].Epoch = self.NodeID, st.Epoch
		} else if s.Partitions[p].Owner == self.NodeID {
			s.Partitions[p].Owner = "" // released or dropped since the read
		}
		if o, ok := r.Owner(uint32(p)); ok {
			s.Partitions[p].RingOwner = o.NodeID
		}
	}
	return s
}

// Moving counts the partitions whose lease holder is not their ring owner
// (moving between nodes, or free) in this snapshot.
func (s Snapshot) Moving() int {
	n := 0
	for _, p := range s.Partitions {
		if p.Owner != p.RingOwner {
			n++
		}
	}
	return n
}
