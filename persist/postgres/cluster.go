package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/membership/sqltable"
)

// ClusterStore is the cluster's membership and partition-lease table
// (membership.Store) in the store's database: cluster_member and
// cluster_version (migration 0002) and partition_lease, the table Commit
// checks fences against. Every method is one transaction; lease times come
// from the database clock (now(), the transaction's start), so nodes with
// skewed clocks agree on who expired.
//
// The transitions are membership/sqltable's; this file is their SQL
// (pgTx). Locking: membership changes lock the cluster_version row FOR UPDATE, which
// orders them. Acquire and Release lock the partition_lease rows they change
// FOR UPDATE in partition order (the order Commit takes them FOR SHARE), so
// taking a lease waits for every in-flight commit fenced with the old epoch
// and no two of them deadlock. Acquire takes the version row (FOR SHARE) only
// after the partition rows, so a commit stuck in flight (a frozen node's open
// transaction) delays that acquire, never the heartbeats of the cluster.
type ClusterStore struct {
	*sqltable.Table // the transitions, over this dialect
	pool            *pgxpool.Pool
	// clock, when set, replaces the database clock (tests).
	clock clock.Clock
	// lockTimeout bounds the wait for partition rows in Acquire and Release
	// (a stuck in-flight commit); past it they fail and the caller retries.
	lockTimeout time.Duration
	// stuckAfter: a session that blocks an Acquire while idle in a
	// transaction for this long is terminated (see Acquire).
	stuckAfter time.Duration
}

var (
	_ membership.Store    = (*ClusterStore)(nil)
	_ membership.Provider = (*Store)(nil)
)

// Defaults of ClusterStore.
const (
	// DefaultLockTimeout is how long Acquire and Release wait for partition
	// rows locked by in-flight commits before failing (the node retries).
	DefaultLockTimeout = 2 * time.Second
	// DefaultStuckAfter is how long a session blocking an Acquire may sit
	// idle in its transaction before Acquire terminates it. A commit is
	// idle in its transaction only between its pipelined statements and its
	// COMMIT (one round trip); longer means the process holding it is frozen
	// or cut off.
	DefaultStuckAfter = time.Second
)

// Cluster returns the membership table of this store's database, on the
// store's control pool (reads and commits cannot starve heartbeats), which
// follows the same server as the other pools.
func (s *Store) Cluster() *ClusterStore {
	c := &ClusterStore{pool: s.control, lockTimeout: DefaultLockTimeout, stuckAfter: DefaultStuckAfter}
	c.Table = sqltable.New(c)
	return c
}

// Membership is Cluster as the membership.Store a cluster node needs (the
// capability server asks a store for: membership.Provider).
func (s *Store) Membership() membership.Store { return s.Cluster() }

// WithClock returns a copy of c that reads time from clk instead of the
// database clock. For tests that move time by hand; a cluster must use the
// database clock.
func (c *ClusterStore) WithClock(clk clock.Clock) *ClusterStore {
	cp := *c
	cp.clock = clk
	cp.Table = sqltable.New(&cp)
	return &cp
}

// WithLockTimeout returns a copy of c with another partition-row lock
// timeout (> 0).
func (c *ClusterStore) WithLockTimeout(d time.Duration) *ClusterStore {
	cp := *c
	if d > 0 {
		cp.lockTimeout = d
	}
	cp.Table = sqltable.New(&cp)
	return &cp
}

func (c *ClusterStore) nowArg() any {
	if c.clock == nil {
		return nil
	}
	return c.clock.Now()
}

// InTx runs f in one transaction after reading the version row with lock
// and the transaction's time (sqltable.Dialect).
func (c *ClusterStore) InTx(ctx context.Context, lock sqltable.Lock, f func(tx sqltable.Tx, version uint64, now time.Time) error) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		q := `SELECT version, coalesce($1::timestamptz, now()) FROM cluster_version WHERE id`
		switch lock {
		case sqltable.ForUpdate:
			q += " FOR UPDATE"
		case sqltable.ForShare:
			q += " FOR SHARE"
		}
		var version int64
		var now time.Time
		if err := tx.QueryRow(ctx, q, c.nowArg()).Scan(&version, &now); err != nil {
			return err
		}
		return f(pgTx{tx: tx, c: c}, uint64(version), now.UTC())
	})
}

// Classify maps a database error (sqltable.Dialect).
func (c *ClusterStore) Classify(op string, err error) error { return classify(op, err) }

// pgTx is sqltable.Tx in PostgreSQL's SQL.
type pgTx struct {
	tx pgx.Tx
	c  *ClusterStore
}

func (t pgTx) Bump(ctx context.Context) (uint64, error) {
	var v int64
	err := t.tx.QueryRow(ctx, `UPDATE cluster_version SET version = version + 1 WHERE id RETURNING version`).Scan(&v)
	return uint64(v), err
}

func (t pgTx) Expire(ctx context.Context, now time.Time) (bool, error) {
	tag, err := t.tx.Exec(ctx, `DELETE FROM cluster_member WHERE lease_until < $1`, now)
	return err == nil && tag.RowsAffected() > 0, err
}

