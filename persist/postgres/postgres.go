// Package postgres is the PostgreSQL implementation of persist.Store (pgx/v5,
// pgxpool).
//
// It owns the SQL schema (embedded, versioned migrations under migrations/,
// applied by Migrate) and the SQL of every Store method. A Commit is ONE
// transaction spanning all its conversations: fence checks (FOR SHARE on
// partition_lease), a head compare-and-set on conv_head, and the rows; the
// checks fail inside the server when they refuse, so BEGIN .. COMMIT goes
// pipelined in one round trip (large commits: COPY, then COMMIT). It
// classifies errors as persist.Store documents: refusals are typed
// (persist.StaleFenceError, HeadMismatchError, ConflictError), a failure
// before COMMIT was sent is sequencer.ErrStoreUnavailable (nothing
// written), and a lost connection, timeout or cancel once COMMIT is on its
// way is sequencer.ErrUnknownOutcome.
//
// It never assigns seqs or msg_ids and never decides ownership; it only
// refuses commits that would break contiguity, uniqueness or fencing.
//
// Ids are uint64 in Go and BIGINT in SQL; they are always below 2^63
// (persist.CheckBatches refuses larger ones). server_at is stored with
// millisecond precision and returned in UTC.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// Options configures a Store. The zero value is usable.
type Options struct {
	// MaxConns is the pool size. Default 8 (group-commit writers plus reads).
	MaxConns int32
	// ConnectTimeout bounds dialing one connection. Default 5s.
	ConnectTimeout time.Duration
	// IdleInTxTimeout is the server's idle_in_transaction_session_timeout
	// for the store's sessions: a session left idle inside a transaction
	// this long (its process frozen or partitioned away mid-transaction) is
	// terminated and rolled back, so its row locks (partition leases, the
	// membership version row) cannot stall the live nodes past their
	// membership TTL. The store's own transactions never wait on the client
	// that long. Default 1s; a value in the DSN's options wins.
	IdleInTxTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxConns <= 0 {
		o.MaxConns = 8
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	if o.IdleInTxTimeout <= 0 {
		o.IdleInTxTimeout = time.Second
	}
	return o
}

// insertMode selects how Commit writes rows.
type insertMode int

const (
	// insertAuto (the default) uses COPY for commits of at least
	// copyMinRows rows and the unnest INSERT below that. Measured on 2 shared
	// cores (README.md): COPY is 10-28% faster at 2,000-4,000 rows; below
	// ~1,000 rows the unnest INSERT, pipelined with the checks, saves a round
	// trip and is as fast or faster.
	insertAuto   insertMode = iota
	insertUnnest            // INSERT ... SELECT FROM unnest($arrays), pipelined with the checks
	insertCopy              // COPY FROM STDIN after the checks (one extra round trip)
)

// copyMinRows is the commit size from which insertAuto uses COPY.
const copyMinRows = 1000

// Store is a persist.Store on PostgreSQL. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	mode insertMode

	settleMu  sync.Mutex
	unsettled map[backendKey]bool // backends of commits whose outcome is unknown (settle.go)

	beforeCommit func(pid uint32) // tests: called with the backend pid before each commit is sent
}

var _ persist.Store = (*Store)(nil)

const idleInTxParam = "idle_in_transaction_session_timeout"

// Open connects to the database at dsn (a postgres:// URL or keyword/value
// DSN) and checks it answers. It does not migrate; call Migrate.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse DSN: %w", err)
	}
	cfg.MaxConns = opts.MaxConns
	cfg.ConnConfig.ConnectTimeout = opts.ConnectTimeout
	cfg.AfterConnect = afterConnect
	if _, set := cfg.ConnConfig.RuntimeParams[idleInTxParam]; !set {
		cfg.ConnConfig.RuntimeParams[idleInTxParam] = strconv.FormatInt(opts.IdleInTxTimeout.Milliseconds(), 10)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrStoreUnavailable, fmt.Sprintf("postgres: open pool: %v", err))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, unavailable("ping", err)
	}
	return &Store{pool: pool}, nil
}

// Pool exposes the connection pool to packages that keep their own tables in
// the same database (the cluster's membership and partition leases).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Ping checks the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return unavailable("ping", err)
	}
	return nil
}

// Close closes every connection.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// unavailable wraps err as sequencer.ErrStoreUnavailable: the operation did
// not change anything and may be retried.
func unavailable(op string, err error) error {
	return fmt.Errorf("postgres: %s: %w (%w)", op, sequencer.ErrStoreUnavailable, err)
}

// unknownOutcome wraps err as sequencer.ErrUnknownOutcome.
func unknownOutcome(op string, err error) error {
	return fmt.Errorf("postgres: %s: %w (%w)", op, sequencer.ErrUnknownOutcome, err)
}

// classify maps an error of a statement that changed nothing: server-side
// data errors (class 22, 23) are persist.ErrRejected (the data cannot be
// stored; not retryable); every other error (connection, timeout, cancel,
// deadlock, shutdown) is ErrStoreUnavailable.
func classify(op string, err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && len(pg.Code) == 5 && (pg.Code[:2] == "22" || pg.Code[:2] == "23") {
		return fmt.Errorf("postgres: %s: %w (%w)", op, persist.ErrRejected, err)
	}
	return unavailable(op, err)
}
