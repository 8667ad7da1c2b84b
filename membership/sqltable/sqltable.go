// Package sqltable is membership.Store over a SQL database: the member and
// partition-lease transitions (Join, Heartbeat, Leave, Remove, Acquire,
// Release, View, Rows, RequestDrain) written once, in Go, for every shared
// store (persist/postgres, Citus's coordinator, persist/mysql). A driver
// gives only its SQL, as a Dialect whose Tx methods each run one statement
// (or the few its database needs) inside the transaction Table opens, the
// way database/sql leaves the rules to itself and the wire to its drivers.
// The statements whose SQL differs only in placeholders and quoting are
// written once too (Stmts, over a driver's Conn: TxConn for database/sql);
// a driver spells only the rest.
//
// Time comes from the database (the version row's read returns the
// transaction's clock), so nodes with skewed clocks agree on who expired.
// Membership changes lock the version row for update, which orders them;
// Acquire locks the partition rows it may take in partition order first
// (waiting for the in-flight commits fenced with their current epochs),
// then reads the version row shared; the driver says how (its Tx).
//
// It never decides which node should own a partition (package ring) and
// never talks to nodes.
package sqltable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sequencer-im/sequencer/membership"
)

// Lock is how a transaction reads the version row.
type Lock int

const (
	NoLock    Lock = iota // a plain read
	ForUpdate             // membership changes: ordered by this row
	ForShare              // a consistent view
)

// Dialect is a driver's side: it runs f in one transaction after reading the
// version row with lock, passing the version and the database's time (UTC).
// f's error rolls back and is returned as it is; a driver maps only the
// errors of its database (Classify).
type Dialect interface {
	InTx(ctx context.Context, lock Lock, f func(tx Tx, version uint64, now time.Time) error) error
	// Classify maps an error of the database (not a membership one) for
	// operation op (persist's retryable store errors).
	Classify(op string, err error) error
}

// Tx is one transaction of the membership tables, in a driver's SQL.
type Tx interface {
	// Bump adds one to the version and returns it.
	Bump(ctx context.Context) (uint64, error)
	// Expire deletes the members whose lease ended before now, and reports
	// whether it deleted any.
	Expire(ctx context.Context, now time.Time) (bool, error)
	// Live returns the members whose lease lasts until now or later, with
	// every field (any order).
	Live(ctx context.Context, now time.Time) ([]membership.Member, error)
	// Leases returns every partition lease row (any order).
	Leases(ctx context.Context) ([]membership.PartitionLease, error)
	// Member reads nodeID's row (expired or not: NodeID, Incarnation,
	// addresses, Leaving, LeaseUntil), found false when there is none.
	Member(ctx context.Context, nodeID string) (m membership.Member, found bool, err error)
	// Incompatible returns a live member other than m.NodeID whose
	// Partitions or Protocol differ from m's, found false when none.
	Incompatible(ctx context.Context, m membership.Member, now time.Time) (other membership.Member, found bool, err error)
	// Upsert writes m's row (LeaseUntil as given), keeping joined_at when
	// the incarnation is unchanged and setting it to now otherwise.
	Upsert(ctx context.Context, m membership.Member, now time.Time) error
	// Renew sets the lease of (nodeID, incarnation) to until.
	Renew(ctx context.Context, nodeID, incarnation string, until time.Time) error
	// SetLeaving marks (nodeID, incarnation) leaving.
	SetLeaving(ctx context.Context, nodeID, incarnation string) error
	// Delete deletes (nodeID, incarnation)'s row and reports whether there
	// was one.
	Delete(ctx context.Context, nodeID, incarnation string) (bool, error)
	// Rows returns every member row (expired too) without Partitions,
	// Protocol and Version.
	Rows(ctx context.Context) ([]membership.Member, error)

	// StartLeases prepares a transaction that locks partition rows
	// (Acquire, Release): a lock timeout, a watch on sessions that block
	// it. stop is called before the transaction ends.
	StartLeases(ctx context.Context) (stop func(), err error)
	// ActiveMember reports whether incarnation is a live member that is not
	// leaving.
	ActiveMember(ctx context.Context, incarnation string, now time.Time) (bool, error)
	// LockTakeable locks, in partition order, the rows of partitions (sorted,
	// distinct) that incarnation may take: free (owner ""), its own, or of
	// an owner that is not a live member at now (checked under the lock).
	// It returns their partitions; rows that do not exist are not returned.
	LockTakeable(ctx context.Context, incarnation string, partitions []uint32, now time.Time) ([]uint32, error)
	// VersionShared reads the version row, locked shared.
	VersionShared(ctx context.Context) (uint64, error)
	// Take sets the owner of the rows of partitions (locked by
	// LockTakeable) to incarnation and adds one to their epochs; it returns
	// the leases.
	Take(ctx context.Context, incarnation string, partitions []uint32) ([]membership.PartitionLease, error)
	// Insert creates the rows of partitions that have none, owned by
	// incarnation at epoch 1 (a row another transaction inserted meanwhile
	// wins), and returns the leases it created.
	Insert(ctx context.Context, incarnation string, partitions []uint32) ([]membership.PartitionLease, error)
	// Release frees the leases (sorted by partition) whose row still names
	// their owner at their epoch, locking them in partition order.
	Release(ctx context.Context, leases []membership.PartitionLease) error
}