func (t pgTx) members(ctx context.Context, q string, args ...any) ([]membership.Member, error) {
	rows, err := t.tx.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (membership.Member, error) {
		var m membership.Member
		dst := []any{&m.NodeID, &m.Incarnation, &m.ClusterAddr, &m.APIAddr, &m.Leaving, &m.LeaseUntil, &m.Partitions, &m.Protocol, &m.Version}
		return m, r.Scan(dst[:len(r.FieldDescriptions())]...)
	})
}

func (t pgTx) Live(ctx context.Context, now time.Time) ([]membership.Member, error) {
	return t.members(ctx, `SELECT node_id, incarnation, cluster_addr, api_addr, leaving, lease_until, partitions, protocol, version
		FROM cluster_member WHERE lease_until >= $1`, now)
}

func (t pgTx) Rows(ctx context.Context) ([]membership.Member, error) {
	return t.members(ctx, `SELECT node_id, incarnation, cluster_addr, api_addr, leaving, lease_until FROM cluster_member`)
}

func (t pgTx) leases(ctx context.Context, q string, args ...any) ([]membership.PartitionLease, error) {
	rows, err := t.tx.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (membership.PartitionLease, error) {
		var p, epoch int64
		var owner string
		err := r.Scan(&p, &owner, &epoch)
		return membership.PartitionLease{Partition: uint32(p), Owner: owner, Epoch: uint64(epoch)}, err
	})
}

func (t pgTx) Leases(ctx context.Context) ([]membership.PartitionLease, error) {
	return t.leases(ctx, `SELECT partition, owner, epoch FROM partition_lease ORDER BY partition`)
}

func (t pgTx) Member(ctx context.Context, nodeID string) (membership.Member, bool, error) {
	m := membership.Member{NodeID: nodeID}
	err := t.tx.QueryRow(ctx, `SELECT incarnation, cluster_addr, api_addr, leaving, lease_until
		FROM cluster_member WHERE node_id = $1`, nodeID).Scan(&m.Incarnation, &m.ClusterAddr, &m.APIAddr, &m.Leaving, &m.LeaseUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return m, false, nil
	}
	return m, err == nil, err
}

func (t pgTx) Incompatible(ctx context.Context, m membership.Member, now time.Time) (membership.Member, bool, error) {
	var o membership.Member
	err := t.tx.QueryRow(ctx, `SELECT node_id, partitions, protocol FROM cluster_member
		WHERE node_id <> $1 AND lease_until >= $2 AND (partitions <> $3 OR protocol <> $4) LIMIT 1`,
		m.NodeID, now, m.Partitions, m.Protocol).Scan(&o.NodeID, &o.Partitions, &o.Protocol)
	if errors.Is(err, pgx.ErrNoRows) {
		return o, false, nil
	}
	return o, err == nil, err
}

func (t pgTx) Upsert(ctx context.Context, m membership.Member, now time.Time) error {
	_, err := t.tx.Exec(ctx, `INSERT INTO cluster_member (node_id, incarnation, cluster_addr, api_addr, leaving, lease_until, partitions, protocol, version)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (node_id) DO UPDATE SET incarnation = EXCLUDED.incarnation, cluster_addr = EXCLUDED.cluster_addr,
		  api_addr = EXCLUDED.api_addr, leaving = EXCLUDED.leaving, lease_until = EXCLUDED.lease_until,
		  partitions = EXCLUDED.partitions, protocol = EXCLUDED.protocol, version = EXCLUDED.version,
		  joined_at = CASE WHEN cluster_member.incarnation = EXCLUDED.incarnation THEN cluster_member.joined_at ELSE now() END`,
		m.NodeID, m.Incarnation, m.ClusterAddr, m.APIAddr, m.Leaving, m.LeaseUntil, m.Partitions, m.Protocol, m.Version)
	return err
}

func (t pgTx) Renew(ctx context.Context, nodeID, incarnation string, until time.Time) error {
	_, err := t.tx.Exec(ctx, `UPDATE cluster_member SET lease_until = $3 WHERE node_id = $1 AND incarnation = $2`, nodeID, incarnation, until)
	return err
}

func (t pgTx) SetLeaving(ctx context.Context, nodeID, incarnation string) error {
	_, err := t.tx.Exec(ctx, `UPDATE cluster_member SET leaving = true WHERE node_id = $1 AND incarnation = $2`, nodeID, incarnation)
	return err
}

func (t pgTx) Delete(ctx context.Context, nodeID, incarnation string) (bool, error) {
	tag, err := t.tx.Exec(ctx, `DELETE FROM cluster_member WHERE node_id = $1 AND incarnation = $2`, nodeID, incarnation)
	return err == nil && tag.RowsAffected() > 0, err
}

