package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
)

// ClusterStore is the cluster's membership and partition-lease table
// (membership.Store) in the store's database: cluster_member and
// cluster_version (migration 0002) and partition_lease, the table Commit
// checks fences against. Every method is one transaction on the control
// pool; lease times come from the database clock (UTC_TIMESTAMP(3)), so
// nodes with skewed clocks agree on who expired.
//
// Locking, as in persist/postgres: membership changes lock the
// cluster_version row FOR UPDATE, which orders them. Acquire locks the
// partition_lease rows it takes FOR UPDATE in partition order (Commit reads
// them LOCK IN SHARE MODE), so taking a lease waits for every in-flight
// commit fenced with the old epoch (up to innodb_lock_wait_timeout,
// Options.ControlLockWait; then it fails and the node retries) and fences
// out later ones. Acquire locks only rows it may take (free, its own, or
// of a dead owner, chosen by a plain read and re-checked under the lock),
// never a live owner's, and takes the version row (shared) after them.
type ClusterStore struct {
	db    *sql.DB
	clock clock.Clock // when set, replaces the database clock (tests)
}

var (
	_ membership.Store    = (*ClusterStore)(nil)
	_ membership.Provider = (*Store)(nil)
)

// Cluster returns the membership table of this store's database.
func (s *Store) Cluster() *ClusterStore { return &ClusterStore{db: s.control} }

// Membership is Cluster as a membership.Store (membership.Provider).
func (s *Store) Membership() membership.Store { return s.Cluster() }

// WithClock returns a copy of c that reads time from clk instead of the
// database clock (tests).
func (c *ClusterStore) WithClock(clk clock.Clock) *ClusterStore {
	cp := *c
	cp.clock = clk
	return &cp
}

func (c *ClusterStore) nowArg() any {
	if c.clock == nil {
		return nil
	}
	return c.clock.Now().UTC()
}

// inTx runs f in one transaction after reading the version row (lock is
// "FOR UPDATE", "LOCK IN SHARE MODE" or ""), passing the version and the
// transaction's time.
func (c *ClusterStore) inTx(ctx context.Context, op, lock string, f func(tx *sql.Tx, version uint64, now time.Time) error) error {
	err := func() error {
		tx, err := c.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		var version uint64
		var now time.Time
		if err := tx.QueryRowContext(ctx, `SELECT version, CAST(COALESCE(?, UTC_TIMESTAMP(3)) AS DATETIME(3)) FROM cluster_version WHERE id = 1 `+lock, c.nowArg()).
			Scan(&version, &now); err != nil {
			return err
		}
		if err := f(tx, version, now.UTC()); err != nil {
			return err
		}
		return tx.Commit()
	}()
	if err == nil || errors.Is(err, membership.ErrMemberGone) || errors.Is(err, membership.ErrSuperseded) ||
		errors.Is(err, membership.ErrNoSuchMember) || errors.Is(err, membership.ErrIncompatible) {
		return err
	}
	return unavailable("cluster "+op, err)
}

func bump(ctx context.Context, tx *sql.Tx) (uint64, error) {
	if _, err := tx.ExecContext(ctx, `UPDATE cluster_version SET version = version + 1 WHERE id = 1`); err != nil {
		return 0, err
	}
	var v uint64
	err := tx.QueryRowContext(ctx, `SELECT version FROM cluster_version WHERE id = 1`).Scan(&v)
	return v, err
}

