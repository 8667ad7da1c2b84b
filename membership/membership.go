// Package membership defines the two tables the nodes of a cluster share, and
// the rules that change them:
//
//   - the member set: one row per node (NodeID, the Incarnation of the process
//     that runs it, its addresses, a lease it renews), with a single Version
//     bumped in the same transaction as every change of the set, so every node
//     builds the same ring for the same Version (like Orleans' membership
//     table);
//   - the partition leases: (Partition, Owner incarnation, Epoch). A lease is
//     taken only when it is free (released), already ours, or its owner is not
//     a live member incarnation; taking bumps the Epoch, which fences every
//     commit of the previous owner (sequencer.Fence).
//
// Store is implemented once over SQL by membership/sqltable (the shared
// stores give it their SQL: persist/postgres and persist/mysql ClusterStore)
// and, for simulations, by Mem in this package. CheckFences (fence.go) is
// the one store-side fence decision every store's commit calls. A Store reads time from its own clock
// (the database's), never from its callers, so nodes with skewed clocks agree
// on who expired. A Store never decides which node should own a partition
// (that is package ring's job) and never talks to nodes.
package membership

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/sequencer-im/sequencer/ring"
)

// Errors of Heartbeat and Join. They are not client-facing: a node that gets
// one steps down (package cluster).
var (
	// ErrMemberGone: the member row of this incarnation expired or was removed;
	// the others presumed it dead and may have taken its partitions. The lease
	// is never revived: the process must step down and Join again with a new
	// incarnation.
	ErrMemberGone = errors.New("membership: member row expired or removed (presumed dead)")
	// ErrSuperseded: the NodeID now belongs to another live incarnation (a
	// newer process started with the same node id). This incarnation must
	// stay out.
	ErrSuperseded = errors.New("membership: node id taken by another live incarnation")
	// ErrIncompatible: a live member builds another ring (partition count)
	// or speaks another inter-node protocol version: the joining node must
	// not join (its ring would name other owners).
	ErrIncompatible = errors.New("membership: a live member uses another partition count or protocol version")
	// ErrNoSuchMember: RequestDrain found no live member row of that node id.
	ErrNoSuchMember = errors.New("membership: no live member with that node id")
)

// Member is one node of the cluster.
type Member struct {
	NodeID      string    // stable name; the ring places members by NodeID
	Incarnation string    // unique per process start; owner name of partition leases
	ClusterAddr string    // node-to-node address (forwarding)
	APIAddr     string    // client API address (Route answers it)
	Leaving     bool      // leaving gracefully: out of the ring, its leases still live
	LeaseUntil  time.Time // by the store's clock
	// Partitions and Protocol are the ring's partition count and the
	// inter-node protocol version this member uses; Join refuses a member
	// whose values differ from a live member's (ErrIncompatible).
	Partitions int
	Protocol   int
	// Version is the build the member runs (shown to operators only).
	Version string
}

// PartitionLease is one partition's lease row. Owner "" means released (free).
type PartitionLease struct {
	Partition uint32
	Owner     string // an Incarnation, or "" when released
	Epoch     uint64 // bumped by every Acquire; never goes down
}

// View is the cluster as one read of the store saw it.
type View struct {
	// Version orders views: it grows with every change of the member set
	// (join, leave, removal, expiry, incarnation or address change) and only
	// then. Two views with the same Version have the same Members (apart from
	// LeaseUntil).
	Version uint64
	// Members are the members whose lease had not expired at Now, sorted by
	// NodeID; leaving members included.
	Members []Member
	// Leases are all partition lease rows, sorted by Partition. Partitions
	// never acquired have no row.
	Leases []PartitionLease
	// Now is the store's clock when the view was read.
	Now time.Time
}

// Member returns the member named nodeID.
func (v View) Member(nodeID string) (Member, bool) {
	i, ok := slices.BinarySearchFunc(v.Members, nodeID, func(m Member, id string) int { return strings.Compare(m.NodeID, id) })
	if !ok {
		return Member{}, false
	}
	return v.Members[i], true
}

// Live reports whether incarnation is the incarnation of a live member
// (leaving members are live until they remove themselves or expire).
func (v View) Live(incarnation string) bool {
	if incarnation == "" {
		return false
	}
	for _, m := range v.Members {
		if m.Incarnation == incarnation {
			return true
		}
	}
	return false
}

