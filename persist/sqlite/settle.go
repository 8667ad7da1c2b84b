package sqlite

import (
	"context"
	"fmt"
	"sync/atomic"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sequencer-im/sequencer"
)

// A full file system, and what a COMMIT that failed leaves behind.
//
// SQLITE_FULL (a write to the -wal file found no space) leaves no commit:
// SQLite writes a transaction's frames in order with its commit frame last,
// so the write that failed is at or before the commit frame, which is then
// missing or cut short in the file, and SQLite rolls the transaction back.
// Such a commit is answered as not written (ErrStoreUnavailable), with the
// domain reason errDiskFull.
//
// Any other error from COMMIT is an unknown outcome. An error after the
// frames were written, such as growing the -shm file (SQLITE_IOERR_SHMSIZE,
// when the file system fills between the frames and the -shm page) or an
// fsync that fails, leaves a whole, valid commit in the -wal file that this
// process never published: it sees the transaction rolled back, while the
// recovery after a crash (or any restart before the frames are overwritten)
// finds it and keeps it. The next transaction that commits writes its frames
// over them, after which no recovery can find them. So Settle, asked after
// such an error, commits a transaction of its own first (unless another one
// committed meanwhile), and fails while it cannot: until then the outcome
// stays unknown (TestPhantomCommitIsSettled).

// errDiskFull is the domain reason of a write refused for want of space on
// the file system of the database (its -wal or -shm file). Code
// unavailable: nothing was written; retry once space is back (docs/API.md).
var errDiskFull = &sequencer.Error{Code: sequencer.CodeUnavailable, Msg: "store out of disk space"}

// isDiskFull reports whether err is SQLite's "database or disk is full".
func isDiskFull(err error) bool { return sqliteCode(err)&0xff == sqlite3.SQLITE_FULL }

// settleState counts COMMITs that failed with an unknown outcome (failed)
// and the count that a later committed transaction covers (settled): it
// took the writer connection after they had failed, so its frames went over
// theirs. Both only grow.
type settleState struct {
	failed, settled atomic.Int64
}

// commitFailed records a COMMIT that failed with an unknown outcome; call it
// while still holding the writer connection.
func (s *settleState) commitFailed() { s.failed.Add(1) }

// committed records a transaction that committed on the writer connection
// taken when failed read gen.
func (s *settleState) committed(gen int64) {
	for {
		cur := s.settled.Load()
		if gen <= cur || s.settled.CompareAndSwap(cur, gen) {
			return
		}
	}
}

func (s *settleState) unsettled() bool { return s.settled.Load() < s.failed.Load() }

// Settle returns once no COMMIT that failed with an unknown outcome can
// still be found by a recovery: at once if a transaction committed after
// each of them, else after committing one (it sets the file's user_version,
// which nothing else uses, to count such settles). It fails, retryably,
// while that commit fails (for example while the file system is full).
func (s *Store) Settle(ctx context.Context) error {
	if !s.settle.unsettled() {
		return nil
	}
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return unavailable("settle: writer connection", err)
	}
	defer conn.Close()
	gen := s.settle.failed.Load()
	var n int64
	if err := conn.QueryRowContext(ctx, "PRAGMA user_version").Scan(&n); err != nil {
		return unavailable("settle: read user_version", err)
	}
	// Two statements in one transaction would need BEGIN; PRAGMA
	// user_version = N is one write transaction on its own.
	_, err = conn.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", int32(n+1)))
	s.wrote(err)
	if err != nil {
		s.settle.commitFailed() // its own frames may be there too
		return fmt.Errorf("sqlite: settle: the outcome of a failed COMMIT stays unknown until a transaction commits after it: %w", unavailable("settle", err))
	}
	s.settle.committed(gen)
	return nil
}

// wrote notes the result of a write on the writer connection: SQLITE_FULL
// marks the store full (Ping fails), a success unmarks it.
func (s *Store) wrote(err error) {
	switch {
	case err == nil:
		s.full.Store(false)
	case isDiskFull(err):
		s.full.Store(true)
	}
}
