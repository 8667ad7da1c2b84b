package cluster

import "testing"

// TestSnapshot: a node's snapshot names every partition's live owner and
// epoch as the ring placed them, and a crashed member's partitions show as
// taken by the survivor once its lease expired.
func TestSnapshot(t *testing.T) {
	s := newSim(t)
	s.start("a")
	s.start("b")
	s.settle(6)
	s.round() // one more read, so a's view holds b's leases too
	snap := s.nodes["a"].node.Snapshot()
	if snap.NodeID != "a" || snap.Phase != "active" || len(snap.Members) != 2 || len(snap.Partitions) != simPartitions {
		t.Fatalf("snapshot: node %q phase %q, %d members, %d partitions", snap.NodeID, snap.Phase, len(snap.Members), len(snap.Partitions))
	}
	held := map[string]int{}
	for p, o := range snap.Partitions {
		if o.Owner == "" || o.Owner != o.RingOwner || o.Epoch == 0 {
			t.Fatalf("partition %d: %+v, want a live owner at epoch > 0, as the ring places it", p, o)
		}
		held[o.Owner]++
	}
	if held["a"] != s.nodes["a"].node.held() || held["b"] != s.nodes["b"].node.held() {
		t.Fatalf("owners %v, held a=%d b=%d", held, s.nodes["a"].node.held(), s.nodes["b"].node.held())
	}
	if snap.StoreNow.IsZero() || snap.ReadAt.IsZero() || snap.MemberTTL <= 0 {
		t.Fatalf("times: store %v read %v ttl %v", snap.StoreNow, snap.ReadAt, snap.MemberTTL)
	}

	b := s.nodes["b"]
	b.dead = true
	s.net.SetDown(b.node.self().ClusterAddr, true)
	s.settle(12)
	s.round()
	snap = s.nodes["a"].node.Snapshot()
	if len(snap.Members) != 1 {
		t.Fatalf("%d members after b's crash, want 1", len(snap.Members))
	}
	for p, o := range snap.Partitions {
		if o.Owner != "a" {
			t.Fatalf("partition %d owned by %q after b's crash, want a", p, o.Owner)
		}
	}
}
