package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// Migrations are the files migrations/NNNN_name.sql, applied in version order,
// each in its own transaction and recorded in schema_version. To change the
// schema, add the next file (never edit an applied one).
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// MigrationLock is the pg_advisory_xact_lock key that serializes Migrate
// across processes sharing the database (persist/citus takes it too).
const MigrationLock int64 = 0x5E9_0E1C_E000_0001

// Migration is one embedded schema change.
type Migration = persist.Migration

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	ms, err := persist.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return ms, nil
}

// AvailableMigrations are the migrations Migrate applies to this store, in
// version order (persist.Migrator).
func (s *Store) AvailableMigrations() ([]Migration, error) { return Migrations() }

// Migrate applies every embedded migration the database lacks. It is safe
// when several processes migrate at once: each migration runs in a
// transaction holding a pg_advisory_xact_lock, and re-checks schema_version
// under it. Versions the database has beyond the embedded ones (a newer
// binary migrated) are left alone.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := Migrations()
	if err != nil {
		return err
	}
	return s.ApplyMigrations(ctx, ms, false)
}

// ApplyMigrations applies the migrations of ms the database lacks, in
// order, as Migrate does, recording each (version, name) in
// schema_version. With oneByOne each statement of a migration is sent
// alone (Citus refuses some of its functions inside a multi-statement
// query string: "cannot insert multiple commands into a prepared
// statement"); else a migration is one query string.
func (s *Store) ApplyMigrations(ctx context.Context, ms []Migration, oneByOne bool) error {
	for _, m := range ms {
		if err := s.apply(ctx, m, oneByOne); err != nil {
			return err
		}
	}
	return nil
}

// apply runs migration m in its own transaction. Its errors wrap
// sequencer.ErrStoreUnavailable when the database did not answer or closed
// the connection (open retries those), not when it refused the migration.
func (s *Store) apply(ctx context.Context, m Migration, oneByOne bool) error {
	var refused error
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", MigrationLock); err != nil {
			return classify("migrate: lock", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
			version    INT PRIMARY KEY,
			name       TEXT NOT NULL,
			applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
			return classify("migrate: schema_version", err)
		}
		var done bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM schema_version WHERE version = $1)", m.Version).Scan(&done); err != nil {
			return classify("migrate: read version", err)
		}
		if done {
			return nil
		}
		stmts := []string{m.SQL}
		if oneByOne {
			stmts = SplitSQL(m.SQL)
		}
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol); err != nil {
				if !connectionLost(err) {
					refused = fmt.Errorf("postgres: migration %s: %w", m.Name, err)
					return refused
				}
				return unavailable("migration "+m.Name, err)
			}
		}
		if _, err := tx.Exec(ctx, "INSERT INTO schema_version (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			return classify("migrate: record version", err)
		}
		return nil
	})
	if err == nil || (refused != nil && errors.Is(err, refused)) || errors.Is(err, sequencer.ErrStoreUnavailable) || errors.Is(err, persist.ErrRejected) {
		return err
	}
	// BEGIN or COMMIT: the transaction did not happen, or its outcome is
	// unknown; a retry re-checks the recorded version under the lock.
	return unavailable("migrate: "+m.Name, err)
}

// connectionLost reports whether err says the database did not answer or
// ended the session (a network error, a timeout, a FATAL such as
// idle_in_transaction_session_timeout or a shutdown), not that it refused
// the statement.
func connectionLost(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return true
	}
	return pg.Severity == "FATAL" || pg.Severity == "PANIC" || strings.HasPrefix(pg.Code, "08") || strings.HasPrefix(pg.Code, "57")
}

// SchemaVersion returns the highest applied migration version (0 if none).
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.pool.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&v)
	if err != nil {
		return 0, classify("schema version", err)
	}
	return v, nil
}

// AppliedMigrations returns the rows of schema_version in version order
// (none when the database was never migrated). It changes nothing.
func (s *Store) AppliedMigrations(ctx context.Context) ([]persist.AppliedMigration, error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass('schema_version') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, classify("applied migrations", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT version, name, applied_at FROM schema_version ORDER BY version`)
	if err != nil {
		return nil, classify("applied migrations", err)
	}
	defer rows.Close()
	var out []persist.AppliedMigration
	for rows.Next() {
		var m persist.AppliedMigration
		if err := rows.Scan(&m.Version, &m.Name, &m.AppliedAt); err != nil {
			return nil, classify("applied migrations", err)
		}
		m.AppliedAt = m.AppliedAt.UTC()
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, classify("applied migrations", err)
	}
	return out, nil
}

// SplitSQL splits a migration into its statements at the semicolons outside
// comments, quotes and dollar-quoted bodies.
func SplitSQL(sql string) []string {
	var out []string
	start := 0
	for i := 0; i < len(sql); i++ {
		switch {
		case strings.HasPrefix(sql[i:], "--"):
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				i = len(sql)
			} else {
				i += j
			}
		case sql[i] == '\'':
			j := strings.IndexByte(sql[i+1:], '\'')
			if j < 0 {
				i = len(sql)
			} else {
				i += j + 1
			}
		case sql[i] == '$':
			j := strings.IndexByte(sql[i+1:], '$')
			if j < 0 {
				continue
			}
			tag := sql[i : i+j+2]
			if strings.ContainsAny(tag[1:len(tag)-1], " ;'\n(") {
				continue
			}
			k := strings.Index(sql[i+len(tag):], tag)
			if k < 0 {
				i = len(sql)
			} else {
				i += len(tag) + k + len(tag) - 1
			}
		case sql[i] == ';':
			if q := strings.TrimSpace(sql[start:i]); q != "" && !onlyComments(q) {
				out = append(out, q)
			}
			start = i + 1
		}
	}
	if q := strings.TrimSpace(sql[start:]); q != "" && !onlyComments(q) {
		out = append(out, q)
	}
	return out
}

func onlyComments(q string) bool {
	for _, l := range strings.Split(q, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--") {
			return false
		}
	}
	return true
}
