package mysql

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"strings"

	"github.com/sequencer-im/sequencer/persist"
)

// Migrations are the files migrations/NNNN_name.sql, applied in version order
// and recorded in schema_version. MySQL commits DDL implicitly, so a
// migration is not one transaction: every statement is written so that
// running it again after a crash half-way finishes the job (CREATE TABLE IF
// NOT EXISTS, INSERT IGNORE). To change the schema, add the next file (never
// edit an applied one). {{BODY}} and {{BIN}} are replaced at Migrate time
// (migration 0001's comment).
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// migrationLock is the GET_LOCK name that serializes Migrate across
// processes sharing the database.
const migrationLock = "sequencer.migrate"

// Migration is one embedded schema change.
type Migration = persist.Migration

// AvailableMigrations are Migrations (persist.Migrator).
func (s *Store) AvailableMigrations() ([]Migration, error) { return Migrations() }

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	ms, err := persist.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	return ms, nil
}

// bodyType is the smallest BLOB type that holds maxBody bytes.
func bodyType(maxBody int) string {
	switch {
	case maxBody <= 65535:
		return "BLOB"
	case maxBody <= 1<<24-1:
		return "MEDIUMBLOB"
	}
	return "LONGBLOB"
}

func (s *Store) binCollation() string {
	if s.mariadb {
		return "utf8mb4_nopad_bin"
	}
	return "utf8mb4_0900_bin"
}

// Migrate applies every embedded migration the database lacks (up to
// version upTo when upTo > 0: tests build older schemas). It holds
// GET_LOCK(migrationLock) meanwhile, so processes migrating at once apply
// each migration once. Versions beyond the embedded ones are left alone.
func (s *Store) Migrate(ctx context.Context) error { return s.MigrateTo(ctx, 0) }

// MigrateTo is Migrate up to version upTo (0: all).
func (s *Store) MigrateTo(ctx context.Context, upTo int) error {
	ms, err := Migrations()
	if err != nil {
		return err
	}
	conn, err := s.control.Conn(ctx)
	if err != nil {
		return unavailable("migrate: connect", err)
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 60)`, migrationLock).Scan(&got); err != nil || got.Int64 != 1 {
		return unavailable("migrate: lock", fmt.Errorf("GET_LOCK: %v (%v)", got, err))
	}
	defer conn.ExecContext(context.Background(), `SELECT RELEASE_LOCK(?)`, migrationLock)
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version    INT NOT NULL PRIMARY KEY,
		name       VARCHAR(255) NOT NULL,
		applied_at DATETIME(3) NOT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`); err != nil {
		return unavailable("migrate: schema_version", err)
	}
	repl := strings.NewReplacer("{{BODY}}", bodyType(s.opts.MaxBody), "{{BIN}}", s.binCollation())
	for _, m := range ms {
		if upTo > 0 && m.Version > upTo {
			break
		}
		var done int
		if err := conn.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_version WHERE version = ?`, m.Version).Scan(&done); err != nil {
			return unavailable("migrate: read version", err)
		}
		if done > 0 {
			continue
		}
		if _, err := conn.ExecContext(ctx, repl.Replace(m.SQL)); err != nil {
			return fmt.Errorf("mysql: migration %s: %w", m.Name, err)
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, UTC_TIMESTAMP(3))`, m.Version, m.Name); err != nil {
			return unavailable("migrate: record version", err)
		}
	}
	return s.checkBodyColumn(ctx)
}

// blobCapacity is the largest value each BLOB type holds.
var blobCapacity = map[string]int{"tinyblob": 255, "blob": 65535, "mediumblob": 1<<24 - 1, "longblob": 1<<32 - 1}

// checkBodyColumn refuses a schema whose im_message.body cannot hold
// Options.MaxBody bytes (created by a run with a smaller --max-body): the
// server would refuse such messages only at commit time.
func (s *Store) checkBodyColumn(ctx context.Context) error {
	var ty string
	if err := s.read.QueryRowContext(ctx, `SELECT DATA_TYPE FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'im_message' AND COLUMN_NAME = 'body'`).Scan(&ty); err != nil {
		return unavailable("migrate: read the body column", err)
	}
	if c, ok := blobCapacity[strings.ToLower(ty)]; ok && c < s.opts.MaxBody {
		return fmt.Errorf("mysql: im_message.body is %s (at most %d bytes) but the largest body is %d bytes: "+
			"ALTER TABLE im_message MODIFY body %s NOT NULL, or lower --max-body", strings.ToUpper(ty), c, s.opts.MaxBody, bodyType(s.opts.MaxBody))
	}
	return nil
}

// SchemaVersion returns the highest applied migration version (0 if none).
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	ms, err := s.AppliedMigrations(ctx)
	if err != nil || len(ms) == 0 {
		return 0, err
	}
	return ms[len(ms)-1].Version, nil
}

// AppliedMigrations returns the rows of schema_version in version order
// (none when the database was never migrated). It changes nothing.
func (s *Store) AppliedMigrations(ctx context.Context) ([]persist.AppliedMigration, error) {
	var n int
	if err := s.read.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'schema_version'`).Scan(&n); err != nil {
		return nil, unavailable("applied migrations", err)
	}
	if n == 0 {
		return nil, nil
	}
	rows, err := s.read.QueryContext(ctx, `SELECT version, name, applied_at FROM schema_version ORDER BY version`)
	if err != nil {
		return nil, unavailable("applied migrations", err)
	}
	defer rows.Close()
	var out []persist.AppliedMigration
	for rows.Next() {
		var m persist.AppliedMigration
		if err := rows.Scan(&m.Version, &m.Name, &m.AppliedAt); err != nil {
			return nil, unavailable("applied migrations", err)
		}
		m.AppliedAt = m.AppliedAt.UTC()
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, unavailable("applied migrations", err)
	}
	return out, nil
}
