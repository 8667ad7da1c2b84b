// Package open turns the `--store` setting into a ready persist.Store: it
// owns the spelling of store specs (docs/API.md, "Command line"), their redaction for logs
// and errors, the choice of implementation, the lock on the embedded store's
// directory, and migrates the schema on open. It never holds state of its
// own besides that lock and is the only package besides cmd/ that imports
// both stores.
//
// Specs (an allow-list; anything else is refused by Parse):
//   - "postgres://..." or "postgresql://..." (the scheme in lower case, as
//     libpq and pgx spell it): persist/postgres with that URL DSN;
//   - a libpq keyword/value DSN ("host=db dbname=seq user=app"): the first
//     word is "key=": persist/postgres with that DSN;
//   - "sqlite:PATH" (also "sqlite://PATH"), or a filesystem path without
//     "://": persist/sqlite on the file PATH; when PATH is a directory (an
//     existing one, one ending in a path separator, or any path whose last
//     element has no .db/.sqlite/.sqlite3 extension) the file is
//     PATH/sequencer.db;
//   - "mysql://user:pass@host:port/db" (port 3306 by default;
//     "?socket=PATH" for a unix socket, other parameters as
//     github.com/go-sql-driver/mysql takes them): persist/mysql;
//   - "": the embedded store under ./data (./data/sequencer.db).
//
// Refused: any other "scheme://" ("postgress://", "POSTGRES://", "MYSQL://",
// "file://"); a keyword DSN that does not parse; a mysql:// URL without a
// host or database; the go-sql-driver DSN form ("user:pass@tcp(host:port)/db"),
// which would otherwise be taken for a path: the error says to write it as
// a mysql:// URL. No form of a password is
// ever part of a Spec's String, of Redact's answer or of an error this
// package returns.
package open

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/sequencer-im/sequencer"

	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/citus"
	"github.com/sequencer-im/sequencer/persist/mysql"
	"github.com/sequencer-im/sequencer/persist/mysql/mysqlurl"
	"github.com/sequencer-im/sequencer/persist/postgres"
	"github.com/sequencer-im/sequencer/persist/sqlite"
)

// DefaultDir is where the embedded store lives when the spec is empty.
const DefaultDir = "./data"

// DBFile is the embedded store's file name inside a directory.
const DBFile = "sequencer.db"

// Kind names a store implementation.
type Kind string

const (
	KindPostgres Kind = "postgres"
	KindSQLite   Kind = "sqlite"
	KindMySQL    Kind = "mysql"
)

// Shared reports whether the kind is a database server that several nodes
// can share: such a store carries the cluster's membership table.
func (k Kind) Shared() bool { return k == KindPostgres || k == KindMySQL }

// Spec is a parsed store spec.
type Spec struct {
	Kind Kind
	// DSN is the PostgreSQL connection string (KindPostgres) or the
	// mysql:// URL (KindMySQL).
	DSN string
	// Path is the SQLite database file (KindSQLite).
	Path string
}

// String describes the spec without secrets (a DSN's password is hidden).
func (s Spec) String() string {
	switch s.Kind {
	case KindPostgres:
		return "postgres " + Redact(s.DSN)
	case KindMySQL:
		return "mysql " + Redact(s.DSN)
	}
	return "sqlite " + s.Path
}

// Options are the store settings, one nested struct whatever the store:
// the caller (server, admin, the bench) never names a driver's own options.
// A zero field means that store's default; the zero value migrates on open
// with every default.
type Options struct {
	// NoMigrate skips applying schema migrations on open.
	NoMigrate bool
	// Pools sizes a server store's connection pools (PostgreSQL, Citus,
	// MySQL).
	Pools Pools
	// MaxBody is the largest message body the store must hold (MySQL sizes
	// im_message.body from it). 0: 65,536.
	MaxBody int
	// Logger receives a store's rare notices (Citus: "distributed: N
	// workers, M shards"). Optional.
	Logger *slog.Logger
	// Embedded configures the embedded store.
	Embedded Embedded
	// Citus configures a distributed store.
	Citus Citus
}

// Citus configures a distributed store.
type Citus struct {
	// NoLeaseCheck skips the lease-cache check before a commit, so that a
	// stale owner's commits reach the workers and only the head row's epoch
	// fences them: tests only (TestNoLeaseCheckEnv).
	NoLeaseCheck bool
}

