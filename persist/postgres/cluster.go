package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
)

// ClusterStore is the cluster's membership and partition-lease table
// (membership.Store) in the store's database: cluster_member and
// cluster_version (migration 0002) and partition_lease, the table Commit
// checks fences against. Every method is one transaction; lease times come
// from the database clock (now(), the transaction's start), so nodes with
// skewed clocks agree on who expired.
//
// Locking: membership changes lock the cluster_version row FOR UPDATE, which
// orders them. Acquire and Release lock the partition_lease rows they change
// FOR UPDATE in partition order (the order Commit takes them FOR SHARE), so
// taking a lease waits for every in-flight commit fenced with the old epoch
// and no two of them deadlock. Acquire takes the version row (FOR SHARE) only
// after the partition rows, so a commit stuck in flight (a frozen node's open
// transaction) delays that acquire, never the heartbeats of the cluster.
type ClusterStore struct {
	pool *pgxpool.Pool
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
	return &ClusterStore{pool: s.control, lockTimeout: DefaultLockTimeout, stuckAfter: DefaultStuckAfter}
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
	return &cp
}

// WithLockTimeout returns a copy of c with another partition-row lock
// timeout (> 0).
func (c *ClusterStore) WithLockTimeout(d time.Duration) *ClusterStore {
	cp := *c
	if d > 0 {
		cp.lockTimeout = d
	}
	return &cp
}

func (c *ClusterStore) nowArg() any {
	if c.clock == nil {
		return nil
	}
	return c.clock.Now()
}

// inTx runs f in one transaction after locking the version row (lock is
// "UPDATE" or "SHARE", or "" for no lock), passing the version and the
// transaction's time. f's error rolls back; a domain error that must still
// commit is returned through *keep.
func (c *ClusterStore) inTx(ctx context.Context, op, lock string, f func(tx pgx.Tx, version uint64, now time.Time) error) error {
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		q := `SELECT version, coalesce($1::timestamptz, now()) FROM cluster_version WHERE id`
		if lock != "" {
			q += " FOR " + lock
		}
		var version int64
		var now time.Time
		if err := tx.QueryRow(ctx, q, c.nowArg()).Scan(&version, &now); err != nil {
			return err
		}
		return f(tx, uint64(version), now.UTC())
	})
	if err == nil || errors.Is(err, membership.ErrMemberGone) || errors.Is(err, membership.ErrSuperseded) ||
		errors.Is(err, membership.ErrNoSuchMember) {
		return err
	}
	return classify("cluster "+op, err)
}

func bump(ctx context.Context, tx pgx.Tx) (uint64, error) {
	var v int64
	err := tx.QueryRow(ctx, `UPDATE cluster_version SET version = version + 1 WHERE id RETURNING version`).Scan(&v)
	return uint64(v), err
}

// expire deletes members whose lease ended before now; it reports whether
// any was deleted.
func expire(ctx context.Context, tx pgx.Tx, now time.Time) (bool, error) {
	tag, err := tx.Exec(ctx, `DELETE FROM cluster_member WHERE lease_until < $1`, now)
	return err == nil && tag.RowsAffected() > 0, err
}