// Table is membership.Store over a Dialect.
type Table struct {
	d Dialect
}

var _ membership.Store = (*Table)(nil)

// New returns the membership table of d.
func New(d Dialect) *Table { return &Table{d: d} }

// errStale ends an Acquire that takes nothing (the caller is no active
// member, or the version moved).
var errStale = errors.New("stale")

func (t *Table) inTx(ctx context.Context, op string, lock Lock, f func(tx Tx, version uint64, now time.Time) error) error {
	err := t.d.InTx(ctx, lock, f)
	if err == nil || errors.Is(err, errStale) || errors.Is(err, membership.ErrMemberGone) || errors.Is(err, membership.ErrSuperseded) ||
		errors.Is(err, membership.ErrNoSuchMember) || errors.Is(err, membership.ErrIncompatible) {
		return err
	}
	return t.d.Classify("cluster "+op, err)
}

func readView(ctx context.Context, tx Tx, version uint64, now time.Time) (membership.View, error) {
	v := membership.View{Version: version, Now: now}
	var err error
	if v.Members, err = tx.Live(ctx, now); err != nil {
		return v, err
	}
	for i := range v.Members {
		v.Members[i].LeaseUntil = v.Members[i].LeaseUntil.UTC()
	}
	// Go's byte order, not the database collation: View.Member searches it.
	slices.SortFunc(v.Members, func(a, b membership.Member) int { return cmp.Compare(a.NodeID, b.NodeID) })
	if v.Leases, err = tx.Leases(ctx); err != nil {
		return v, err
	}
	slices.SortFunc(v.Leases, func(a, b membership.PartitionLease) int { return cmp.Compare(a.Partition, b.Partition) })
	return v, nil
}

// own checks that (nodeID, incarnation) has a live row.
func own(ctx context.Context, tx Tx, nodeID, incarnation string, now time.Time) (membership.Member, error) {
	r, ok, err := tx.Member(ctx, nodeID)
	switch {
	case err != nil:
		return r, err
	case !ok || (r.Incarnation == incarnation && r.LeaseUntil.Before(now)):
		return r, fmt.Errorf("member %s (%s): %w", nodeID, incarnation, membership.ErrMemberGone)
	case r.Incarnation != incarnation:
		if !r.LeaseUntil.Before(now) {
			return r, fmt.Errorf("member %s (%s): %w (held by %s)", nodeID, incarnation, membership.ErrSuperseded, r.Incarnation)
		}
		return r, fmt.Errorf("member %s (%s): %w", nodeID, incarnation, membership.ErrMemberGone)
	}
	return r, nil
}

