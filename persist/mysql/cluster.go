package mysql

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/membership/sqltable"
)

// ClusterStore is the cluster's membership and partition-lease table
// (membership.Store) in the store's database: cluster_member and
// cluster_version (migration 0002) and partition_lease, the table Commit
// checks fences against. Every method is one transaction on the control
// pool; lease times come from the database clock (UTC_TIMESTAMP(3)), so
// nodes with skewed clocks agree on who expired.
//
// The transitions are membership/sqltable's; this file is their SQL
// (myTx). Locking, as in persist/postgres: membership changes lock the
// cluster_version row FOR UPDATE, which orders them. Acquire locks the
// partition_lease rows it takes FOR UPDATE in partition order (Commit reads
// them LOCK IN SHARE MODE), so taking a lease waits for every in-flight
// commit fenced with the old epoch (up to innodb_lock_wait_timeout,
// Options.ControlLockWait; then it fails and the node retries) and fences
// out later ones. Acquire locks only rows it may take (free, its own, or
// of a dead owner, chosen by a plain read and re-checked under the lock),
// never a live owner's, and takes the version row (shared) after them.
type ClusterStore struct {
	*sqltable.Table // the transitions, over this dialect
	db              *sql.DB
	clock           clock.Clock // when set, replaces the database clock (tests)
}

var (
	_ membership.Store    = (*ClusterStore)(nil)
	_ membership.Provider = (*Store)(nil)
)

// Cluster returns the membership table of this store's database.
func (s *Store) Cluster() *ClusterStore {
	c := &ClusterStore{db: s.control}
	c.Table = sqltable.New(c)
	return c
}

// Membership is Cluster as a membership.Store (membership.Provider).
func (s *Store) Membership() membership.Store { return s.Cluster() }

// WithClock returns a copy of c that reads time from clk instead of the
// database clock (tests).
func (c *ClusterStore) WithClock(clk clock.Clock) *ClusterStore {
	cp := *c
	cp.clock = clk
	cp.Table = sqltable.New(&cp)
	return &cp
}

func (c *ClusterStore) nowArg() any {
	if c.clock == nil {
		return nil
	}
	return c.clock.Now().UTC()
}

// InTx runs f in one transaction after reading the version row with lock
// and the transaction's time (sqltable.Dialect).
func (c *ClusterStore) InTx(ctx context.Context, lock sqltable.Lock, f func(tx sqltable.Tx, version uint64, now time.Time) error) error {
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	q := `SELECT version, CAST(COALESCE(?, UTC_TIMESTAMP(3)) AS DATETIME(3)) FROM cluster_version WHERE id = 1`
	switch lock {
	case sqltable.ForUpdate:
		q += " FOR UPDATE"
	case sqltable.ForShare:
		q += " LOCK IN SHARE MODE"
	}
	var version uint64
	var now time.Time
	if err := tx.QueryRowContext(ctx, q, c.nowArg()).Scan(&version, &now); err != nil {
		return err
	}
	if err := f(newMyTx(tx), version, now.UTC()); err != nil {
		return err
	}
	return tx.Commit()
}

// Classify maps a database error (sqltable.Dialect).
func (c *ClusterStore) Classify(op string, err error) error { return unavailable(op, err) }

// myTx is sqltable.Tx in MySQL's SQL: the common statements (sqltable.Stmts,
// with `partition` quoted MySQL's way) and the ones spelled here.
type myTx struct {
	sqltable.Stmts
	tx *sql.Tx
}

func newMyTx(tx *sql.Tx) myTx {
	return myTx{Stmts: sqltable.Stmts{C: sqltable.TxConn{Tx: tx}, Rebind: func(q string) string { return strings.ReplaceAll(q, `"partition"`, "`partition`") }}, tx: tx}
}

func (t myTx) Bump(ctx context.Context) (uint64, error) {
	if _, err := t.tx.ExecContext(ctx, `UPDATE cluster_version SET version = version + 1 WHERE id = 1`); err != nil {
		return 0, err
	}
	var v uint64
	err := t.tx.QueryRowContext(ctx, `SELECT version FROM cluster_version WHERE id = 1`).Scan(&v)
	return v, err
}

func (t myTx) Upsert(ctx context.Context, m membership.Member, now time.Time) error {
	// Another node id's expired row may still hold this incarnation
	// (impossible in practice: incarnations are unique per start).
	_, err := t.tx.ExecContext(ctx, `INSERT INTO cluster_member (node_id, incarnation, cluster_addr, api_addr, leaving, lease_until, joined_at, partitions, protocol, version)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE joined_at = IF(incarnation = VALUES(incarnation), joined_at, VALUES(joined_at)),
		  incarnation = VALUES(incarnation), cluster_addr = VALUES(cluster_addr),
		  api_addr = VALUES(api_addr), leaving = VALUES(leaving), lease_until = VALUES(lease_until),
		  partitions = VALUES(partitions), protocol = VALUES(protocol), version = VALUES(version)`,
		m.NodeID, m.Incarnation, m.ClusterAddr, m.APIAddr, m.Leaving, m.LeaseUntil, now, m.Partitions, m.Protocol, m.Version)
	return err
}

