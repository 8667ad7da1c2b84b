// Package sqlite is the embedded implementation of persist.Store: one SQLite
// file (modernc.org/sqlite, pure Go), the same schema as persist/postgres
// mirrored in SQLite types, and the same semantics (the conformance suite in
// persist/storetest runs against both).
//
// It owns the file and its schema (embedded, versioned migrations, applied by
// Migrate). Durability: WAL journal with synchronous=FULL, so a Commit that
// returned nil survives a power loss. All writes go through ONE connection
// (SQLite has one writer; serializing in-process avoids lock churn), each
// commit in a BEGIN IMMEDIATE transaction; reads use a separate pool.
//
// It never assigns seqs or msg_ids and never decides ownership. One process
// owns the file: it is the single-node store (no cluster over a file).
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// Options configures a Store. The zero value is usable.
type Options struct {
	// BusyTimeout is how long a statement waits for a lock held by another
	// connection or process. Default 5s.
	BusyTimeout time.Duration
	// ReadConns is the size of the read pool. Default 4.
	ReadConns int
	// LockHolder names this process in the lock file (the node id); see
	// lock.go.
	LockHolder string
	// Shared opens without taking the exclusive lock: for operator tools
	// (sequencer admin: head, trim, backup) next to a running node. SQLite's
	// own locking keeps their statements safe; the exclusive lock exists to
	// keep a second node from serving the same store.
	Shared bool
}

func (o Options) withDefaults() Options {
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 5 * time.Second
	}
	if o.ReadConns <= 0 {
		o.ReadConns = 4
	}
	return o
}

// writerCacheKiB is the writer connection's page cache (cache_size).
const writerCacheKiB = 64 << 10

// walCheckpointPages is the WAL size, in pages, past which a commit copies
// the WAL back into the database file (wal_autocheckpoint). SQLite's default
// of 1,000 pages (4 MiB) made the writer checkpoint every few commits under
// load, rewriting the same hot index pages each time (16% of the writer's
// CPU); at 10,000 pages (about 40 MiB of WAL) a page dirtied by many commits
// is copied back once (5%). The WAL file keeps its largest size between
// checkpoints.
const walCheckpointPages = 10000

// Store is a persist.Store on one SQLite file. It is safe for concurrent use.
type Store struct {
	path string
	w    *sql.DB // the one writer connection
	r    *sql.DB // readers
	ping *sql.DB // one reader for Ping only
	lock *dirLock

	insMu sync.Mutex
	ins   map[int]*sql.Stmt // prepared row INSERTs by row count (commit.go)

	// The group commit (commit.go): Commit queues its call, the writer
	// goroutine (writeLoop) takes the queue.
	qmu      sync.Mutex
	queue    []*commitReq
	closing  bool
	wake     chan struct{} // a call was queued (buffer 1)
	stop     chan struct{} // closed by Close
	loopDone chan struct{} // closed when writeLoop returned
	calls    atomic.Int64  // Commit calls queued
	groups   atomic.Int64  // groups of calls taken by writeLoop

	markOnce sync.Once
	marks    *persist.MarkBatcher // MarkRead's group commit (readpos.go)

	pend   *pendingMarks // the own-send marks logged, not yet applied (marklog.go)
	shared bool          // Options.Shared: the writer never applies the log on its own

	full   atomic.Bool // the last write found the file system full (settle.go)
	settle settleState // COMMITs of unknown outcome, and what settled them
}

var _ persist.Store = (*Store)(nil)

