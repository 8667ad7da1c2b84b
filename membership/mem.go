package membership

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
)

// Mem is an in-memory Store with the same rules as the PostgreSQL one, for
// deterministic simulations: its clock plays the database clock. It also
// models fenced commits (Fenced), so a simulation can check that a stale
// owner's writes are refused. Safe for concurrent use.
type Mem struct {
	clock clock.Clock

	mu      sync.Mutex
	version uint64
	members map[string]Member // by NodeID
	leases  map[uint32]PartitionLease
	// Fail, when set, is called at the start of every method with its name;
	// a non-nil result is returned as the method's error (nothing changed).
	Fail func(op string) error
}

var _ Store = (*Mem)(nil)

// NewMem returns an empty store whose lease times follow c.
func NewMem(c clock.Clock) *Mem {
	return &Mem{clock: clock.Or(c), members: map[string]Member{}, leases: map[uint32]PartitionLease{}}
}

func (s *Mem) fail(op string) error {
	if s.Fail != nil {
		return s.Fail(op)
	}
	return nil
}

// live reports whether m's lease has not expired at now.
func live(m Member, now time.Time) bool { return !m.LeaseUntil.Before(now) }

// expire removes expired members, bumping the version once if any.
func (s *Mem) expire(now time.Time) {
	changed := false
	for id, m := range s.members {
		if !live(m, now) {
			delete(s.members, id)
			changed = true
		}
	}
	if changed {
		s.version++
	}
}

func (s *Mem) view(now time.Time) View {
	v := View{Version: s.version, Now: now}
	for _, m := range s.members {
		if live(m, now) {
			v.Members = append(v.Members, m)
		}
	}
	slices.SortFunc(v.Members, func(a, b Member) int { return cmp.Compare(a.NodeID, b.NodeID) })
	for _, p := range slices.Sorted(maps.Keys(s.leases)) {
		v.Leases = append(v.Leases, s.leases[p])
	}
	return v
}

func (s *Mem) Join(ctx context.Context, m Member, ttl time.Duration, takeOver bool) (View, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail("Join"); err != nil {
		return View{}, err
	}
	if m.NodeID == "" || m.Incarnation == "" {
		return View{}, fmt.Errorf("membership: join needs a node id and an incarnation")
	}
	now := s.clock.Now()
	old, ok := s.members[m.NodeID]
	if ok && live(old, now) && old.Incarnation != m.Incarnation && !takeOver {
		return View{}, fmt.Errorf("join %s as %s: %w (held by %s)", m.NodeID, m.Incarnation, ErrSuperseded, old.Incarnation)
	}
	for _, o := range s.members {
		if o.NodeID != m.NodeID && live(o, now) && (o.Partitions != m.Partitions || o.Protocol != m.Protocol) {
			return View{}, fmt.Errorf("join %s (%d partitions, protocol %d): %w: %s has %d partitions, protocol %d",
				m.NodeID, m.Partitions, m.Protocol, ErrIncompatible, o.NodeID, o.Partitions, o.Protocol)
		}
	}
	m.LeaseUntil = now.Add(ttl)
	m.Leaving = false
	if ok && live(old, now) && old.Incarnation == m.Incarnation {
		m.Leaving = old.Leaving
	}
	if !ok || old.Incarnation != m.Incarnation || old.ClusterAddr != m.ClusterAddr || old.APIAddr != m.APIAddr || old.Leaving != m.Leaving || !live(old, now) {
		s.version++
	}
	s.members[m.NodeID] = m
	s.expire(now)
	return s.view(now), nil
}

// own returns this incarnation's live row or the reason it has none.
func (s *Mem) own(nodeID, incarnation string, now time.Time) (Member, error) {
	m, ok := s.members[nodeID]
	switch {
	case !ok || (!live(m, now) && m.Incarnation == incarnation):
		return Member{}, fmt.Errorf("member %s (%s): %w", nodeID, incarnation, ErrMemberGone)
	case m.Incarnation != incarnation:
		if live(m, now) {
			return Member{}, fmt.Errorf("member %s (%s): %w (held by %s)", nodeID, incarnation, ErrSuperseded, m.Incarnation)
		}
		return Member{}, fmt.Errorf("member %s (%s): %w", nodeID, incarnation, ErrMemberGone)
	}
	return m, nil
}

func (s *Mem) Heartbeat(ctx context.Context, nodeID, incarnation string, ttl time.Duration) (View, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail("Heartbeat"); err != nil {
		return View{}, err
	}
	now := s.clock.Now()
	m, err := s.own(nodeID, incarnation, now)
	if err != nil {
		s.expire(now)
		return View{}, err
	}
	m.LeaseUntil = now.Add(ttl)
	s.members[nodeID] = m
	s.expire(now)
	return s.view(now), nil
}