func (t *Table) Join(ctx context.Context, m membership.Member, ttl time.Duration, takeOver bool) (membership.View, error) {
	if m.NodeID == "" || m.Incarnation == "" {
		return membership.View{}, errors.New("cluster join needs a node id and an incarnation")
	}
	var view membership.View
	err := t.inTx(ctx, "join", ForUpdate, func(tx Tx, version uint64, now time.Time) error {
		old, ok, err := tx.Member(ctx, m.NodeID)
		if err != nil {
			return err
		}
		live := ok && !old.LeaseUntil.Before(now)
		if live && old.Incarnation != m.Incarnation && !takeOver {
			return fmt.Errorf("join %s as %s: %w (held by %s)", m.NodeID, m.Incarnation, membership.ErrSuperseded, old.Incarnation)
		}
		other, found, err := tx.Incompatible(ctx, m, now)
		if err != nil {
			return err
		}
		if found {
			return fmt.Errorf("join %s (%d partitions, protocol %d): %w: %s has %d partitions, protocol %d",
				m.NodeID, m.Partitions, m.Protocol, membership.ErrIncompatible, other.NodeID, other.Partitions, other.Protocol)
		}
		row := m
		row.Leaving = live && old.Incarnation == m.Incarnation && old.Leaving
		row.LeaseUntil = now.Add(ttl)
		changed := !live || old.Incarnation != m.Incarnation || old.ClusterAddr != m.ClusterAddr || old.APIAddr != m.APIAddr
		if err := tx.Upsert(ctx, row, now); err != nil {
			return err
		}
		expired, err := tx.Expire(ctx, now)
		if err != nil {
			return err
		}
		if changed || expired {
			if version, err = tx.Bump(ctx); err != nil {
				return err
			}
		}
		view, err = readView(ctx, tx, version, now)
		return err
	})
	return view, err
}

func (t *Table) Heartbeat(ctx context.Context, nodeID, incarnation string, ttl time.Duration) (membership.View, error) {
	var view membership.View
	var gone error
	err := t.inTx(ctx, "heartbeat", ForUpdate, func(tx Tx, version uint64, now time.Time) error {
		_, gone = own(ctx, tx, nodeID, incarnation, now)
		if gone != nil && !errors.Is(gone, membership.ErrMemberGone) && !errors.Is(gone, membership.ErrSuperseded) {
			return gone
		}
		if gone == nil {
			if err := tx.Renew(ctx, nodeID, incarnation, now.Add(ttl)); err != nil {
				return err
			}
		}
		expired, err := tx.Expire(ctx, now)
		if err != nil {
			return err
		}
		if expired {
			if version, err = tx.Bump(ctx); err != nil {
				return err
			}
		}
		if gone != nil {
			return nil // commit the cleanup, report gone
		}
		view, err = readView(ctx, tx, version, now)
		return err
	})
	if err == nil && gone != nil {
		return membership.View{}, gone
	}
	return view, err
}

func (t *Table) Leave(ctx context.Context, nodeID, incarnation string) (membership.View, error) {
	var view membership.View
	err := t.inTx(ctx, "leave", ForUpdate, func(tx Tx, version uint64, now time.Time) error {
		r, err := own(ctx, tx, nodeID, incarnation, now)
		if err != nil {
			return err
		}
		if !r.Leaving {
			if err := tx.SetLeaving(ctx, nodeID, incarnation); err != nil {
				return err
			}
			if version, err = tx.Bump(ctx); err != nil {
				return err
			}
		}
		view, err = readView(ctx, tx, version, now)
		return err
	})
	return view, err
}

func (t *Table) Remove(ctx context.Context, nodeID, incarnation string) error {
	return t.inTx(ctx, "remove", ForUpdate, func(tx Tx, _ uint64, _ time.Time) error {
		deleted, err := tx.Delete(ctx, nodeID, incarnation)
		if err == nil && deleted {
			_, err = tx.Bump(ctx)
		}
		return err
	})
}

