package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A commit whose outcome is unknown (the connection was lost or timed out
// after its COMMIT went out) may still be running on the server: MySQL does
// not notice a closed client socket while a statement runs (a lock wait, a
// slow fsync, a frozen disk), and when the statement ends the thread goes
// on to COMMIT. If the writer re-read the rows before that, it would answer
// "not stored" for a message that lands a moment later. So the store
// remembers the server thread (CONNECTION_ID(), read when the commit's
// connection opened: thread.go) of every such commit, and Settle KILLs it from a control
// connection and waits until it is gone from information_schema.PROCESSLIST.
// A killed thread finishes the commit it is in the middle of or rolls back;
// once it is gone, the rows by key are the final truth.
//
// Thread ids are unique while the server runs; after a restart they start
// again, but a restart ended every thread of before it: Settle compares the
// server's start time with the one read at Open and settles everything when
// it changed, without killing anything.

// unsettle remembers that thread may still commit.
func (s *Store) unsettle(thread uint64) {
	if thread == 0 {
		return
	}
	s.settleMu.Lock()
	defer s.settleMu.Unlock()
	if s.unsettled == nil {
		s.unsettled = make(map[uint64]bool)
	}
	s.unsettled[thread] = true
}

// settlePoll is how often Settle looks whether a killed thread is gone.
const settlePoll = 20 * time.Millisecond

// Settle implements persist.Store: it kills the server thread of every
// commit whose outcome was unknown and waits until each is gone. It needs
// the right to kill the store user's own threads (every user has it) and
// to see them in PROCESSLIST (likewise). It returns an unavailable error
// when ctx ends first or the server cannot be asked; the caller retries.
func (s *Store) Settle(ctx context.Context) error {
	s.settleMu.Lock()
	pending := make([]uint64, 0, len(s.unsettled))
	for t := range s.unsettled {
		pending = append(pending, t)
	}
	s.settleMu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	var started int64
	if err := s.control.QueryRowContext(ctx, `SELECT CAST(UNIX_TIMESTAMP() - VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'`).Scan(&started); err != nil {
		return unavailable("settle: read the server's start", err)
	}
	restarted := started-s.started > 2 || s.started-started > 2
	for _, t := range pending {
		if !restarted {
			if err := s.settleOne(ctx, t); err != nil {
				return err
			}
		}
		s.settleMu.Lock()
		delete(s.unsettled, t)
		s.settleMu.Unlock()
	}
	return nil
}

// A thread waiting for a semi-synchronous replica's acknowledgement has
// committed in the primary's binary log already; killing it would end the
// wait and make the commit visible although no replica has it (a failover
// would lose it). Such a thread is left to finish (it ends when a replica
// acknowledges, or the semi-sync timeout passes), and Settle waits for it.
func (s *Store) settleOne(ctx context.Context, thread uint64) error {
	var state string
	err := s.control.QueryRowContext(ctx, `SELECT COALESCE(STATE, '') FROM information_schema.PROCESSLIST WHERE ID = ?`, thread).Scan(&state)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return unavailable("settle: read the thread of an unknown commit", err)
	}
	if !strings.Contains(strings.ToLower(state), "semi-sync") {
		if _, err := s.control.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", thread)); err != nil && !isNumber(err, erNoSuchThread) {
			return unavailable("settle: kill the thread of an unknown commit", err)
		}
	}
	for {
		var n int
		if err := s.control.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?`, thread).Scan(&n); err != nil {
			return unavailable("settle: wait for the thread of an unknown commit", err)
		}
		if n == 0 {
			return nil
		}
		t := time.NewTimer(settlePoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return unavailable("settle: the thread of an unknown commit is still running", ctx.Err())
		}
	}
}