func (s *Mem) Leave(ctx context.Context, nodeID, incarnation string) (View, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail("Leave"); err != nil {
		return View{}, err
	}
	now := s.clock.Now()
	m, err := s.own(nodeID, incarnation, now)
	if err != nil {
		return View{}, err
	}
	if !m.Leaving {
		m.Leaving = true
		s.members[nodeID] = m
		s.version++
	}
	return s.view(now), nil
}

func (s *Mem) Remove(ctx context.Context, nodeID, incarnation string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail("Remove"); err != nil {
		return err
	}
	if m, ok := s.members[nodeID]; ok && m.Incarnation == incarnation {
		delete(s.members, nodeID)
		s.version++
	}
	return nil
}

func (s *Mem) Acquire(ctx context.Context, incarnation string, version uint64, partitions []uint32) ([]PartitionLease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail("Acquire"); err != nil {
		return nil, err
	}
	now := s.clock.Now()
	if version != s.version {
		return nil, nil
	}
	liveInc := map[string]bool{}
	self := false
	for _, m := range s.members {
		if live(m, now) {
			liveInc[m.Incarnation] = true
			if m.Incarnation == incarnation && !m.Leaving {
				self = true
			}
		}
	}
	if !self {
		return nil, nil
	}
	var taken []PartitionLease
	for _, p := range slices.Sorted(slices.Values(partitions)) {
		l, ok := s.leases[p]
		if ok && l.Owner != "" && l.Owner != incarnation && liveInc[l.Owner] {
			continue
		}
		if len(taken) > 0 && taken[len(taken)-1].Partition == p {
			continue // listed twice
		}
		l = PartitionLease{Partition: p, Owner: incarnation, Epoch: l.Epoch + 1}
		s.leases[p] = l
		taken = append(taken, l)
	}
	return taken, nil
}

func (s *Mem) Release(ctx context.Context, leases []PartitionLease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail("Release"); err != nil {
		return err
	}
	for _, l := range leases {
		if cur, ok := s.leases[l.Partition]; ok && l.Owner != "" && cur.Owner == l.Owner && cur.Epoch == l.Epoch {
			cur.Owner = ""
			s.leases[l.Partition] = cur
		}
	}
	return nil
}

func (s *Mem) View(ctx context.Context) (View, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail("View"); err != nil {
		return View{}, err
	}
	return s.view(s.clock.Now()), nil
}

func (s *Mem) Rows(ctx context.Context) ([]Member, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail("Rows"); err != nil {
		return nil, time.Time{}, err
	}
	ms := slices.Collect(maps.Values(s.members))
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.NodeID, b.NodeID) })
	return ms, s.clock.Now(), nil
}

func (s *Mem) RequestDrain(ctx context.Context, nodeID string) (Member, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail("RequestDrain"); err != nil {
		return Member{}, err
	}
	m, ok := s.members[nodeID]
	if !ok || !live(m, s.clock.Now()) {
		return Member{}, fmt.Errorf("drain %s: %w", nodeID, ErrNoSuchMember)
	}
	if !m.Leaving {
		m.Leaving = true
		s.members[nodeID] = m
		s.version++
	}
	return m, nil
}

// Fenced runs write atomically with a check of every non-zero fence, as a
// PostgreSQL commit does (SELECT ... FOR SHARE on the lease rows, then the
// writes, in one transaction): write runs only if every fence still holds,
// else Fenced returns a *sequencer.StaleFenceError listing the stale ones.
// While write runs, no Acquire can take a fenced partition.
func (s *Mem) Fenced(fences []sequencer.Fence, write func()) error {
	return s.FencedCommit(fences, false, func() error {
		if write != nil {
			write()
		}
		return nil
	})
}

// FencedCommit is the in-commit check of an in-memory store (memstore):
// every non-zero fence of fences must hold (else *sequencer.StaleFenceError),
// and an unfenced commit (unfenced set) is refused with sequencer.ErrUnfenced
// while any partition is held; then write runs, with no Acquire or Release
// in between, and its error is returned.
func (s *Mem) FencedCommit(fences []sequencer.Fence, unfenced bool, write func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	holds := func(f sequencer.Fence) (bool, error) {
		if f.IsZero() {
			return true, nil
		}
		l, ok := s.leases[f.Partition]
		return LeaseHolds(f, sequencer.Fence{Partition: l.Partition, Owner: l.Owner, Epoch: l.Epoch}, ok), nil
	}
	held := func() (bool, error) {
		for _, l := range s.leases {
			if l.Owner != "" {
				return true, nil
			}
		}
		return false, nil
	}
	if err := CheckFences(fences, unfenced, holds, held); err != nil {
		return err
	}
	return write()
}

// PutLeaseForTest makes partition f.Partition held by f.Owner at f.Epoch
// (f.Owner "": released), whatever the members.
func (s *Mem) PutLeaseForTest(f sequencer.Fence) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leases[f.Partition] = PartitionLease{Partition: f.Partition, Owner: f.Owner, Epoch: f.Epoch}
}