// TestNoLeaseCheckEnv, for tests only: when set (to anything) in a node's
// environment, the node opens its store with Citus.NoLeaseCheck (the e2e
// zombie test on Citus freezes such a node past its lease). package server
// reads it; never set it in production.
const TestNoLeaseCheckEnv = "SEQUENCER_TEST_CITUS_NO_LEASE_CHECK"

// Pools sizes the read, commit and control connection pools of a server
// store (--store-conns, --store-commit-conns, --store-control-conns).
type Pools struct {
	// Read serves Pull, lookups, head loads and retention.
	Read int
	// Commit is used by Commit only: give it as many connections as commits
	// run in parallel (the group-commit workers).
	Commit int
	// Control serves membership, the worker-id lease and Settle.
	Control int
}

// Embedded configures the embedded store.
type Embedded struct {
	// LockHolder names this process in the store's lock file (the node id).
	LockHolder string
	// Shared opens without taking the exclusive lock (operator tools next
	// to a running node).
	Shared bool
}

// DefaultOptions returns the defaults a node starts from: PostgreSQL's pool
// sizes (MySQL's read pool defaults to 16 when Pools.Read is 0).
func DefaultOptions() Options {
	pg := postgres.DefaultOptions()
	return Options{Pools: Pools{Read: int(pg.MaxConns), Commit: int(pg.CommitConns), Control: int(pg.ControlConns)}}
}

func (o Options) postgres() postgres.Options {
	return postgres.Options{MaxConns: int32(o.Pools.Read), CommitConns: int32(o.Pools.Commit),
		ControlConns: int32(o.Pools.Control), Logger: o.Logger}
}

func (o Options) citus() citus.Options {
	return citus.Options{Options: o.postgres(), NoLeaseCheck: o.Citus.NoLeaseCheck}
}

func (o Options) mysql() mysql.Options {
	return mysql.Options{MaxConns: o.Pools.Read, CommitConns: o.Pools.Commit, ControlConns: o.Pools.Control, MaxBody: o.MaxBody}
}

func (o Options) sqlite() sqlite.Options {
	return sqlite.Options{LockHolder: o.Embedded.LockHolder, Shared: o.Embedded.Shared}
}

// Parse reads a store spec (see the package comment). Its errors name the
// spec redacted and say what is accepted.
func Parse(spec string) (Spec, error) {
	spec = strings.TrimSpace(spec)
	switch {
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		return Spec{Kind: KindPostgres, DSN: spec}, nil
	case strings.HasPrefix(spec, "mysql://"):
		if _, err := mysqlurl.Parse(spec); err != nil {
			return Spec{}, fmt.Errorf("store %s: %w", Redact(spec), err)
		}
		return Spec{Kind: KindMySQL, DSN: spec}, nil
	case isDriverDSN(spec):
		return Spec{}, fmt.Errorf("store %s: the go-sql-driver DSN form is not accepted; write it as mysql://user:pass@host:port/db (or mysql://user@localhost/db?socket=PATH)", Redact(spec))
	case spec == "":
		return Spec{Kind: KindSQLite, Path: filepath.Join(DefaultDir, DBFile)}, nil
	case isKeywordDSN(spec):
		if _, err := parseKeywordDSN(spec); err != nil {
			return Spec{}, fmt.Errorf("store: keyword DSN %s: %w", Redact(spec), err)
		}
		return Spec{Kind: KindPostgres, DSN: spec}, nil
	}
	path := spec
	if p, ok := strings.CutPrefix(spec, "sqlite://"); ok {
		path = p
	} else if p, ok := strings.CutPrefix(spec, "sqlite:"); ok {
		path = p
	} else if scheme, _, ok := strings.Cut(spec, "://"); ok {
		return Spec{}, fmt.Errorf("store %s: unsupported scheme %q; use postgres://, postgresql://, a libpq keyword DSN (host=... dbname=...), mysql://, sqlite:PATH or a directory path",
			Redact(spec), scheme)
	}
	if path == "" {
		return Spec{}, fmt.Errorf("store spec %q has no path", spec)
	}
	if isDir(path) {
		path = filepath.Join(path, DBFile)
	}
	return Spec{Kind: KindSQLite, Path: filepath.Clean(path)}, nil
}