func (t *Table) Acquire(ctx context.Context, incarnation string, version uint64, partitions []uint32) ([]membership.PartitionLease, error) {
	ps := slices.Clone(partitions)
	slices.Sort(ps)
	ps = slices.Compact(ps)
	if len(ps) == 0 {
		return nil, nil
	}
	var taken []membership.PartitionLease
	// The version row is locked only after the partition rows, so the
	// transaction starts without it.
	err := t.inTx(ctx, "acquire", NoLock, func(tx Tx, _ uint64, now time.Time) error {
		taken = nil
		stop, err := tx.StartLeases(ctx)
		if err != nil {
			return err
		}
		defer stop()
		self, err := tx.ActiveMember(ctx, incarnation, now)
		if err != nil {
			return err
		}
		if !self {
			return errStale
		}
		// Lock the takeable rows in partition order: this waits for the
		// in-flight commits fenced with the current epochs.
		locked, err := tx.LockTakeable(ctx, incarnation, ps, now)
		if err != nil {
			return err
		}
		current, err := tx.VersionShared(ctx)
		if err != nil {
			return err
		}
		if current != version {
			return errStale
		}
		if len(locked) > 0 {
			got, err := tx.Take(ctx, incarnation, locked)
			if err != nil {
				return err
			}
			taken = append(taken, got...)
		}
		// Partitions never leased get their first row (epoch 1); a row
		// another node inserts meanwhile wins.
		got, err := tx.Insert(ctx, incarnation, ps)
		taken = append(taken, got...)
		return err
	})
	if errors.Is(err, errStale) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	slices.SortFunc(taken, func(a, b membership.PartitionLease) int { return cmp.Compare(a.Partition, b.Partition) })
	return taken, nil
}

func (t *Table) Release(ctx context.Context, leases []membership.PartitionLease) error {
	var held []membership.PartitionLease
	for _, l := range leases {
		if l.Owner != "" {
			held = append(held, l)
		}
	}
	if len(held) == 0 {
		return nil
	}
	slices.SortFunc(held, func(a, b membership.PartitionLease) int { return cmp.Compare(a.Partition, b.Partition) })
	return t.inTx(ctx, "release", NoLock, func(tx Tx, _ uint64, _ time.Time) error {
		stop, err := tx.StartLeases(ctx)
		if err != nil {
			return err
		}
		defer stop()
		return tx.Release(ctx, held)
	})
}

func (t *Table) View(ctx context.Context) (membership.View, error) {
	var view membership.View
	err := t.inTx(ctx, "view", ForShare, func(tx Tx, version uint64, now time.Time) error {
		var err error
		view, err = readView(ctx, tx, version, now)
		return err
	})
	return view, err
}

func (t *Table) Rows(ctx context.Context) ([]membership.Member, time.Time, error) {
	var ms []membership.Member
	var at time.Time
	err := t.inTx(ctx, "rows", NoLock, func(tx Tx, _ uint64, now time.Time) error {
		at = now
		var err error
		ms, err = tx.Rows(ctx)
		return err
	})
	for i := range ms {
		ms[i].LeaseUntil = ms[i].LeaseUntil.UTC()
	}
	slices.SortFunc(ms, func(a, b membership.Member) int { return cmp.Compare(a.NodeID, b.NodeID) })
	return ms, at, err
}

func (t *Table) RequestDrain(ctx context.Context, nodeID string) (membership.Member, error) {
	var m membership.Member
	err := t.inTx(ctx, "request drain", ForUpdate, func(tx Tx, _ uint64, now time.Time) error {
		r, ok, err := tx.Member(ctx, nodeID)
		switch {
		case err != nil:
			return err
		case !ok || r.LeaseUntil.Before(now):
			return fmt.Errorf("drain %s: %w", nodeID, membership.ErrNoSuchMember)
		}
		if !r.Leaving {
			if err := tx.SetLeaving(ctx, nodeID, r.Incarnation); err != nil {
				return err
			}
			if _, err := tx.Bump(ctx); err != nil {
				return err
			}
		}
		m = membership.Member{NodeID: nodeID, Incarnation: r.Incarnation, ClusterAddr: r.ClusterAddr, APIAddr: r.APIAddr,
			Leaving: true, LeaseUntil: r.LeaseUntil.UTC()}
		return nil
	})
	return m, err
}