// StartLeases bounds the wait for partition rows (lockTimeout) and reaps
// the idle-in-transaction sessions that block this one (reapBlockers).
func (t pgTx) StartLeases(ctx context.Context) (func(), error) {
	if _, err := t.tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", t.c.lockTimeout.Milliseconds())); err != nil {
		return nil, err
	}
	var pid int32
	if err := t.tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return nil, err
	}
	return t.c.reapBlockers(ctx, pid), nil
}

func (t pgTx) ActiveMember(ctx context.Context, incarnation string, now time.Time) (bool, error) {
	var self bool
	err := t.tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM cluster_member
		WHERE incarnation = $1 AND NOT leaving AND lease_until >= $2)`, incarnation, now).Scan(&self)
	return self, err
}

func int64s(ps []uint32) []int64 {
	out := make([]int64, len(ps))
	for i, p := range ps {
		out[i] = int64(p)
	}
	return out
}

func (t pgTx) LockTakeable(ctx context.Context, incarnation string, partitions []uint32, now time.Time) ([]uint32, error) {
	rows, err := t.tx.Query(ctx, `SELECT l.partition FROM partition_lease l
		WHERE l.partition = ANY($1::int[])
		  AND (l.owner = '' OR l.owner = $2 OR NOT EXISTS (
		    SELECT 1 FROM cluster_member m WHERE m.incarnation = l.owner AND m.lease_until >= $3))
		ORDER BY l.partition FOR UPDATE`, int64s(partitions), incarnation, now)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (uint32, error) {
		var p int64
		err := r.Scan(&p)
		return uint32(p), err
	})
}

func (t pgTx) VersionShared(ctx context.Context) (uint64, error) {
	var v int64
	err := t.tx.QueryRow(ctx, `SELECT version FROM cluster_version WHERE id FOR SHARE`).Scan(&v)
	return uint64(v), err
}

func (t pgTx) Take(ctx context.Context, incarnation string, partitions []uint32) ([]membership.PartitionLease, error) {
	return t.leases(ctx, `UPDATE partition_lease SET owner = $2, epoch = epoch + 1
		WHERE partition = ANY($1::int[]) RETURNING partition, owner, epoch`, int64s(partitions), incarnation)
}

func (t pgTx) Insert(ctx context.Context, incarnation string, partitions []uint32) ([]membership.PartitionLease, error) {
	return t.leases(ctx, `INSERT INTO partition_lease (partition, owner, epoch)
		SELECT p, $2, 1 FROM unnest($1::int[]) AS p ORDER BY p
		ON CONFLICT (partition) DO NOTHING RETURNING partition, owner, epoch`, int64s(partitions), incarnation)
}

func (t pgTx) Release(ctx context.Context, leases []membership.PartitionLease) error {
	parts, owners, epochs := make([]int64, len(leases)), make([]string, len(leases)), make([]int64, len(leases))
	for i, l := range leases {
		parts[i], owners[i], epochs[i] = int64(l.Partition), l.Owner, int64(l.Epoch)
	}
	_, err := t.tx.Exec(ctx, `WITH held AS (
		  SELECT l.partition FROM partition_lease l
		  JOIN unnest($1::int[], $2::text[], $3::int8[]) AS r(p, o, e)
		    ON l.partition = r.p AND l.owner = r.o AND l.epoch = r.e
		  ORDER BY l.partition FOR UPDATE OF l)
		UPDATE partition_lease SET owner = '' WHERE partition IN (SELECT partition FROM held)`,
		parts, owners, epochs)
	return err
}

// reapBlockers watches the backend pid (an Acquire waiting for partition
// rows) until the returned stop is called, and terminates every session
// that blocks it while idle in a transaction for at least stuckAfter.
//
// Such a session is a commit whose process froze (SIGSTOP, a VM pause, a cut
// network) between its fence check, which holds the lease row FOR SHARE, and
// its COMMIT: the lease's owner is already presumed dead, or Acquire would
// not want the row. Terminating the session aborts that transaction, so
// nothing of it is written; the frozen process, when it resumes, finds its
// connection gone (an unknown outcome: it re-reads the store) and its fence
// stale. Without this, the partition (and the heads it locked) stays blocked
// until the frozen process resumes. It needs the privilege to signal the
// session (same role, pg_signal_backend or superuser); without it the
// acquire just waits out its lock timeout and is retried.
func (c *ClusterStore) reapBlockers(ctx context.Context, pid int32) (stop func()) {
	if c.stuckAfter <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(c.stuckAfter/4, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			_, _ = c.pool.Exec(ctx, `SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a
				WHERE a.pid = ANY(pg_blocking_pids($1))
				  AND a.state IN ('idle in transaction', 'idle in transaction (aborted)')
				  AND a.state_change <= clock_timestamp() - $2::interval`, pid, c.stuckAfter)
		}
	}()
	return func() { cancel(); <-done }
}

// WithStuckAfter returns a copy of c that terminates sessions blocking an
// Acquire after they sat idle in a transaction for d (0 never does).
func (c *ClusterStore) WithStuckAfter(d time.Duration) *ClusterStore {
	cp := *c
	cp.stuckAfter = d
	cp.Table = sqltable.New(&cp)
	return &cp
}
