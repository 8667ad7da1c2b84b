package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer/persist"
)

// A commit whose outcome is unknown (the connection was lost or timed out
// after COMMIT went out) may still be running on the server: a backend that
// stalled (descheduled, fsync, a replication wait) ignores the cancel and
// the closed socket until it runs again, and then it can commit. If the
// writer re-read the head before that, it would answer "not stored" for a
// message that lands a moment later. So the store remembers the backend of
// every such commit, and Settle terminates it and waits until it is gone:
// from then on its transaction is committed or rolled back for good.
//
// A backend is named by its pid and its backend_start (read once per
// connection), so a pid reused by a later, unrelated session is never
// terminated.

// backendKey identifies one server session.
type backendKey struct {
	pid   uint32
	start time.Time
}

const backendStartKey = "sequencer.backend_start"

// afterConnect records the new session's backend_start on the connection.
// It also registers the presizing of a commit's arguments (presize.go).
func afterConnect(ctx context.Context, c *pgx.Conn) error {
	registerPresize(c.TypeMap())
	var start time.Time
	if err := c.QueryRow(ctx, `SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&start); err != nil {
		return fmt.Errorf("read backend_start: %w", err)
	}
	c.PgConn().CustomData()[backendStartKey] = start
	return nil
}

// backendOf returns the session key of a connection.
func backendOf(c *pgconn.PgConn) backendKey {
	start, _ := c.CustomData()[backendStartKey].(time.Time)
	return backendKey{pid: c.PID(), start: start}
}

// unsettledCommit is a commit whose outcome is unknown: the pool of the
// server its backend runs on (nil: the store's own server) and the
// conversations whose rows it may hold.
type unsettledCommit struct {
	pool  *pgxpool.Pool
	convs []string
}

// unsettle remembers that b, a backend of the server pool connects to (nil:
// the store's own server), may still commit the rows of batches.
func (s *Store) unsettle(b backendKey, pool *pgxpool.Pool, batches []persist.ConvBatch) {
	convs := make([]string, len(batches))
	for i := range batches {
		convs[i] = batches[i].ConvID
	}
	s.settleMu.Lock()
	defer s.settleMu.Unlock()
	if s.unsettled == nil {
		s.unsettled = make(map[backendKey]unsettledCommit)
	}
	s.unsettled[b] = unsettledCommit{pool: pool, convs: convs}
}

// settlePoll is how often Settle looks whether a terminated backend is gone.
const settlePoll = 20 * time.Millisecond

// Settle implements persist.Store: it terminates the backend of every commit
// whose outcome was unknown and waits until each is gone (see above). A
// backend stopped by the OS (SIGSTOP) is gone only after it runs again, so
// Settle can take as long as the stall; it returns ctx's error (wrapped as
// unavailable) when ctx ends first, and the caller tries again later.
func (s *Store) Settle(ctx context.Context) error { return s.SettleThen(ctx, nil, nil) }

// SettleConvs implements persist.ConvSettler: Settle for the unknown commits
// that may hold rows of convIDs only. On Citus a commit touches only the
// workers of its conversations, so a conversation whose worker answers is
// not held up by an unknown commit on a worker that is down.
func (s *Store) SettleConvs(ctx context.Context, convIDs []string) error {
	if len(convIDs) == 0 {
		return nil
	}
	return s.SettleThen(ctx, convIDs, nil)
}

// SettleThen settles the unknown commits that may hold rows of convIDs
// (nil: every one). ended, if not nil, runs after a backend of the store's
// own server is gone, before the commit counts as settled (persist/citus:
// end the prepared transactions a commit through the coordinator left on
// the workers).
func (s *Store) SettleThen(ctx context.Context, convIDs []string, ended func(context.Context) error) error {
	s.settleMu.Lock()
	pending := make([]backendKey, 0, len(s.unsettled))
	pools := make([]*pgxpool.Pool, 0, len(s.unsettled))
	for b, u := range s.unsettled {
		if convIDs != nil && !slices.ContainsFunc(u.convs, func(c string) bool { return slices.Contains(convIDs, c) }) {
			continue
		}
		pending = append(pending, b)
		pools = append(pools, u.pool)
	}
	s.settleMu.Unlock()
	for i, b := range pending {
		pool := pools[i]
		if pool == nil {
			pool = s.control
		}
		if err := s.settleOne(ctx, pool, b); err != nil {
			return err
		}
		if ended != nil && pool == s.control {
			if err := ended(ctx); err != nil {
				return err
			}
		}
		s.settleMu.Lock()
		delete(s.unsettled, b)
		s.settleMu.Unlock()
	}
	return nil
}

func (s *Store) settleOne(ctx context.Context, pool *pgxpool.Pool, b backendKey) error {
	// Without pg_signal_backend (or the same role) the terminate is refused:
	// then wait for the backend to end by itself. A backend waiting for a
	// synchronous standby (wait_event SyncRep) has committed locally;
	// terminating it would end the wait and publish a commit no standby has
	// (a failover would lose it), so it is left to finish: it ends once a
	// standby confirms, and Settle waits for that.
	_, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE pid = $1 AND backend_start = $2 AND wait_event IS DISTINCT FROM 'SyncRep'`,
		int64(b.pid), b.start)
	var pg *pgconn.PgError
	if err != nil && !(errors.As(err, &pg) && pg.Code == "42501") {
		return unavailable("settle: terminate the backend of an unknown commit", err)
	}
	for {
		var alive bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2)`,
			int64(b.pid), b.start).Scan(&alive)
		if err != nil {
			return unavailable("settle: wait for the backend of an unknown commit", err)
		}
		if !alive {
			return nil
		}
		t := time.NewTimer(settlePoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return unavailable("settle: the backend of an unknown commit is still running", ctx.Err())
		}
	}
}
