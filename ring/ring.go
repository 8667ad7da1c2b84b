// Package ring owns the mapping conv_id -> partition -> owner for one member set.
//
// A Ring is a pure value: it is computed from a member set and a Config, and the
// same member set (in any order) with the same Config gives the same owner for
// every partition on every node. The partition of a conversation depends only on
// its ConvID and the partition count, never on the members, so it is fixed for the
// life of a cluster.
//
// The owners come from github.com/buraksezer/consistent v0.10.0 (consistent hashing
// with bounded loads) with xxhash (github.com/cespare/xxhash/v2) as the hasher.
//
// This package must never do I/O, read a clock, keep state between calls, or decide
// who is a member or who holds a partition lease: it only answers "who should own
// this partition if these are the members". Membership and epochs live elsewhere.
package ring

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// Defaults and limits for Config. Changing Partitions, ReplicationFactor or Load
// changes owners; changing Partitions also changes the partition of every
// conversation, so all nodes of a cluster must use the same values.
const (
	// DefaultPartitions is the partition count used when Config.Partitions is 0.
	DefaultPartitions = 271
	// DefaultReplicationFactor is the number of points each member has on the hash
	// circle when Config.ReplicationFactor is 0.
	DefaultReplicationFactor = 20
	// DefaultLoad is the bounded-load factor used when Config.Load is 0: no member
	// owns more than ceil(floor(Partitions/members) * Load) partitions.
	DefaultLoad = 1.25

	// MaxPartitions bounds Config.Partitions (one partition lease row each).
	MaxPartitions = 1 << 16
	// MaxReplicationFactor bounds Config.ReplicationFactor.
	MaxReplicationFactor = 1 << 10
)

// vnodeSep ends the name a member has on the hash circle (see memberName).
const vnodeSep = "/"

var (
	// ErrInvalidConfig reports a Config or member list that no ring can be built from
	// (negative or too large values, empty or repeated NodeID).
	ErrInvalidConfig = errors.New("ring: invalid config")
	// ErrNoRoom reports a valid Config under which the bounded-load rule cannot give
	// every partition an owner for this member set (for example more members than
	// partitions, or a Load too small). Raise Partitions or Load, or use fewer members.
	ErrNoRoom = errors.New("ring: not enough room to distribute partitions")
)

// Node is a node the ring can give partitions to (a member of the
// cluster as the ring sees it: membership.View.RingNodes). Only NodeID decides ownership;
// Address is carried along so callers can reach the owner.
type Node struct {
	NodeID  string
	Address string
}

// Config shapes the ring. The zero value means all defaults.
type Config struct {
	// Partitions is the fixed number of partitions; 0 means DefaultPartitions.
	// Must be in [1, MaxPartitions]. Conversations map to partitions by
	// xxhash64(conv_id) mod Partitions.
	Partitions int
	// ReplicationFactor is the number of points per member on the hash circle;
	// 0 means DefaultReplicationFactor. Must be in [1, MaxReplicationFactor];
	// 1 can fail with ErrNoRoom even when there is room (see distribute).
	ReplicationFactor int
	// Load is the bounded-load factor; 0 means DefaultLoad. Must be finite and > 0.
	// Values below 1 (or few members with many partitions) can leave no room to
	// place every partition; New then returns ErrNoRoom.
	Load float64
}

// DefaultConfig returns every default, the values the zero Config means.
func DefaultConfig() Config {
	return Config{Partitions: DefaultPartitions, ReplicationFactor: DefaultReplicationFactor, Load: DefaultLoad}
}

// withDefaults returns c with zero fields set to their defaults, or an error
// wrapping ErrInvalidConfig.
func (c Config) withDefaults() (Config, error) {
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = DefaultReplicationFactor
	}
	if c.Load == 0 {
		c.Load = DefaultLoad
	}
	switch {
	case c.Partitions < 1 || c.Partitions > MaxPartitions:
		return c, fmt.Errorf("%w: Partitions %d not in [1, %d]", ErrInvalidConfig, c.Partitions, MaxPartitions)
	case c.ReplicationFactor < 1 || c.ReplicationFactor > MaxReplicationFactor:
		return c, fmt.Errorf("%w: ReplicationFactor %d not in [1, %d]", ErrInvalidConfig, c.ReplicationFactor, MaxReplicationFactor)
	case math.IsNaN(c.Load) || math.IsInf(c.Load, 0) || c.Load <= 0:
		return c, fmt.Errorf("%w: Load %v must be finite and > 0", ErrInvalidConfig, c.Load)
	}
	return c, nil
}

// Ring is an immutable assignment of partitions to members. It is safe for
// concurrent use.
type Ring struct {
	partitions int
	members    []Node // sorted by NodeID
	owners     []Node // owners[p] is the owner of partition p; nil when there are no members
}

// memberName is the name a member has inside the consistent library. The library
// places point i of a member at xxhash(name + decimal(i)); ending the name with a
// separator that no decimal contains makes those keys distinct for distinct
// NodeIDs (with the bare NodeID, "node-1" point 10 and "node-11" point 0 would both
// hash "node-110" and share one point).
type memberName string

func (m memberName) String() string { return string(m) }

func nameOf(nodeID string) memberName { return memberName(nodeID + vnodeSep) }

type xxhasher struct{}

