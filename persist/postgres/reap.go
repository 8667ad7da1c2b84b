package postgres

import (
	"context"
	"time"
)

// DefaultStuckAfter is how long a session blocking an Acquire may sit idle
// in its transaction before Acquire terminates it (ClusterStore). A commit
// is idle in its transaction only between its pipelined statements and its
// COMMIT (one round trip); longer means the process holding it is frozen or
// cut off.
const DefaultStuckAfter = time.Second

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
	return c.with(func(cp *ClusterStore) { cp.stuckAfter = d })
}