// Open opens (creating it and its directory if needed) the database file at
// path. It does not migrate; call Migrate.
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	if path == "" {
		return nil, errors.New("sqlite: empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	// A directory Open creates is private (0700); the files are 0600 (SQLite
	// gives the -wal and -shm files the database file's mode).
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, unavailable("create directory", err)
	}
	var lock *dirLock
	if !opts.Shared {
		if lock, err = lockDB(abs, opts.LockHolder); err != nil {
			return nil, err
		}
	}
	ok := false
	defer func() {
		if !ok {
			lock.release()
		}
	}()
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, unavailable("create "+abs, err)
	}
	f.Close()
	for _, name := range []string{abs, abs + "-wal", abs + "-shm"} {
		_ = os.Chmod(name, 0o600) // files of an older version were 0644
	}
	busy := strconv.FormatInt(opts.BusyTimeout.Milliseconds(), 10)
	file := "file:" + (&url.URL{Path: abs}).EscapedPath()
	wq := url.Values{}
	wq.Add("_pragma", "busy_timeout("+busy+")")
	wq.Add("_pragma", "journal_mode(WAL)")
	wq.Add("_pragma", "synchronous(FULL)")
	// Statement journals (each multi-row INSERT may need to undo itself on
	// a constraint violation) in memory, not in a temporary file: they only
	// serve a rollback inside the open transaction, never recovery.
	wq.Add("_pragma", "temp_store(MEMORY)")
	// A page cache that holds the indexes' hot pages (SQLite's default is
	// 2 MiB): random conv_id and client key inserts otherwise re-read pages.
	wq.Add("_pragma", "cache_size(-"+strconv.Itoa(writerCacheKiB)+")")
	wq.Add("_pragma", "wal_autocheckpoint("+strconv.Itoa(walCheckpointPages)+")")
	wq.Set("_txlock", "immediate")
	// The writer's -wal file gathers its writes (walbuf.go).
	if err := registerWALBufVFS(); err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	wq.Set("vfs", walBufVFS)
	w, err := sql.Open("sqlite", file+"?"+wq.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	if err := w.PingContext(ctx); err != nil {
		w.Close()
		return nil, unavailable("open "+abs, err)
	}
	var mode string
	if err := w.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		w.Close()
		return nil, fmt.Errorf("sqlite: %s: journal_mode is %q, want wal (%v)", abs, mode, err)
	}
	rq := url.Values{}
	rq.Add("_pragma", "busy_timeout("+busy+")")
	rq.Add("_pragma", "query_only(1)")
	r, err := sql.Open("sqlite", file+"?"+rq.Encode())
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	r.SetMaxOpenConns(opts.ReadConns)
	r.SetMaxIdleConns(opts.ReadConns)
	// Ping's own connection: a burst of reads (10,000 Subscribe streams
	// each reading its backlog) queues on the readers for seconds, and a
	// ping queued behind them made /readyz answer 503 "store unavailable".
	ping, err := sql.Open("sqlite", file+"?"+rq.Encode())
	if err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	ping.SetMaxOpenConns(1)
	ping.SetMaxIdleConns(1)
	ok = true
	s := &Store{path: abs, w: w, r: r, ping: ping, lock: lock, pend: newPendingMarks(), shared: opts.Shared,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), loopDone: make(chan struct{})}
	go s.writeLoop()
	return s, nil
}

// Path returns the database file's absolute path.
func (s *Store) Path() string { return s.path }

// Ping checks the file can be read, and fails while the last write found
// the file system full (errDiskFull; a write that succeeds clears it: the
// node's worker-id lease renewals keep trying every few seconds).
func (s *Store) Ping(ctx context.Context) error {
	if s.full.Load() {
		return fmt.Errorf("sqlite: ping: the last write found %s's file system full: %w (%w)", s.path, errDiskFull, sequencer.ErrStoreUnavailable)
	}
	var one int
	if err := s.ping.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		return unavailable("ping", err)
	}
	return nil
}

// Close closes the pools (the WAL is checkpointed by SQLite on the last
// close).
func (s *Store) Close() error {
	s.qmu.Lock()
	if !s.closing {
		s.closing = true
		close(s.stop)
	}
	s.qmu.Unlock()
	<-s.loopDone // the calls queued before Close are committed
	s.insMu.Lock()
	var errs []error
	for _, st := range s.ins {
		errs = append(errs, st.Close())
	}
	s.ins = nil
	s.insMu.Unlock()
	return errors.Join(append(errs, s.ping.Close(), s.r.Close(), s.w.Close(), s.lock.release())...)
}

// unavailable is the error of a write or read that changed nothing; a full
// file system gives the domain reason errDiskFull first.
func unavailable(op string, err error) error {
	if isDiskFull(err) {
		return fmt.Errorf("sqlite: %s: %w (%w; %w)", op, errDiskFull, sequencer.ErrStoreUnavailable, err)
	}
	return fmt.Errorf("sqlite: %s: %w (%w)", op, sequencer.ErrStoreUnavailable, err)
}

func unknownOutcome(op string, err error) error {
	return fmt.Errorf("sqlite: %s: %w (%w)", op, sequencer.ErrUnknownOutcome, err)
}

// sqliteCode returns the extended result code of err, or 0.
func sqliteCode(err error) int {
	var e *msqlite.Error
	if errors.As(err, &e) {
		return e.Code()
	}
	return 0
}

func isUniqueViolation(err error) bool {
	c := sqliteCode(err)
	return c == sqlite3.SQLITE_CONSTRAINT_UNIQUE || c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

// classify maps an error of a statement that changed nothing: constraint
// violations are bugs in the caller (not retryable); everything else (busy,
// I/O, canceled) is ErrStoreUnavailable.
func classify(op string, err error) error {
	if sqliteCode(err)&0xff == sqlite3.SQLITE_CONSTRAINT {
		return fmt.Errorf("sqlite: %s: %w", op, err)
	}
	return unavailable(op, err)
}

// The abilities the embedded store has beyond persist.Store.
var (
	_ persist.Migrator = (*Store)(nil)
	_ persist.Backuper = (*Store)(nil)
)
