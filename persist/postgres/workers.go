package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// acquireSQL takes the free worker id (never used, released, or expired
// before $2) with the lowest last_ms, then the lowest id. SKIP LOCKED lets
// concurrent acquirers pick different rows; the outer WHERE re-checks the
// row is still free after the lock (a concurrent acquirer may have taken it).
const acquireSQL = `UPDATE worker_lease AS w
SET holder = $1, token = COALESCE(w.token, 0) + 1, expires_at = $3
WHERE w.worker_id = (
    SELECT worker_id FROM worker_lease
    WHERE expires_at IS NULL OR expires_at < $2
    ORDER BY COALESCE(last_ms, 0), worker_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED)
  AND (w.expires_at IS NULL OR w.expires_at < $2)
RETURNING w.worker_id, w.token, COALESCE(w.last_ms, 0), w.expires_at,
  (extract(epoch FROM clock_timestamp()) * 1000)::int8,
  (SELECT COALESCE(max(last_ms), 0) FROM worker_lease WHERE holder = $1)`

// leaseEnd is the stored end of a lease taken at now for ttl: millisecond
// precision (the column is TIMESTAMPTZ(3)), truncated so a lease never ends
// later than asked.
func leaseEnd(now time.Time, ttl time.Duration) time.Time {
	return now.Add(ttl).UTC().Truncate(time.Millisecond)
}

// AcquireWorker leases a free worker id for holder until now+ttl.
func (s *Store) AcquireWorker(ctx context.Context, holder string, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	end := leaseEnd(now, ttl)
	// A concurrent acquirer can take our candidate between the subquery's
	// scan and its lock; then the UPDATE matches nothing and we try again.
	for attempt := 0; attempt < 8; attempt++ {
		var id int16
		var token, lastMs, storeMs, highMs int64
		var expires time.Time
		err := s.control.QueryRow(ctx, acquireSQL, holder, now, end).Scan(&id, &token, &lastMs, &expires, &storeMs, &highMs)
		if err == nil {
			return persist.WorkerLease{WorkerID: int(id), Holder: holder, Token: uint64(token),
				Expires: expires.UTC(), LastMs: lastMs, StoreMs: storeMs, HighWaterMs: highMs}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return persist.WorkerLease{}, unavailable("acquire worker id", err)
		}
		var free bool
		if err := s.control.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM worker_lease
			WHERE expires_at IS NULL OR expires_at < $1)`, now).Scan(&free); err != nil {
			return persist.WorkerLease{}, unavailable("acquire worker id", err)
		}
		if !free {
			break
		}
	}
	return persist.WorkerLease{}, fmt.Errorf("postgres: acquire worker id for %q: every id is leased: %w", holder, sequencer.ErrWorkerLeaseLost)
}

// RenewWorker extends lease to now+ttl and raises last_ms to lastMs.
func (s *Store) RenewWorker(ctx context.Context, lease persist.WorkerLease, lastMs int64, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	var stored, storeMs int64
	var expires time.Time
	err := s.control.QueryRow(ctx, `UPDATE worker_lease
		SET expires_at = $5, last_ms = GREATEST(COALESCE(last_ms, 0), $4)
		WHERE worker_id = $1 AND holder = $2 AND token = $3 AND expires_at >= $6
		RETURNING last_ms, expires_at, (extract(epoch FROM clock_timestamp()) * 1000)::int8`,
		lease.WorkerID, lease.Holder, int64(lease.Token), lastMs, leaseEnd(now, ttl), now).Scan(&stored, &expires, &storeMs)
	if errors.Is(err, pgx.ErrNoRows) {
		return persist.WorkerLease{}, fmt.Errorf("postgres: renew worker id %d for %q: taken over, released or expired: %w",
			lease.WorkerID, lease.Holder, sequencer.ErrWorkerLeaseLost)
	}
	if err != nil {
		return persist.WorkerLease{}, unavailable("renew worker id", err)
	}
	lease.Expires = expires.UTC()
	lease.LastMs = stored
	lease.StoreMs = storeMs
	lease.HighWaterMs = 0
	return lease, nil
}

// ReleaseWorker frees lease if it is still held, setting last_ms to lastMs
// (the holder's last issued ms: its unused reservation is given back); a
// stale release only raises last_ms (a higher last_ms only makes later
// holders more careful).
func (s *Store) ReleaseWorker(ctx context.Context, lease persist.WorkerLease, lastMs int64) error {
	_, err := s.control.Exec(ctx, `UPDATE worker_lease
		SET last_ms = CASE WHEN holder = $2 AND token = $3 AND expires_at IS NOT NULL THEN $4
		                   ELSE GREATEST(COALESCE(last_ms, 0), $4) END,
		    expires_at = CASE WHEN holder = $2 AND token = $3 THEN NULL ELSE expires_at END
		WHERE worker_id = $1`, lease.WorkerID, lease.Holder, int64(lease.Token), lastMs)
	if err != nil {
		return unavailable("release worker id", err)
	}
	return nil
}
