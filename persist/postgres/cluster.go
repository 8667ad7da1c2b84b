package postgres

import (
	"context"
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
	return c.with(func(cp *ClusterStore) { cp.clock = clk })
}

// with returns a copy of c changed by f.
func (c *ClusterStore) with(f func(*ClusterStore)) *ClusterStore {
	cp := *c
	f(&cp)
	cp.Table = sqltable.New(&cp)
	return &cp
}

// WithLockTimeout returns a copy of c with another partition-row lock
// timeout (> 0).
func (c *ClusterStore) WithLockTimeout(d time.Duration) *ClusterStore {
	return c.with(func(cp *ClusterStore) {
		if d > 0 {
			cp.lockTimeout = d
		}
	})
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
		return f(newPgTx(tx, c), uint64(version), now.UTC())
	})
}

// Classify maps a database error (sqltable.Dialect).
func (c *ClusterStore) Classify(op string, err error) error { return classify(op, err) }

// pgTx is sqltable.Tx in PostgreSQL's SQL: the common statements
// (sqltable.Stmts, with $n placeholders) and the ones spelled here.
type pgTx struct {
	sqltable.Stmts
	tx pgx.Tx
	c  *ClusterStore
}

func newPgTx(tx pgx.Tx, c *ClusterStore) pgTx {
	return pgTx{Stmts: sqltable.Stmts{C: pgConn{tx}, Rebind: sqltable.Placeholders}, tx: tx, c: c}
}

// pgConn is sqltable.Conn over a pgx transaction.
type pgConn struct{ tx pgx.Tx }

func (c pgConn) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := c.tx.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (c pgConn) Query(ctx context.Context, q string, args []any, row func(scan func(...any) error) error) error {
	rows, err := c.tx.Query(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return sqltable.EachRow(rows.Next, rows.Scan, rows.Err, row)
}

func (c pgConn) QueryRow(ctx context.Context, q string, args []any, dst ...any) (bool, error) {
	return sqltable.Found(c.tx.QueryRow(ctx, q, args...).Scan(dst...), pgx.ErrNoRows)
}

func (t pgTx) Bump(ctx context.Context) (uint64, error) {
	var v int64
	err := t.tx.QueryRow(ctx, `UPDATE cluster_version SET version = version + 1 WHERE id RETURNING version`).Scan(&v)
	return uint64(v), err
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

func int64s(ps []uint32) []int64 {
	out := make([]int64, len(ps))
	for i, p := range ps {
		out[i] = int64(p)
	}
	return out
}

func (t pgTx) LockTakeable(ctx context.Context, incarnation string, partitions []uint32, now time.Time) ([]uint32, error) {
	return t.PartitionRows(ctx, `SELECT l.partition FROM partition_lease l
		WHERE l.partition = ANY($1::int[])
		  AND (l.owner = '' OR l.owner = $2 OR NOT EXISTS (
		    SELECT 1 FROM cluster_member m WHERE m.incarnation = l.owner AND m.lease_until >= $3))
		ORDER BY l.partition FOR UPDATE`, int64s(partitions), incarnation, now)
}

func (t pgTx) VersionShared(ctx context.Context) (uint64, error) {
	var v int64
	err := t.tx.QueryRow(ctx, `SELECT version FROM cluster_version WHERE id FOR SHARE`).Scan(&v)
	return uint64(v), err
}

func (t pgTx) Take(ctx context.Context, incarnation string, partitions []uint32) ([]membership.PartitionLease, error) {
	return t.LeaseRows(ctx, `UPDATE partition_lease SET owner = $2, epoch = epoch + 1
		WHERE partition = ANY($1::int[]) RETURNING partition, owner, epoch`, int64s(partitions), incarnation)
}

func (t pgTx) Insert(ctx context.Context, incarnation string, partitions []uint32) ([]membership.PartitionLease, error) {
	return t.LeaseRows(ctx, `INSERT INTO partition_lease (partition, owner, epoch)
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
