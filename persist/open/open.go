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
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sequencer-im/sequencer/persist"
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

// Options configures Store. The zero value migrates on open with each
// store's defaults.
type Options struct {
	// NoMigrate skips applying schema migrations on open.
	NoMigrate bool
	// Postgres configures a PostgreSQL store.
	Postgres postgres.Options
	// SQLite configures an embedded store.
	SQLite sqlite.Options
	// MySQL configures a MySQL / MariaDB store.
	MySQL mysql.Options
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
// schema. The concrete type is *postgres.Store, *mysql.Store or
// *sqlite.Store.
func Store(ctx context.Context, spec string, opts Options) (persist.Store, error) {
	sp, err := Parse(spec)
	if err != nil {
		return nil, err
	}
	switch sp.Kind {
	case KindPostgres:
		// A driver error may echo the DSN: every spelling of its password
		// is scrubbed from the text.
		s, err := postgres.Open(ctx, sp.DSN, opts.Postgres)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", sp, ScrubError(sp.DSN, err))
		}
		if !opts.NoMigrate {
			if err := s.Migrate(ctx); err != nil {
				s.Close()
				return nil, fmt.Errorf("open %s: migrate: %w", sp, ScrubError(sp.DSN, err))
			}
		}
		return s, nil
	case KindMySQL:
		s, err := mysql.Open(ctx, sp.DSN, opts.MySQL)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", sp, ScrubError(sp.DSN, err))
		}
		if !opts.NoMigrate {
			if err := s.Migrate(ctx); err != nil {
				s.Close()
				return nil, fmt.Errorf("open %s: migrate: %w", sp, ScrubError(sp.DSN, err))
			}
		}
		return s, nil
	default:
		s, err := sqlite.Open(ctx, sp.Path, opts.SQLite)
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