func (xxhasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// New builds the ring for members under cfg. The order of members does not matter.
// Zero members is valid and gives a ring where no partition has an owner. It
// returns an error wrapping ErrInvalidConfig for a bad cfg, an empty NodeID or a
// NodeID listed twice, and one wrapping ErrNoRoom when the bounded-load rule
// cannot place every partition.
func New(members []Node, cfg Config) (*Ring, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	sorted := slices.Clone(members)
	slices.SortFunc(sorted, func(a, b Node) int { return strings.Compare(a.NodeID, b.NodeID) })
	for i, m := range sorted {
		if m.NodeID == "" {
			return nil, fmt.Errorf("%w: member with empty NodeID (address %q)", ErrInvalidConfig, m.Address)
		}
		if i > 0 && sorted[i-1].NodeID == m.NodeID {
			return nil, fmt.Errorf("%w: NodeID %q listed twice", ErrInvalidConfig, m.NodeID)
		}
	}
	r := &Ring{partitions: cfg.Partitions, members: sorted}
	if len(sorted) == 0 {
		// The library panics when asked to distribute over zero members.
		return r, nil
	}
	// The library gives each member at most avgLoad partitions; if even a perfect
	// packing cannot fit, it would panic. Say why instead.
	avgLoad := math.Ceil(float64(cfg.Partitions/len(sorted)) * cfg.Load)
	if avgLoad*float64(len(sorted)) < float64(cfg.Partitions) {
		return nil, fmt.Errorf("%w: %d members with at most %v partitions each cannot hold %d partitions (Load %v)",
			ErrNoRoom, len(sorted), avgLoad, cfg.Partitions, cfg.Load)
	}
	owners, err := distribute(sorted, cfg)
	if err != nil {
		return nil, err
	}
	r.owners = owners
	return r, nil
}

// distribute runs the library and reads back the owner of every partition. The
// library panics when its walk finds no member with room; that panic becomes
// ErrNoRoom. After New's room check this happens only with ReplicationFactor 1:
// the walk never visits the point just before the partition's start, which with
// one point per member can be the only member with room (and with a single
// member and a single point the walk visits nothing).
func distribute(sorted []Node, cfg Config) (owners []Node, err error) {
	byName := make(map[memberName]Node, len(sorted))
	cmembers := make([]consistent.Member, len(sorted))
	for i, m := range sorted {
		n := nameOf(m.NodeID)
		byName[n] = m
		cmembers[i] = n
	}
	defer func() {
		if p := recover(); p != nil {
			owners = nil
			err = fmt.Errorf("%w: %d members, %d partitions, replication factor %d, load %v: %v",
				ErrNoRoom, len(sorted), cfg.Partitions, cfg.ReplicationFactor, cfg.Load, p)
		}
	}()
	c := consistent.New(cmembers, consistent.Config{
		Hasher:            xxhasher{},
		PartitionCount:    cfg.Partitions,
		ReplicationFactor: cfg.ReplicationFactor,
		Load:              cfg.Load,
	})
	owners = make([]Node, cfg.Partitions)
	for p := range owners {
		o := c.GetPartitionOwner(p)
		if o == nil {
			return nil, fmt.Errorf("ring: library left partition %d without owner", p)
		}
		m, ok := byName[o.(memberName)]
		if !ok {
			return nil, fmt.Errorf("ring: library named unknown owner %q for partition %d", o.String(), p)
		}
		owners[p] = m
	}
	return owners, nil
}

// PartitionOf returns the partition of convID for a ring of the given partition
// count: xxhash64(convID) mod partitions, exactly as the library's FindPartitionID.
// partitions must be >= 1.
func PartitionOf(convID string, partitions int) uint32 {
	return uint32(xxhash.Sum64String(convID) % uint64(partitions))
}

// Partition returns the partition of convID. It depends only on convID and the
// partition count, never on the members.
func (r *Ring) Partition(convID string) uint32 { return PartitionOf(convID, r.partitions) }

// Owner returns the member that owns partition p. It reports false when the ring
// has no members or p is not a partition of this ring.
func (r *Ring) Owner(p uint32) (Node, bool) {
	if r.owners == nil || uint64(p) >= uint64(len(r.owners)) {
		return Node{}, false
	}
	return r.owners[p], true
}

// OwnerOf returns the owner and the partition of convID. It reports false (with
// the partition still set) when the ring has no members.
func (r *Ring) OwnerOf(convID string) (Node, uint32, bool) {
	p := r.Partition(convID)
	m, ok := r.Owner(p)
	return m, p, ok
}

// Nodes returns the nodes sorted by NodeID (a copy).
func (r *Ring) Nodes() []Node { return slices.Clone(r.members) }

// Partitions returns the partition count.
func (r *Ring) Partitions() int { return r.partitions }

// Assignments returns the owner of every partition, indexed by partition (a
// copy). It is nil when the ring has no members.
func (r *Ring) Assignments() []Node { return slices.Clone(r.owners) }

// OwnedBy returns, in increasing order, the partitions owned by nodeID.
func (r *Ring) OwnedBy(nodeID string) []uint32 {
	var ps []uint32
	for p, m := range r.owners {
		if m.NodeID == nodeID {
			ps = append(ps, uint32(p))
		}
	}
	return ps
}

// Moved returns, in increasing order, the partitions whose owning NodeID differs
// between a and b, counting "no owner" as an owner of its own. A nil ring is an
// empty ring. Rings with different partition counts share no partition layout, so
// every partition below the larger count is reported.
func Moved(a, b *Ring) []uint32 {
	if a == nil && b == nil {
		return nil
	}
	if a == nil {
		a = &Ring{partitions: b.partitions}
	}
	if b == nil {
		b = &Ring{partitions: a.partitions}
	}
	n := max(a.partitions, b.partitions)
	var moved []uint32
	for p := range n {
		if a.partitions != b.partitions {
			moved = append(moved, uint32(p))
			continue
		}
		ma, oka := a.Owner(uint32(p))
		mb, okb := b.Owner(uint32(p))
		if oka != okb || ma.NodeID != mb.NodeID {
			moved = append(moved, uint32(p))
		}
	}
	return moved
}
