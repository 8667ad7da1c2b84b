package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"os"
	"time"

	"github.com/sequencer-im/sequencer/persist"
)

// Migrations are the files migrations/NNNN_name.sql, applied in version order,
// each in its own transaction and recorded in schema_version. They mirror
// persist/postgres/migrations where the single-node store needs the table.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one embedded schema change.
type Migration = persist.Migration

// AvailableMigrations are Migrations (persist.Migrator).
func (s *Store) AvailableMigrations() ([]Migration, error) { return Migrations() }

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	ms, err := persist.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	return ms, nil
}

// Migrate applies every embedded migration the file lacks, each in a BEGIN
// IMMEDIATE transaction that re-checks schema_version (so two processes
// opening one file at once do not both apply it).
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := Migrations()
	if err != nil {
		return err
	}
	for _, m := range ms {
		if err := s.apply(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) apply(ctx context.Context, m Migration) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return unavailable("migrate: begin", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))) STRICT`); err != nil {
		return classify("migrate: schema_version", err)
	}
	var one int
	err = tx.QueryRowContext(ctx, `SELECT 1 FROM schema_version WHERE version = ?`, m.Version).Scan(&one)
	if err == nil {
		return tx.Commit()
	}
	if err != sql.ErrNoRows {
		return classify("migrate: read version", err)
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return fmt.Errorf("sqlite: migration %s: %w", m.Name, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (version, name) VALUES (?, ?)`, m.Version, m.Name); err != nil {
		return classify("migrate: record version", err)
	}
	if err := tx.Commit(); err != nil {
		return unavailable("migrate: commit", err)
	}
	return nil
}

// SchemaVersion returns the highest applied migration version (0 if none).
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	if err := s.r.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&v); err != nil {
		return 0, classify("schema version", err)
	}
	return v, nil
}

// AppliedMigrations returns the rows of schema_version in version order
// (none when the file was never migrated). It changes nothing.
func (s *Store) AppliedMigrations(ctx context.Context) ([]persist.AppliedMigration, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'`).Scan(&n); err != nil {
		return nil, classify("applied migrations", err)
	}
	if n == 0 {
		return nil, nil
	}
	rows, err := s.r.QueryContext(ctx, `SELECT version, name, applied_at FROM schema_version ORDER BY version`)
	if err != nil {
		return nil, classify("applied migrations", err)
	}
	defer rows.Close()
	var out []persist.AppliedMigration
	for rows.Next() {
		var m persist.AppliedMigration
		var at string
		if err := rows.Scan(&m.Version, &m.Name, &at); err != nil {
			return nil, classify("applied migrations", err)
		}
		m.AppliedAt, _ = time.Parse("2006-01-02T15:04:05.999Z", at)
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, classify("applied migrations", err)
	}
	return out, nil
}

// BackupTo writes a consistent copy of the whole database to the new file
// path with `VACUUM INTO` (online: it reads one snapshot while commits go
// on; the copy is compacted and has no WAL). path must not exist. It holds
// this Store's writer connection while it runs, so a serving process should
// back up through a Store of its own (`sequencer admin backup` opens one):
// other processes' commits are not blocked, a WAL reader blocks no writer.
func (s *Store) BackupTo(ctx context.Context, path string) error {
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("sqlite: backup: %s already exists", path)
	}
	if _, err := s.w.ExecContext(ctx, `VACUUM INTO ?`, path); err != nil {
		return fmt.Errorf("sqlite: backup to %s: %w", path, err)
	}
	return nil
}
