package citus

import (
	"context"
	"time"

	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

// Fencing on Citus (the argument; docs/CITUS.md repeats it).
//
// On one PostgreSQL a commit locks its partition leases FOR SHARE and checks
// them in its transaction. On Citus partition_lease is a coordinator table,
// so that check would be a cross-node read (and a distributed transaction)
// on every commit. Instead the fence travels with the conversation: its
// head row carries the epoch of the owner that last moved it, and a commit
// moves a head only by compare-and-set: head = expected AND epoch <= mine,
// setting epoch = mine (seq_cas_heads, migrations_citus/0003). Epochs of a
// partition only grow, and each conversation belongs to one partition
// (the ring's partition count is fixed for a cluster).
//
//   - A stale owner (epoch e) can never commit after a newer owner (epoch
//     e' > e) wrote the conversation: that write set the row's epoch to e',
//     and every later compare-and-set with e fails (epoch <= e is false):
//     the stale owner gets StaleFenceError (never HeadMismatch, so it does
//     not re-read and retry), and nothing of its commit is written.
//   - A stale owner committing before the newer owner's first write is
//     harmless: its commit is an ordinary compare-and-set on the head row,
//     serialized by the row lock, so its seqs are contiguous and durable;
//     the newer owner's own compare-and-set then fails (head mismatch), it
//     re-reads the head and the rows (which include the stale owner's
//     messages, answered to their senders as stored: they are), and goes
//     on from there. Contiguity never depended on the lease: the head
//     compare-and-set alone keeps every stored seq gap-free and unique.
//   - The lease table still decides routing and liveness, and the store
//     refuses early, without sending anything, a fence its cached copy of
//     partition_lease (read from the coordinator at most every LeaseTTL,
//     off the commit, and at once when a fence does not match it) says is
//     not held: the common stale case costs no worker round trip.
//   - A node without a cluster (zero fence) on a database a cluster uses:
//     refused with persist.ErrUnfenced when the cached lease table shows a
//     held lease (re-read every LeaseTTL, so a node started without
//     --cluster-listen is refused from its first commit). Within the cache
//     window, or for a conversation no cluster node wrote, an unfenced
//     commit that lands is again an ordinary compare-and-set: contiguous,
//     and the owner's next compare-and-set re-reads.

// leaseView returns the cached partition leases, re-reading them when older
// than LeaseTTL or when force.
func (s *Store) leaseView(ctx context.Context, force bool) (map[uint32]persist.Fence, bool, error) {
	d := s.dist
	d.leaseMu.Lock()
	defer d.leaseMu.Unlock()
	if !force && d.leases != nil && time.Since(d.leasesAt) < LeaseTTL {
		return d.leases, d.leasesHeld, nil
	}
	m, held, err := s.readLeases(ctx)
	if err != nil {
		if d.leases != nil {
			// The coordinator does not answer (or closed the connection
			// mid-read: a cached prepared statement reports that in the
			// rows, not in Query): the cached copy still refuses what it
			// knows is stale; the head rows' epochs fence the rest (see
			// above).
			return d.leases, d.leasesHeld, nil
		}
		return nil, false, postgres.Unavailable("citus: read partition leases", err)
	}
	d.leases, d.leasesHeld, d.leasesAt = m, held, time.Now()
	return m, held, nil
}

// readLeases reads partition_lease from the coordinator.
func (s *Store) readLeases(ctx context.Context) (map[uint32]persist.Fence, bool, error) {
	rows, err := s.ControlPool().Query(ctx, `SELECT partition, owner, epoch FROM partition_lease`)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	m := map[uint32]persist.Fence{}
	held := false
	for rows.Next() {
		var p, e int64
		var o string
		if err := rows.Scan(&p, &o, &e); err != nil {
			return nil, false, err
		}
		m[uint32(p)] = persist.Fence{Partition: uint32(p), Owner: o, Epoch: uint64(e)}
		held = held || o != ""
	}
	return m, held, rows.Err()
}

// forgetLeases drops the lease cache (tests that change leases directly).
func (s *Store) forgetLeases() {
	s.dist.leaseMu.Lock()
	s.dist.leases = nil
	s.dist.leaseMu.Unlock()
}

// checkFences refuses, before anything is sent, fences the lease table (as
// cached, re-read once when it disagrees) says are not held, and unfenced
// batches while a cluster holds leases.
func (s *Store) checkFences(ctx context.Context, batches []persist.ConvBatch) error {
	if s.dist.noLeaseCheck {
		return nil
	}
	leases, held, err := s.leaseView(ctx, false)
	if err != nil {
		return err
	}
	fences, unfenced := persist.Fences(batches)
	check := func(leases map[uint32]persist.Fence, held bool) error {
		return membership.CheckFences(fences, unfenced, membership.InLeases(leases), func() (bool, error) { return held, nil })
	}
	if check(leases, held) == nil {
		return nil
	}
	if leases, held, err = s.leaseView(ctx, true); err != nil {
		return err
	}
	return check(leases, held)
}