// Lease returns the lease row of partition p.
func (v View) Lease(p uint32) (PartitionLease, bool) {
	i, ok := slices.BinarySearchFunc(v.Leases, p, func(l PartitionLease, p uint32) int {
		switch {
		case l.Partition < p:
			return -1
		case l.Partition > p:
			return 1
		}
		return 0
	})
	if !ok {
		return PartitionLease{}, false
	}
	return v.Leases[i], true
}

// RingNodes returns the members that own partitions: every member that is
// not leaving, with its ClusterAddr as the ring address.
func (v View) RingNodes() []ring.Node {
	var ms []ring.Node
	for _, m := range v.Members {
		if !m.Leaving {
			ms = append(ms, ring.Node{NodeID: m.NodeID, Address: m.ClusterAddr})
		}
	}
	return ms
}

// Store is the shared membership and partition-lease table. Every method is
// one transaction; lease times come from the store's clock.
type Store interface {
	// Join adds m (its LeaseUntil is ignored) with a lease until now+ttl and
	// returns the view after it; it bumps the Version. A row of the same
	// NodeID whose lease expired is replaced. A live row of the same NodeID
	// with another incarnation is replaced only when takeOver is set (a fresh
	// process start declares its crashed predecessor dead); otherwise Join
	// fails with ErrSuperseded. Joining an incarnation that is already the
	// live row only renews it (idempotent retry).
	Join(ctx context.Context, m Member, ttl time.Duration, takeOver bool) (View, error)
	// Heartbeat renews the lease of (nodeID, incarnation) to now+ttl, removes
	// every member whose lease expired (bumping the Version once if any), and
	// returns the view. It fails with ErrMemberGone when the row is missing or
	// expired (the lease is never revived), and with ErrSuperseded when the
	// NodeID belongs to another incarnation.
	Heartbeat(ctx context.Context, nodeID, incarnation string, ttl time.Duration) (View, error)
	// Leave marks the member leaving: it leaves the ring (Version bumped) but
	// its incarnation stays live, so nobody takes its partitions before it
	// releases them. Heartbeat keeps renewing it until Remove. Same errors
	// as Heartbeat.
	Leave(ctx context.Context, nodeID, incarnation string) (View, error)
	// Remove deletes the member row of this incarnation (Version bumped).
	// Removing a row that is gone is not an error.
	Remove(ctx context.Context, nodeID, incarnation string) error
	// Acquire takes, for incarnation, each of partitions whose lease is free
	// (no row, or Owner ""), already held by incarnation, or held by an
	// incarnation that is not a live member; each taken lease's Epoch is
	// bumped (a new row starts at 1). It takes nothing unless incarnation is a
	// live, non-leaving member and the current Version is version (the caller
	// decided on the latest view). It returns the leases taken, sorted by
	// Partition. Taking a lease waits for every in-flight commit fenced with
	// the previous (owner, epoch) to finish, and fences out later ones.
	Acquire(ctx context.Context, incarnation string, version uint64, partitions []uint32) ([]PartitionLease, error)
	// Release frees each lease still held at exactly its Owner and Epoch
	// (Owner becomes "", Epoch kept). Leases no longer held so are skipped.
	Release(ctx context.Context, leases []PartitionLease) error
	// View reads the current view without changing anything.
	View(ctx context.Context) (View, error)
	// Rows reads every member row, expired ones not yet removed included,
	// sorted by NodeID, and the store's clock (operators: `sequencer admin
	// members`, `forget`). Nothing changes.
	Rows(ctx context.Context) ([]Member, time.Time, error)
	// RequestDrain marks the live row of nodeID leaving on behalf of someone
	// else (an operator): like Leave, the member leaves the ring (Version
	// bumped, unless it was leaving already) while its incarnation stays
	// live. The node sees its own row leaving at its next heartbeat and
	// leaves gracefully (package cluster). It returns the row, or
	// ErrNoSuchMember when nodeID has no live row.
	RequestDrain(ctx context.Context, nodeID string) (Member, error)
}

// Provider is the capability a message store needs for cluster mode: the
// shared membership and partition-lease table of its database (PostgreSQL
// has one; the embedded store does not).
type Provider interface {
	Membership() Store
}