func isDir(path string) bool {
	if fi, err := os.Stat(path); err == nil {
		return fi.IsDir()
	}
	if strings.HasSuffix(path, string(filepath.Separator)) || strings.HasSuffix(path, "/") {
		return true
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".db", ".sqlite", ".sqlite3":
		return false
	}
	return true
}

// Store opens the store spec names and, unless opts.NoMigrate, migrates its
// schema. Callers use the store through persist's interfaces only: its
// optional abilities are persist.Migrator (every store), persist.Backuper
// (embedded), persist.PoolReporter (PostgreSQL, Citus, MySQL),
// persist.RetryCounter (MySQL), persist.Sharded (Citus) and
// membership.Provider (the shared stores).
func Store(ctx context.Context, spec string, opts Options) (persist.Store, error) {
	sp, err := Parse(spec)
	if err != nil {
		return nil, err
	}
	switch sp.Kind {
	case KindPostgres:
		// A driver error may echo the DSN: every spelling of its password
		// is scrubbed from the text.
		ps, err := postgres.Open(ctx, sp.DSN, opts.postgres())
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", sp, ScrubError(sp.DSN, err))
		}
		// A Citus coordinator's database (the citus extension found) is
		// a Citus store (persist/citus), with its own schema, commits and
		// shard views.
		var s interface {
			persist.Store
			persist.Migrator
		} = ps
		cs, isCitus, err := citus.Of(ctx, ps, opts.citus())
		if err != nil {
			ps.Close()
			return nil, fmt.Errorf("open %s: %w", sp, ScrubError(sp.DSN, err))
		}
		if isCitus {
			s = cs
		}
		if !opts.NoMigrate {
			if err := migrate(ctx, s, opts.Logger); err != nil {
				s.Close()
				return nil, fmt.Errorf("open %s: migrate: %w", sp, ScrubError(sp.DSN, err))
			}
		}
		return s, nil
	case KindMySQL:
		s, err := mysql.Open(ctx, sp.DSN, opts.mysql())
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", sp, ScrubError(sp.DSN, err))
		}
		if !opts.NoMigrate {
			if err := migrate(ctx, s, opts.Logger); err != nil {
				s.Close()
				return nil, fmt.Errorf("open %s: migrate: %w", sp, ScrubError(sp.DSN, err))
			}
		}
		return s, nil
	default:
		s, err := sqlite.Open(ctx, sp.Path, opts.sqlite())
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", sp, err)
		}
		if !opts.NoMigrate {
			if err := s.Migrate(ctx); err != nil {
				s.Close()
				return nil, fmt.Errorf("open %s: migrate: %w", sp, err)
			}
		}
		return s, nil
	}
}

// MigrateRetryFor bounds how long migrate tries again a shared store that
// did not answer (the caller's context may end it sooner).
const MigrateRetryFor = 30 * time.Second

// migrate applies a shared store's schema, trying again while the store only
// failed to answer (sequencer.ErrStoreUnavailable: a node restarted on a
// loaded store, a connection the server closed mid-migration for idling in
// its transaction), with exponential backoff (cenkalti/backoff) for at most
// MigrateRetryFor. Each migration is one transaction that re-checks the
// recorded versions under its lock, so a retry applies each migration once.
// Any other error (a refused migration, a newer schema) is returned at once.
func migrate(ctx context.Context, m persist.Migrator, log *slog.Logger) error {
	var last error
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		err := m.Migrate(ctx)
		if err != nil && !errors.Is(err, sequencer.ErrStoreUnavailable) {
			return struct{}{}, backoff.Permanent(err)
		}
		last = err
		return struct{}{}, err
	}, backoff.WithBackOff(migrateBackOff()), backoff.WithMaxElapsedTime(MigrateRetryFor),
		backoff.WithNotify(func(err error, wait time.Duration) {
			if log != nil {
				log.Warn("migrate: the store did not answer; retrying", "in", wait, "err", err)
			}
		}))
	if err != nil && last != nil && !errors.Is(err, sequencer.ErrStoreUnavailable) {
		// The context or the bound ended the retries: the store's own
		// error says more.
		return last
	}
	return err
}

func migrateBackOff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 100*time.Millisecond, 2*time.Second
	return b
}