// StartLeases: the lock wait is the control sessions' innodb_lock_wait_timeout
// (Options.ControlLockWait).
func (t myTx) StartLeases(context.Context) (func(), error) { return func() {}, nil }

func anys[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

func inList(n int) string {
	var b strings.Builder
	sqlList(&b, n, "?")
	return b.String()
}

// incarnations returns the set of incarnations q selects.
func (t myTx) incarnations(ctx context.Context, q string, args ...any) (map[string]bool, error) {
	set := map[string]bool{}
	err := t.C.Query(ctx, q, args, func(scan func(...any) error) error {
		var inc string
		err := scan(&inc)
		set[inc] = true
		return err
	})
	return set, err
}

// LockTakeable chooses the candidates by a plain read (never locking a live
// owner's row), locks them in partition order, then checks liveness again
// under the locks (a member that joined meanwhile is live now).
func (t myTx) LockTakeable(ctx context.Context, incarnation string, partitions []uint32, now time.Time) ([]uint32, error) {
	live, err := t.incarnations(ctx, `SELECT incarnation FROM cluster_member WHERE lease_until >= ?`, now)
	if err != nil {
		return nil, err
	}
	existing, err := t.LeaseRows(ctx, "SELECT `partition`, owner, epoch FROM partition_lease WHERE `partition` IN ("+inList(len(partitions))+")", anys(partitions)...)
	if err != nil {
		return nil, err
	}
	var cand []uint32
	for _, r := range existing {
		if r.Owner == "" || r.Owner == incarnation || !live[r.Owner] {
			cand = append(cand, r.Partition)
		}
	}
	if len(cand) == 0 {
		return nil, nil
	}
	locked, err := t.LeaseRows(ctx, "SELECT `partition`, owner, epoch FROM partition_lease FORCE INDEX (PRIMARY) WHERE `partition` IN ("+inList(len(cand))+
		") ORDER BY `partition` FOR UPDATE", anys(cand)...)
	if err != nil {
		return nil, err
	}
	var others []any
	for _, r := range locked {
		if r.Owner != "" && r.Owner != incarnation {
			others = append(others, r.Owner)
		}
	}
	stillLive := map[string]bool{}
	if len(others) > 0 {
		q := `SELECT incarnation FROM cluster_member WHERE lease_until >= ? AND incarnation IN (` + inList(len(others)) + `)`
		if stillLive, err = t.incarnations(ctx, q, append([]any{now}, others...)...); err != nil {
			return nil, err
		}
	}
	var out []uint32
	for _, r := range locked {
		if r.Owner == "" || r.Owner == incarnation || !stillLive[r.Owner] {
			out = append(out, r.Partition)
		}
	}
	return out, nil
}

func (t myTx) VersionShared(ctx context.Context) (uint64, error) {
	var v uint64
	err := t.tx.QueryRowContext(ctx, `SELECT version FROM cluster_version WHERE id = 1 LOCK IN SHARE MODE`).Scan(&v)
	return v, err
}

func (t myTx) Take(ctx context.Context, incarnation string, partitions []uint32) ([]membership.PartitionLease, error) {
	for _, p := range partitions { // by primary key, rows already locked
		if _, err := t.tx.ExecContext(ctx, "UPDATE partition_lease SET owner = ?, epoch = epoch + 1 WHERE `partition` = ?", incarnation, p); err != nil {
			return nil, err
		}
	}
	return t.LeaseRows(ctx, "SELECT `partition`, owner, epoch FROM partition_lease WHERE `partition` IN ("+inList(len(partitions))+")", anys(partitions)...)
}

// Insert: INSERT IGNORE skips a row another node inserted meanwhile (only
// duplicate keys can be ignored here, the values are plain).
func (t myTx) Insert(ctx context.Context, incarnation string, partitions []uint32) ([]membership.PartitionLease, error) {
	var out []membership.PartitionLease
	for _, p := range partitions {
		n, err := t.C.Exec(ctx, "INSERT IGNORE INTO partition_lease (`partition`, owner, epoch) VALUES (?, ?, 1)", p, incarnation)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			out = append(out, membership.PartitionLease{Partition: p, Owner: incarnation, Epoch: 1})
		}
	}
	return out, nil
}

func (t myTx) Release(ctx context.Context, leases []membership.PartitionLease) error {
	for _, l := range leases {
		if _, err := t.tx.ExecContext(ctx, "UPDATE partition_lease SET owner = '' WHERE `partition` = ? AND owner = ? AND epoch = ?",
			l.Partition, l.Owner, l.Epoch); err != nil {
			return err
		}
	}
	return nil
}
