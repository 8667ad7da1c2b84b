package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// leaseEnd is the stored end of a lease taken at now for ttl (DATETIME(3),
// truncated so a lease never ends later than asked).
func leaseEnd(now time.Time, ttl time.Duration) time.Time {
	return now.Add(ttl).UTC().Truncate(time.Millisecond)
}

// storeMs is the server's clock in unix ms.
const storeMsSQL = `CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)`

// AcquireWorker leases a free worker id for holder until now+ttl: the free
// row (never used, released, or expired before now) with the lowest
// last_ms, then the lowest id. Candidates come from a plain read; each is
// then locked by primary key FOR UPDATE SKIP LOCKED (MySQL 8, MariaDB
// 10.6+) and re-checked, so concurrent acquirers take different rows and
// never wait for each other.
func (s *Store) AcquireWorker(ctx context.Context, holder string, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	for attempt := 0; attempt < 8; attempt++ {
		rows, err := s.control.QueryContext(ctx, `SELECT worker_id FROM worker_lease
			WHERE expires_at IS NULL OR expires_at < ? ORDER BY last_ms, worker_id LIMIT 16`, now.UTC())
		if err != nil {
			return persist.WorkerLease{}, unavailable("acquire worker id", err)
		}
		var ids []int
		err = scanAll(rows, func() error {
			var id int
			err := rows.Scan(&id)
			ids = append(ids, id)
			return err
		})
		rows.Close()
		if err != nil {
			return persist.WorkerLease{}, unavailable("acquire worker id", err)
		}
		if len(ids) == 0 {
			break
		}
		for _, id := range ids {
			l, ok, err := s.takeWorker(ctx, id, holder, now, ttl)
			if err != nil || ok {
				return l, err
			}
		}
	}
	return persist.WorkerLease{}, fmt.Errorf("mysql: acquire worker id for %q: every id is leased: %w", holder, sequencer.ErrWorkerLeaseLost)
}

// takeWorker leases id if it is still free and not locked by another
// acquirer.
func (s *Store) takeWorker(ctx context.Context, id int, holder string, now time.Time, ttl time.Duration) (persist.WorkerLease, bool, error) {
	tx, err := s.control.BeginTx(ctx, nil)
	if err != nil {
		return persist.WorkerLease{}, false, unavailable("acquire worker id", err)
	}
	defer tx.Rollback()
	l := persist.WorkerLease{WorkerID: id, Holder: holder, Expires: leaseEnd(now, ttl)}
	err = tx.QueryRowContext(ctx, `SELECT token, last_ms FROM worker_lease
		WHERE worker_id = ? AND (expires_at IS NULL OR expires_at < ?) FOR UPDATE SKIP LOCKED`, id, now.UTC()).Scan(&l.Token, &l.LastMs)
	if errors.Is(err, sql.ErrNoRows) {
		return persist.WorkerLease{}, false, nil
	}
	if err != nil {
		return persist.WorkerLease{}, false, unavailable("acquire worker id", err)
	}
	l.Token++
	if _, err := tx.ExecContext(ctx, `UPDATE worker_lease SET holder = ?, token = ?, expires_at = ? WHERE worker_id = ?`,
		holder, l.Token, l.Expires, id); err != nil {
		return persist.WorkerLease{}, false, unavailable("acquire worker id", err)
	}
	if err := tx.QueryRowContext(ctx, `SELECT `+storeMsSQL+`, COALESCE(MAX(last_ms), 0) FROM worker_lease WHERE holder = ?`, holder).
		Scan(&l.StoreMs, &l.HighWaterMs); err != nil {
		return persist.WorkerLease{}, false, unavailable("acquire worker id", err)
	}
	if err := tx.Commit(); err != nil {
		return persist.WorkerLease{}, false, unavailable("acquire worker id", err)
	}
	return l, true, nil
}

// RenewWorker extends lease to now+ttl and raises last_ms to lastMs.
func (s *Store) RenewWorker(ctx context.Context, lease persist.WorkerLease, lastMs int64, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	end := leaseEnd(now, ttl)
	res, err := s.control.ExecContext(ctx, `UPDATE worker_lease SET expires_at = ?, last_ms = GREATEST(last_ms, ?)
		WHERE worker_id = ? AND holder = ? AND token = ? AND expires_at >= ?`,
		end, lastMs, lease.WorkerID, lease.Holder, lease.Token, now.UTC())
	if err != nil {
		return persist.WorkerLease{}, unavailable("renew worker id", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return persist.WorkerLease{}, fmt.Errorf("mysql: renew worker id %d for %q: taken over, released or expired: %w",
			lease.WorkerID, lease.Holder, sequencer.ErrWorkerLeaseLost)
	}
	var stored, ms int64
	if err := s.control.QueryRowContext(ctx, `SELECT last_ms, `+storeMsSQL+` FROM worker_lease WHERE worker_id = ?`, lease.WorkerID).Scan(&stored, &ms); err != nil {
		return persist.WorkerLease{}, unavailable("renew worker id", err)
	}
	lease.Expires, lease.LastMs, lease.StoreMs, lease.HighWaterMs = end, stored, ms, 0
	return lease, nil
}

// ReleaseWorker frees lease if it is still held, setting last_ms to lastMs;
// a stale release only raises last_ms. (MySQL evaluates SET assignments left
// to right, so last_ms is computed before expires_at changes.)
func (s *Store) ReleaseWorker(ctx context.Context, lease persist.WorkerLease, lastMs int64) error {
	_, err := s.control.ExecContext(ctx, `UPDATE worker_lease
		SET last_ms = CASE WHEN holder = ? AND token = ? AND expires_at IS NOT NULL THEN ? ELSE GREATEST(last_ms, ?) END,
		    expires_at = CASE WHEN holder = ? AND token = ? THEN NULL ELSE expires_at END
		WHERE worker_id = ?`, lease.Holder, lease.Token, lastMs, lastMs, lease.Holder, lease.Token, lease.WorkerID)
	if err != nil {
		return unavailable("release worker id", err)
	}
	return nil
}