func expire(ctx context.Context, tx *sql.Tx, now time.Time) (bool, error) {
	res, err := tx.ExecContext(ctx, `DELETE FROM cluster_member WHERE lease_until < ?`, now)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

func readView(ctx context.Context, tx *sql.Tx, version uint64, now time.Time) (membership.View, error) {
	v := membership.View{Version: version, Now: now}
	rows, err := tx.QueryContext(ctx, `SELECT node_id, incarnation, cluster_addr, api_addr, leaving, lease_until, partitions, protocol, version
		FROM cluster_member WHERE lease_until >= ?`, now)
	if err != nil {
		return v, err
	}
	err = scanAll(rows, func() error {
		var m membership.Member
		if err := rows.Scan(&m.NodeID, &m.Incarnation, &m.ClusterAddr, &m.APIAddr, &m.Leaving, &m.LeaseUntil, &m.Partitions, &m.Protocol, &m.Version); err != nil {
			return err
		}
		m.LeaseUntil = m.LeaseUntil.UTC()
		v.Members = append(v.Members, m)
		return nil
	})
	rows.Close()
	if err != nil {
		return v, err
	}
	slices.SortFunc(v.Members, func(a, b membership.Member) int { return cmp.Compare(a.NodeID, b.NodeID) })
	rows, err = tx.QueryContext(ctx, "SELECT `partition`, owner, epoch FROM partition_lease ORDER BY `partition`")
	if err != nil {
		return v, err
	}
	defer rows.Close()
	err = scanAll(rows, func() error {
		var l membership.PartitionLease
		if err := rows.Scan(&l.Partition, &l.Owner, &l.Epoch); err != nil {
			return err
		}
		v.Leases = append(v.Leases, l)
		return nil
	})
	return v, err
}

type memberRow struct {
	incarnation, clusterAddr, apiAddr string
	leaving                           bool
	leaseUntil                        time.Time
}

func readMember(ctx context.Context, tx *sql.Tx, nodeID string) (memberRow, bool, error) {
	var r memberRow
	err := tx.QueryRowContext(ctx, `SELECT incarnation, cluster_addr, api_addr, leaving, lease_until
		FROM cluster_member WHERE node_id = ?`, nodeID).Scan(&r.incarnation, &r.clusterAddr, &r.apiAddr, &r.leaving, &r.leaseUntil)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	return r, err == nil, err
}

// own checks that (nodeID, incarnation) has a live row.
func own(ctx context.Context, tx *sql.Tx, nodeID, incarnation string, now time.Time) (memberRow, error) {
	r, ok, err := readMember(ctx, tx, nodeID)
	switch {
	case err != nil:
		return r, err
	case !ok || (r.incarnation == incarnation && r.leaseUntil.Before(now)):
		return r, fmt.Errorf("member %s (%s): %w", nodeID, incarnation, membership.ErrMemberGone)
	case r.incarnation != incarnation:
		if !r.leaseUntil.Before(now) {
			return r, fmt.Errorf("member %s (%s): %w (held by %s)", nodeID, incarnation, membership.ErrSuperseded, r.incarnation)
		}
		return r, fmt.Errorf("member %s (%s): %w", nodeID, incarnation, membership.ErrMemberGone)
	}
	return r, nil
}

const forUpdate, forShare = "FOR UPDATE", "LOCK IN SHARE MODE"

func (c *ClusterStore) Join(ctx context.Context, m membership.Member, ttl time.Duration, takeOver bool) (membership.View, error) {
	if m.NodeID == "" || m.Incarnation == "" {
		return membership.View{}, errors.New("mysql: cluster join needs a node id and an incarnation")
	}
	var view membership.View
	err := c.inTx(ctx, "join", forUpdate, func(tx *sql.Tx, version uint64, now time.Time) error {
		old, ok, err := readMember(ctx, tx, m.NodeID)
		if err != nil {
			return err
		}
		live := ok && !old.leaseUntil.Before(now)
		if live && old.incarnation != m.Incarnation && !takeOver {
			return fmt.Errorf("join %s as %s: %w (held by %s)", m.NodeID, m.Incarnation, membership.ErrSuperseded, old.incarnation)
		}
		var other string
		var parts, proto int
		err = tx.QueryRowContext(ctx, `SELECT node_id, partitions, protocol FROM cluster_member
			WHERE node_id <> ? AND lease_until >= ? AND (partitions <> ? OR protocol <> ?) LIMIT 1`,
			m.NodeID, now, m.Partitions, m.Protocol).Scan(&other, &parts, &proto)
		switch {
		case err == nil:
			return fmt.Errorf("join %s (%d partitions, protocol %d): %w: %s has %d partitions, protocol %d",
				m.NodeID, m.Partitions, m.Protocol, membership.ErrIncompatible, other, parts, proto)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		leaving := live && old.incarnation == m.Incarnation && old.leaving
		changed := !live || old.incarnation != m.Incarnation || old.clusterAddr != m.ClusterAddr || old.apiAddr != m.APIAddr
		// Another node id's expired row may still hold this incarnation
		// (impossible in practice: incarnations are unique per start).
		if _, err := tx.ExecContext(ctx, `INSERT INTO cluster_member (node_id, incarnation, cluster_addr, api_addr, leaving, lease_until, joined_at, partitions, protocol, version)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON DUPLICATE KEY UPDATE joined_at = IF(incarnation = VALUES(incarnation), joined_at, VALUES(joined_at)),
			  incarnation = VALUES(incarnation), cluster_addr = VALUES(cluster_addr),
			  api_addr = VALUES(api_addr), leaving = VALUES(leaving), lease_until = VALUES(lease_until),
			  partitions = VALUES(partitions), protocol = VALUES(protocol), version = VALUES(version)`,
			m.NodeID, m.Incarnation, m.ClusterAddr, m.APIAddr, leaving, now.Add(ttl), now, m.Partitions, m.Protocol, m.Version); err != nil {
			return err
		}
		expired, err := expire(ctx, tx, now)
		if err != nil {
			return err
		}
		if changed || expired {
			if version, err = bump(ctx, tx); err != nil {
				return err
			}
		}
		view, err = readView(ctx, tx, version, now)
		return err
	})
	return view, err
}

func (c *ClusterStore) Heartbeat(ctx context.Context, nodeID, incarnation string, ttl time.Duration) (membership.View, error) {
	var view membership.View
	var gone error
	err := c.inTx(ctx, "heartbeat", forUpdate, func(tx *sql.Tx, version uint64, now time.Time) error {
		_, gone = own(ctx, tx, nodeID, incarnation, now)
		if gone != nil && !errors.Is(gone, membership.ErrMemberGone) && !errors.Is(gone, membership.ErrSuperseded) {
			return gone
		}
		if gone == nil {
			if _, err := tx.ExecContext(ctx, `UPDATE cluster_member SET lease_until = ? WHERE node_id = ? AND incarnation = ?`,
				now.Add(ttl), nodeID, incarnation); err != nil {
				return err
			}
		}
		expired, err := expire(ctx, tx, now)
		if err != nil {
			return err
		}
		if expired {
			if version, err = bump(ctx, tx); err != nil {
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

func (c *ClusterStore) Leave(ctx context.Context, nodeID, incarnation string) (membership.View, error) {
	var view membership.View
	err := c.inTx(ctx, "leave", forUpdate, func(tx *sql.Tx, version uint64, now time.Time) error {
		r, err := own(ctx, tx, nodeID, incarnation, now)
		if err != nil {
			return err
		}
		if !r.leaving {
			if _, err := tx.ExecContext(ctx, `UPDATE cluster_member SET leaving = true WHERE node_id = ? AND incarnation = ?`, nodeID, incarnation); err != nil {
				return err
			}
			if version, err = bump(ctx, tx); err != nil {
				return err
			}
		}
		view, err = readView(ctx, tx, version, now)
		return err
	})
	return view, err
}

func (c *ClusterStore) Remove(ctx context.Context, nodeID, incarnation string) error {
	return c.inTx(ctx, "remove", forUpdate, func(tx *sql.Tx, version uint64, now time.Time) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM cluster_member WHERE node_id = ? AND incarnation = ?`, nodeID, incarnation)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n > 0 {
			_, err = bump(ctx, tx)
		}
		return err
	})
}

func inList(n int) string {
	var b strings.Builder
	sqlList(&b, n, "?")
	return b.String()
}

func (c *ClusterStore) Acquire(ctx context.Context, incarnation string, version uint64, partitions []uint32) ([]membership.PartitionLease, error) {
	ps := slices.Clone(partitions)
	slices.Sort(ps)
	ps = slices.Compact(ps)
	if len(ps) == 0 {
		return nil, nil
	}
	var taken []membership.PartitionLease
	errStale := errors.New("stale")
	err := c.inTx(ctx, "acquire", "", func(tx *sql.Tx, _ uint64, now time.Time) error {
		var self int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM cluster_member
			WHERE incarnation = ? AND NOT leaving AND lease_until >= ?`, incarnation, now).Scan(&self); err != nil {
			return err
		}
		if self == 0 {
			return errStale
		}
		// Live owners (a plain read; re-checked below under the locks).
		live := map[string]bool{}
		rows, err := tx.QueryContext(ctx, `SELECT incarnation FROM cluster_member WHERE lease_until >= ?`, now)
		if err != nil {
			return err
		}
		if err := scanAll(rows, func() error {
			var inc string
			err := rows.Scan(&inc)
			live[inc] = true
			return err
		}); err != nil {
			rows.Close()
			return err
		}
		rows.Close()
		args := make([]any, len(ps))
		for i, p := range ps {
			args[i] = p
		}
		takeable := func(owner string) bool { return owner == "" || owner == incarnation || !live[owner] }
		type row struct {
			p     uint32
			owner string
			epoch uint64
		}
		readRows := func(q string, args []any) ([]row, error) {
			rows, err := tx.QueryContext(ctx, q, args...)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var out []row
			err = scanAll(rows, func() error {
				var r row
				err := rows.Scan(&r.p, &r.owner, &r.epoch)
				out = append(out, r)
				return err
			})
			return out, err
		}
		existing, err := readRows("SELECT `partition`, owner, epoch FROM partition_lease WHERE `partition` IN ("+inList(len(ps))+")", args)
		if err != nil {
			return err
		}
		have := map[uint32]bool{}
		var cand []any
		for _, r := range existing {
			have[r.p] = true
			if takeable(r.owner) {
				cand = append(cand, r.p)
			}
		}
		// Lock the candidates in partition order: this waits for the
		// in-flight commits fenced with the current epochs.
		var lock []uint32
		if len(cand) > 0 {
			locked, err := readRows("SELECT `partition`, owner, epoch FROM partition_lease FORCE INDEX (PRIMARY) WHERE `partition` IN ("+inList(len(cand))+
				") ORDER BY `partition` FOR UPDATE", cand)
			if err != nil {
				return err
			}
			// Liveness again, now that the rows are ours (a member that
			// joined meanwhile is live now).
			var dead []string
			for _, r := range locked {
				if r.owner != "" && r.owner != incarnation {
					dead = append(dead, r.owner)
				}
			}
			stillLive := map[string]bool{}
			if len(dead) > 0 {
				q := `SELECT incarnation FROM cluster_member WHERE lease_until >= ? AND incarnation IN (` + inList(len(dead)) + `)`
				a := []any{now}
				for _, d := range dead {
					a = append(a, d)
				}
				rows, err := tx.QueryContext(ctx, q, a...)
				if err != nil {
					return err
				}
				err = scanAll(rows, func() error {
					var inc string
					err := rows.Scan(&inc)
					stillLive[inc] = true
					return err
				})
				rows.Close()
				if err != nil {
					return err
				}
			}
			for _, r := range locked {
				if r.owner == "" || r.owner == incarnation || !stillLive[r.owner] {
					lock = append(lock, r.p)
				}
			}
		}
		var current uint64
		if err := tx.QueryRowContext(ctx, `SELECT version FROM cluster_version WHERE id = 1 LOCK IN SHARE MODE`).Scan(&current); err != nil {
			return err
		}
		if current != version {
			return errStale
		}
		if len(lock) > 0 {
			a := make([]any, len(lock))
			for i, p := range lock {
				a[i] = p
			}
			for _, p := range lock { // by primary key, rows already locked
				if _, err := tx.ExecContext(ctx, "UPDATE partition_lease SET owner = ?, epoch = epoch + 1 WHERE `partition` = ?", incarnation, p); err != nil {
					return err
				}
			}
			got, err := readRows("SELECT `partition`, owner, epoch FROM partition_lease WHERE `partition` IN ("+inList(len(lock))+")", a)
			if err != nil {
				return err
			}
			for _, r := range got {
				taken = append(taken, membership.PartitionLease{Partition: r.p, Owner: incarnation, Epoch: r.epoch})
			}
		}
		// Partitions never leased get their first row (epoch 1); a row
		// another node inserts meanwhile wins (INSERT IGNORE skips it: only
		// duplicate keys can be ignored here, the values are plain).
		var fresh []any
		for _, p := range ps {
			if !have[p] {
				fresh = append(fresh, p)
			}
		}
		for _, p := range fresh {
			res, err := tx.ExecContext(ctx, "INSERT IGNORE INTO partition_lease (`partition`, owner, epoch) VALUES (?, ?, 1)", p, incarnation)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 1 {
				taken = append(taken, membership.PartitionLease{Partition: p.(uint32), Owner: incarnation, Epoch: 1})
			}
		}
		return nil
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

func (c *ClusterStore) Release(ctx context.Context, leases []membership.PartitionLease) error {
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
	return c.inTx(ctx, "release", "", func(tx *sql.Tx, _ uint64, _ time.Time) error {
		for _, l := range held {
			if _, err := tx.ExecContext(ctx, "UPDATE partition_lease SET owner = '' WHERE `partition` = ? AND owner = ? AND epoch = ?",
				l.Partition, l.Owner, l.Epoch); err != nil {
				return err
			}
		}
		return nil
	})
}

func (c *ClusterStore) View(ctx context.Context) (membership.View, error) {
	var view membership.View
	err := c.inTx(ctx, "view", forShare, func(tx *sql.Tx, version uint64, now time.Time) error {
		var err error
		view, err = readView(ctx, tx, version, now)
		return err
	})
	return view, err
}

func (c *ClusterStore) Rows(ctx context.Context) ([]membership.Member, time.Time, error) {
	var ms []membership.Member
	var at time.Time
	err := c.inTx(ctx, "rows", "", func(tx *sql.Tx, _ uint64, now time.Time) error {
		at = now
		rows, err := tx.QueryContext(ctx, `SELECT node_id, incarnation, cluster_addr, api_addr, leaving, lease_until FROM cluster_member`)
		if err != nil {
			return err
		}
		defer rows.Close()
		return scanAll(rows, func() error {
			var m membership.Member
			if err := rows.Scan(&m.NodeID, &m.Incarnation, &m.ClusterAddr, &m.APIAddr, &m.Leaving, &m.LeaseUntil); err != nil {
				return err
			}
			m.LeaseUntil = m.LeaseUntil.UTC()
			ms = append(ms, m)
			return nil
		})
	})
	slices.SortFunc(ms, func(a, b membership.Member) int { return cmp.Compare(a.NodeID, b.NodeID) })
	return ms, at, err
}

func (c *ClusterStore) RequestDrain(ctx context.Context, nodeID string) (membership.Member, error) {
	var m membership.Member
	err := c.inTx(ctx, "request drain", forUpdate, func(tx *sql.Tx, _ uint64, now time.Time) error {
		r, ok, err := readMember(ctx, tx, nodeID)
		switch {
		case err != nil:
			return err
		case !ok || r.leaseUntil.Before(now):
			return fmt.Errorf("drain %s: %w", nodeID, membership.ErrNoSuchMember)
		}
		if !r.leaving {
			if _, err := tx.ExecContext(ctx, `UPDATE cluster_member SET leaving = true WHERE node_id = ? AND incarnation = ?`, nodeID, r.incarnation); err != nil {
				return err
			}
			if _, err := bump(ctx, tx); err != nil {
				return err
			}
		}
		m = membership.Member{NodeID: nodeID, Incarnation: r.incarnation, ClusterAddr: r.clusterAddr, APIAddr: r.apiAddr,
			Leaving: true, LeaseUntil: r.leaseUntil.UTC()}
		return nil
	})
	return m, err
}
