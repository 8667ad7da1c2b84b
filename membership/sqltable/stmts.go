package sqltable

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/sequencer-im/sequencer/membership"
)

// Conn is one open transaction in a driver's wire protocol: all a Stmts
// needs of it.
type Conn interface {
	// Exec runs q and returns the rows it changed.
	Exec(ctx context.Context, q string, args ...any) (int64, error)
	// Query runs q and calls row for each result row, with the row's scan.
	Query(ctx context.Context, q string, args []any, row func(scan func(dst ...any) error) error) error
	// QueryRow scans q's first row into dst; found false when q has none.
	QueryRow(ctx context.Context, q string, args []any, dst ...any) (found bool, err error)
}

// Stmts is the part of Tx whose SQL is the same on every database but for
// its placeholders and quoting: a driver's Tx embeds it and adds the
// statements its database spells its own way (Bump, Upsert, StartLeases,
// LockTakeable, VersionShared, Take, Insert, Release). The statements are
// written with ? placeholders and the column "partition" quoted with double
// quotes; Rebind turns them into the driver's SQL.
type Stmts struct {
	C      Conn
	Rebind func(q string) string
}

// Placeholders turns the ? placeholders of q into $1, $2, … (PostgreSQL's
// Rebind).
func Placeholders(q string) string {
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r != '?' {
			b.WriteRune(r)
			continue
		}
		n++
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

func (s Stmts) q(q string) string {
	if s.Rebind == nil {
		return q
	}
	return s.Rebind(q)
}

func (s Stmts) exec(ctx context.Context, q string, args ...any) (bool, error) {
	n, err := s.C.Exec(ctx, s.q(q), args...)
	return n > 0, err
}

// Expire implements Tx.
func (s Stmts) Expire(ctx context.Context, now time.Time) (bool, error) {
	return s.exec(ctx, `DELETE FROM cluster_member WHERE lease_until < ?`, now)
}

// members reads the member rows of q, whose first cols columns are those of
// Live's select.
func (s Stmts) members(ctx context.Context, cols int, q string, args ...any) ([]membership.Member, error) {
	var ms []membership.Member
	err := s.C.Query(ctx, s.q(q), args, func(scan func(...any) error) error {
		var m membership.Member
		dst := []any{&m.NodeID, &m.Incarnation, &m.ClusterAddr, &m.APIAddr, &m.Leaving, &m.LeaseUntil, &m.Partitions, &m.Protocol, &m.Version}
		err := scan(dst[:cols]...)
		ms = append(ms, m)
		return err
	})
	return ms, err
}

// Live implements Tx.
func (s Stmts) Live(ctx context.Context, now time.Time) ([]membership.Member, error) {
	return s.members(ctx, 9, `SELECT node_id, incarnation, cluster_addr, api_addr, leaving, lease_until, partitions, protocol, version
		FROM cluster_member WHERE lease_until >= ?`, now)
}

// Rows implements Tx.
func (s Stmts) Rows(ctx context.Context) ([]membership.Member, error) {
	return s.members(ctx, 6, `SELECT node_id, incarnation, cluster_addr, api_addr, leaving, lease_until FROM cluster_member`)
}

// LeaseRows reads the partition lease rows q selects (partition, owner,
// epoch), q in the driver's SQL already.
func (s Stmts) LeaseRows(ctx context.Context, q string, args ...any) ([]membership.PartitionLease, error) {
	var ls []membership.PartitionLease
	err := s.C.Query(ctx, q, args, func(scan func(...any) error) error {
		var p, epoch int64
		var owner string
		err := scan(&p, &owner, &epoch)
		ls = append(ls, membership.PartitionLease{Partition: uint32(p), Owner: owner, Epoch: uint64(epoch)})
		return err
	})
	return ls, err
}

// PartitionRows reads the partitions q selects (one column), q in the
// driver's SQL already.
func (s Stmts) PartitionRows(ctx context.Context, q string, args ...any) ([]uint32, error) {
	var ps []uint32
	err := s.C.Query(ctx, q, args, func(scan func(...any) error) error {
		var p int64
		err := scan(&p)
		ps = append(ps, uint32(p))
		return err
	})
	return ps, err
}

// Leases implements Tx.
func (s Stmts) Leases(ctx context.Context) ([]membership.PartitionLease, error) {
	return s.LeaseRows(ctx, s.q(`SELECT "partition", owner, epoch FROM partition_lease ORDER BY "partition"`))
}

// Member implements Tx.
func (s Stmts) Member(ctx context.Context, nodeID string) (membership.Member, bool, error) {
	m := membership.Member{NodeID: nodeID}
	found, err := s.C.QueryRow(ctx, s.q(`SELECT incarnation, cluster_addr, api_addr, leaving, lease_until
		FROM cluster_member WHERE node_id = ?`), []any{nodeID}, &m.Incarnation, &m.ClusterAddr, &m.APIAddr, &m.Leaving, &m.LeaseUntil)
	return m, found, err
}

// Incompatible implements Tx.
func (s Stmts) Incompatible(ctx context.Context, m membership.Member, now time.Time) (membership.Member, bool, error) {
	var o membership.Member
	found, err := s.C.QueryRow(ctx, s.q(`SELECT node_id, partitions, protocol FROM cluster_member
		WHERE node_id <> ? AND lease_until >= ? AND (partitions <> ? OR protocol <> ?) LIMIT 1`),
		[]any{m.NodeID, now, m.Partitions, m.Protocol}, &o.NodeID, &o.Partitions, &o.Protocol)
	return o, found, err
}

// Renew implements Tx.
func (s Stmts) Renew(ctx context.Context, nodeID, incarnation string, until time.Time) error {
	_, err := s.exec(ctx, `UPDATE cluster_member SET lease_until = ? WHERE node_id = ? AND incarnation = ?`, until, nodeID, incarnation)
	return err
}

// SetLeaving implements Tx.
func (s Stmts) SetLeaving(ctx context.Context, nodeID, incarnation string) error {
	_, err := s.exec(ctx, `UPDATE cluster_member SET leaving = true WHERE node_id = ? AND incarnation = ?`, nodeID, incarnation)
	return err
}

// Delete implements Tx.
func (s Stmts) Delete(ctx context.Context, nodeID, incarnation string) (bool, error) {
	return s.exec(ctx, `DELETE FROM cluster_member WHERE node_id = ? AND incarnation = ?`, nodeID, incarnation)
}

// ActiveMember implements Tx.
func (s Stmts) ActiveMember(ctx context.Context, incarnation string, now time.Time) (bool, error) {
	var n int64
	_, err := s.C.QueryRow(ctx, s.q(`SELECT COUNT(*) FROM cluster_member
		WHERE incarnation = ? AND NOT leaving AND lease_until >= ?`), []any{incarnation, now}, &n)
	return n > 0, err
}
