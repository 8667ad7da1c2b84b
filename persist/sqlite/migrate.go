package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

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