func readView(ctx context.Context, tx pgx.Tx, version uint64, now time.Time) (membership.View, error) {
	v := membership.View{Version: version, Now: now}
	rows, err := tx.Query(ctx, `SELECT node_id, incarnation, cluster_addr, api_addr, leaving, lease_until, partitions, protocol, version
		FROM cluster_member WHERE lease_until >= $1`, now)
	if err != nil {
		return v, err
	}
	for rows.Next() {
		var m membership.Member
		if err := rows.Scan(&m.NodeID, &m.Incarnation, &m.ClusterAddr, &m.APIAddr, &m.Leaving, &m.LeaseUntil, &m.Partitions, &m.Protocol, &m.Version); err != nil {
			rows.Close()
			return v, err
		}
		m.LeaseUntil = m.LeaseUntil.UTC()
		v.Members = append(v.Members, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return v, err
	}
	// Go's byte order, not the database collation: View.Member searches it.
	slices.SortFunc(v.Members, func(a, b membership.Member) int { return cmp.Compare(a.NodeID, b.NodeID) })
	rows, err = tx.Query(ctx, `SELECT partition, owner, epoch FROM partition_lease ORDER BY partition`)
	if err != nil {
		return v, err
	}
	for rows.Next() {
		var p, epoch int64
		var owner string
		if err := rows.Scan(&p, &owner, &epoch); err != nil {
			rows.Close()
			return v, err
		}
		v.Leases = append(v.Leases, membership.PartitionLease{Partition: uint32(p), Owner: owner, Epoch: uint64(epoch)})
	}
	rows.Close()
	return v, rows.Err()
}

type memberRow struct {
	incarnation, clusterAddr, apiAddr string
	leaving                           bool
	leaseUntil                        time.Time
}

func readMember(ctx context.Context, tx pgx.Tx, nodeID string) (memberRow, bool, error) {
	var r memberRow
	err := tx.QueryRow(ctx, `SELECT incarnation, cluster_addr, api_addr, leaving, lease_until
		FROM cluster_member WHERE node_id = $1`, nodeID).Scan(&r.incarnation, &r.clusterAddr, &r.apiAddr, &r.leaving, &r.leaseUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	return r, err == nil, err
}

// own checks that (nodeID, incarnation) has a live row.
func own(ctx context.Context, tx pgx.Tx, nodeID, incarnation string, now time.Time) (memberRow, error) {
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

func (c *ClusterStore) Join(ctx context.Context, m membership.Member, ttl time.Duration, takeOver bool) (membership.View, error) {
	if m.NodeID == "" || m.Incarnation == "" {
		return membership.View{}, errors.New("postgres: cluster join needs a node id and an incarnation")
	}
	var view membership.View
	err := c.inTx(ctx, "join", "UPDATE", func(tx pgx.Tx, version uint64, now time.Time) error {
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
		err = tx.QueryRow(ctx, `SELECT node_id, partitions, protocol FROM cluster_member
			WHERE node_id <> $1 AND lease_until >= $2 AND (partitions <> $3 OR protocol <> $4) LIMIT 1`,
			m.NodeID, now, m.Partitions, m.Protocol).Scan(&other, &parts, &proto)
		switch {
		case err == nil:
			return fmt.Errorf("join %s (%d partitions, protocol %d): %w: %s has %d partitions, protocol %d",
				m.NodeID, m.Partitions, m.Protocol, membership.ErrIncompatible, other, parts, proto)
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		leaving := live && old.incarnation == m.Incarnation && old.leaving
		changed := !live || old.incarnation != m.Incarnation || old.clusterAddr != m.ClusterAddr || old.apiAddr != m.APIAddr
		if _, err := tx.Exec(ctx, `INSERT INTO cluster_member (node_id, incarnation, cluster_addr, api_addr, leaving, lease_until, partitions, protocol, version)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
			ON CONFLICT (node_id) DO UPDATE SET incarnation = EXCLUDED.incarnation, cluster_addr = EXCLUDED.cluster_addr,
			  api_addr = EXCLUDED.api_addr, leaving = EXCLUDED.leaving, lease_until = EXCLUDED.lease_until,
			  partitions = EXCLUDED.partitions, protocol = EXCLUDED.protocol, version = EXCLUDED.version,
			  joined_at = CASE WHEN cluster_member.incarnation = EXCLUDED.incarnation THEN cluster_member.joined_at ELSE now() END`,
			m.NodeID, m.Incarnation, m.ClusterAddr, m.APIAddr, leaving, now.Add(ttl), m.Partitions, m.Protocol, m.Version); err != nil {
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
	err := c.inTx(ctx, "heartbeat", "UPDATE", func(tx pgx.Tx, version uint64, now time.Time) error {
		_, gone = own(ctx, tx, nodeID, incarnation, now)
		if gone != nil && !errors.Is(gone, membership.ErrMemberGone) && !errors.Is(gone, membership.ErrSuperseded) {
			return gone
		}
		if gone == nil {
			if _, err := tx.Exec(ctx, `UPDATE cluster_member SET lease_until = $3 WHERE node_id = $1 AND incarnation = $2`,
				nodeID, incarnation, now.Add(ttl)); err != nil {
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
	err := c.inTx(ctx, "leave", "UPDATE", func(tx pgx.Tx, version uint64, now time.Time) error {
		r, err := own(ctx, tx, nodeID, incarnation, now)
		if err != nil {
			return err
		}
		if !r.leaving {
			if _, err := tx.Exec(ctx, `UPDATE cluster_member SET leaving = true WHERE node_id = $1 AND incarnation = $2`, nodeID, incarnation); err != nil {
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
	return c.inTx(ctx, "remove", "UPDATE", func(tx pgx.Tx, version uint64, now time.Time) error {
		tag, err := tx.Exec(ctx, `DELETE FROM cluster_member WHERE node_id = $1 AND incarnation = $2`, nodeID, incarnation)
		if err != nil {
			return err
		}
		if tag.RowsAffected() > 0 {
			_, err = bump(ctx, tx)
		}
		return err
	})
}

func (c *ClusterStore) setLockTimeout(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", c.lockTimeout.Milliseconds()))
	return err
}

func (c *ClusterStore) Acquire(ctx context.Context, incarnation string, version uint64, partitions []uint32) ([]membership.PartitionLease, error) {
	ps := slices.Clone(partitions)
	slices.Sort(ps)
	ps = slices.Compact(ps)
	if len(ps) == 0 {
		return nil, nil
	}
	parts := make([]int64, len(ps))
	for i, p := range ps {
		parts[i] = int64(p)
	}
	var taken []membership.PartitionLease
	errStale := errors.New("stale")
	// The version row is locked only after the partition rows (see the type
	// comment), so this transaction starts without it.
	err := c.inTx(ctx, "acquire", "", func(tx pgx.Tx, _ uint64, now time.Time) error {
		if err := c.setLockTimeout(ctx, tx); err != nil {
			return err
		}
		var pid int32
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		defer c.reapBlockers(ctx, pid)()
		var self bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM cluster_member
			WHERE incarnation = $1 AND NOT leaving AND lease_until >= $2)`, incarnation, now).Scan(&self); err != nil {
			return err
		}
		if !self {
			return errStale
		}
		// Lock the takeable rows in partition order: this waits for the
		// in-flight commits fenced with the current epochs.
		rows, err := tx.Query(ctx, `SELECT l.partition FROM partition_lease l
			WHERE l.partition = ANY($1::int[])
			  AND (l.owner = '' OR l.owner = $2 OR NOT EXISTS (
			    SELECT 1 FROM cluster_member m WHERE m.incarnation = l.owner AND m.lease_until >= $3))
			ORDER BY l.partition FOR UPDATE`, parts, incarnation, now)
		if err != nil {
			return err
		}
		var locked []int64
		for rows.Next() {
			var p int64
			if err := rows.Scan(&p); err != nil {
				rows.Close()
				return err
			}
			locked = append(locked, p)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		var current int64
		if err := tx.QueryRow(ctx, `SELECT version FROM cluster_version WHERE id FOR SHARE`).Scan(&current); err != nil {
			return err
		}
		if uint64(current) != version {
			return errStale
		}
		collect := func(rows pgx.Rows, err error) error {
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var p, epoch int64
				if err := rows.Scan(&p, &epoch); err != nil {
					return err
				}
				taken = append(taken, membership.PartitionLease{Partition: uint32(p), Owner: incarnation, Epoch: uint64(epoch)})
			}
			return rows.Err()
		}
		if len(locked) > 0 {
			if err := collect(tx.Query(ctx, `UPDATE partition_lease SET owner = $2, epoch = epoch + 1
				WHERE partition = ANY($1::int[]) RETURNING partition, epoch`, locked, incarnation)); err != nil {
				return err
			}
		}
		// Partitions never leased get their first row (epoch 1); a row
		// another node inserts meanwhile wins.
		return collect(tx.Query(ctx, `INSERT INTO partition_lease (partition, owner, epoch)
			SELECT p, $2, 1 FROM unnest($1::int[]) AS p ORDER BY p
			ON CONFLICT (partition) DO NOTHING RETURNING partition, epoch`, parts, incarnation))
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
	return &cp
}

func (c *ClusterStore) Release(ctx context.Context, leases []membership.PartitionLease) error {
	var parts, epochs []int64
	var owners []string
	for _, l := range leases {
		if l.Owner == "" {
			continue
		}
		parts = append(parts, int64(l.Partition))
		owners = append(owners, l.Owner)
		epochs = append(epochs, int64(l.Epoch))
	}
	if len(parts) == 0 {
		return nil
	}
	return c.inTx(ctx, "release", "", func(tx pgx.Tx, _ uint64, _ time.Time) error {
		if err := c.setLockTimeout(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `WITH held AS (
			  SELECT l.partition FROM partition_lease l
			  JOIN unnest($1::int[], $2::text[], $3::int8[]) AS r(p, o, e)
			    ON l.partition = r.p AND l.owner = r.o AND l.epoch = r.e
			  ORDER BY l.partition FOR UPDATE OF l)
			UPDATE partition_lease SET owner = '' WHERE partition IN (SELECT partition FROM held)`,
			parts, owners, epochs)
		return err
	})
}

func (c *ClusterStore) View(ctx context.Context) (membership.View, error) {
	var view membership.View
	err := c.inTx(ctx, "view", "SHARE", func(tx pgx.Tx, version uint64, now time.Time) error {
		var err error
		view, err = readView(ctx, tx, version, now)
		return err
	})
	return view, err
}

func (c *ClusterStore) Rows(ctx context.Context) ([]membership.Member, time.Time, error) {
	var ms []membership.Member
	var at time.Time
	err := c.inTx(ctx, "rows", "", func(tx pgx.Tx, _ uint64, now time.Time) error {
		at = now
		rows, err := tx.Query(ctx, `SELECT node_id, incarnation, cluster_addr, api_addr, leaving, lease_until FROM cluster_member`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var m membership.Member
			if err := rows.Scan(&m.NodeID, &m.Incarnation, &m.ClusterAddr, &m.APIAddr, &m.Leaving, &m.LeaseUntil); err != nil {
				return err
			}
			m.LeaseUntil = m.LeaseUntil.UTC()
			ms = append(ms, m)
		}
		return rows.Err()
	})
	slices.SortFunc(ms, func(a, b membership.Member) int { return cmp.Compare(a.NodeID, b.NodeID) })
	return ms, at, err
}

func (c *ClusterStore) RequestDrain(ctx context.Context, nodeID string) (membership.Member, error) {
	var m membership.Member
	err := c.inTx(ctx, "request drain", "UPDATE", func(tx pgx.Tx, _ uint64, now time.Time) error {
		r, ok, err := readMember(ctx, tx, nodeID)
		switch {
		case err != nil:
			return err
		case !ok || r.leaseUntil.Before(now):
			return fmt.Errorf("drain %s: %w", nodeID, membership.ErrNoSuchMember)
		}
		if !r.leaving {
			if _, err := tx.Exec(ctx, `UPDATE cluster_member SET leaving = true WHERE node_id = $1 AND incarnation = $2`, nodeID, r.incarnation); err != nil {
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
