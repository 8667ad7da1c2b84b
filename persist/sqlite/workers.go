package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// Lease times are stored as unix milliseconds (the PostgreSQL store's
// TIMESTAMPTZ(3)); a lease end is truncated so it never ends later than asked.
func leaseEndMs(now time.Time, ttl time.Duration) int64 { return now.Add(ttl).UnixMilli() }

// AcquireWorker leases the free worker id (never used, released, or expired
// before now) with the lowest last_ms, then the lowest id, for holder until
// now+ttl. The writer connection serializes acquirers.
func (s *Store) AcquireWorker(ctx context.Context, holder string, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	var id, token, lastMs, expires, highMs int64
	err := s.w.QueryRowContext(ctx, `UPDATE worker_lease
		SET holder = ?1, token = COALESCE(token, 0) + 1, expires_at = ?3
		WHERE worker_id = (
			SELECT worker_id FROM worker_lease
			WHERE expires_at IS NULL OR expires_at < ?2
			ORDER BY last_ms, worker_id LIMIT 1)
		RETURNING worker_id, token, last_ms, expires_at, (SELECT MAX(last_ms) FROM worker_lease)`,
		holder, now.UnixMilli(), leaseEndMs(now, ttl)).Scan(&id, &token, &lastMs, &expires, &highMs)
	s.wrote(err)
	if errors.Is(err, sql.ErrNoRows) {
		return persist.WorkerLease{}, fmt.Errorf("sqlite: acquire worker id for %q: every id is leased: %w", holder, sequencer.ErrWorkerLeaseLost)
	}
	if err != nil {
		return persist.WorkerLease{}, unavailable("acquire worker id", err)
	}
	// The embedded store is used by one process at a time: every recorded
	// last_ms is this machine's history (HighWaterMs over all holders).
	return persist.WorkerLease{WorkerID: int(id), Holder: holder, Token: uint64(token),
		Expires: time.UnixMilli(expires).UTC(), LastMs: lastMs, HighWaterMs: highMs}, nil
}

// RenewWorker extends lease to now+ttl and raises last_ms to lastMs.
func (s *Store) RenewWorker(ctx context.Context, lease persist.WorkerLease, lastMs int64, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	var stored, expires int64
	err := s.w.QueryRowContext(ctx, `UPDATE worker_lease
		SET expires_at = ?5, last_ms = MAX(last_ms, ?4)
		WHERE worker_id = ?1 AND holder = ?2 AND token = ?3 AND expires_at >= ?6
		RETURNING last_ms, expires_at`,
		lease.WorkerID, lease.Holder, int64(lease.Token), lastMs, leaseEndMs(now, ttl), now.UnixMilli()).Scan(&stored, &expires)
	s.wrote(err)
	if errors.Is(err, sql.ErrNoRows) {
		return persist.WorkerLease{}, fmt.Errorf("sqlite: renew worker id %d for %q: taken over, released or expired: %w",
			lease.WorkerID, lease.Holder, sequencer.ErrWorkerLeaseLost)
	}
	if err != nil {
		return persist.WorkerLease{}, unavailable("renew worker id", err)
	}
	lease.Expires = time.UnixMilli(expires).UTC()
	lease.LastMs = stored
	return lease, nil
}

// ReleaseWorker frees lease if it is still held, setting last_ms to lastMs
// (the holder's last issued ms: its unused reservation is given back); a
// stale release only raises last_ms (a higher last_ms only makes later
// holders more careful).
func (s *Store) ReleaseWorker(ctx context.Context, lease persist.WorkerLease, lastMs int64) error {
	_, err := s.w.ExecContext(ctx, `UPDATE worker_lease
		SET last_ms = CASE WHEN holder = ?2 AND token = ?3 AND expires_at IS NOT NULL THEN ?4
		                   ELSE MAX(last_ms, ?4) END,
		    expires_at = CASE WHEN holder = ?2 AND token = ?3 THEN NULL ELSE expires_at END
		WHERE worker_id = ?1`, lease.WorkerID, lease.Holder, int64(lease.Token), lastMs)
	if err != nil {
		return unavailable("release worker id", err)
	}
	return nil
}
