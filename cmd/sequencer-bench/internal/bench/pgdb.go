package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer/persist/postgres"
)

// messageDDL is the im_message table as the PostgreSQL store creates it: its
// own first migration (persist/postgres/migrations/0001_init.sql: im_message
// as docs/API.md gives it, plus the store's heads and lease tables, which the
// baselines leave empty). No copy of the schema lives here.
func messageDDL() (string, error) {
	ms, err := postgres.Migrations()
	if err != nil {
		return "", err
	}
	if len(ms) == 0 || ms[0].Version != 1 {
		return "", errors.New("bench: the PostgreSQL store has no first migration")
	}
	return ms[0].SQL, nil
}

// floorDDL and segmentDDL are the baselines' own side tables.
const floorDDL = `CREATE TABLE seq_floor (
  conv_id VARCHAR(64) PRIMARY KEY,
  floor   BIGINT      NOT NULL
)`

// segmentDDL is engine (c)'s segment table: max_seq is the end of the last
// segment handed out for the conversation.
const segmentDDL = `CREATE TABLE seq_segment (
  conv_id VARCHAR(64) PRIMARY KEY,
  max_seq BIGINT      NOT NULL
)`

// messageColumns are im_message's columns in DDL order.
var messageColumns = []string{"msg_id", "conv_id", "seq", "from_uid", "msg_type", "body", "client_msg_id", "server_at"}

// insertMessageSQL stores one message in autocommit, as the seed does.
const insertMessageSQL = `INSERT INTO im_message (msg_id, conv_id, seq, from_uid, msg_type, body, client_msg_id, server_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

// findByClientKeySQL reads the first send of a resend key (the seed's
// uk_from_client answer).
const findByClientKeySQL = `SELECT msg_id, conv_id, seq, server_at FROM im_message WHERE from_uid = $1 AND client_msg_id = $2`

// benchDB is the fresh database of one bench run, on the server given by the
// admin DSN. Every (engine, scenario) pair gets its own schema in it, so each
// measurement starts from empty tables and indexes.
type benchDB struct {
	admin string // DSN of the database used to create and drop Name
	Name  string
	DSN   string // DSN of Name
}

// createBenchDB creates database seqbench_<runID>.
func createBenchDB(ctx context.Context, adminDSN, runID string) (*benchDB, error) {
	name := "seqbench_" + runID
	dsn, err := withDatabase(adminDSN, name)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redactDSN(adminDSN), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	return &benchDB{admin: adminDSN, Name: name, DSN: dsn}, nil
}

// Drop drops the run's database, closing any connection still open on it.
func (db *benchDB) Drop(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, db.admin)
	if err != nil {
		return fmt.Errorf("connect to drop %s: %w", db.Name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", db.Name, err)
	}
	return nil
}

// exec runs statements on the run's database, one connection, autocommit.
func (db *benchDB) exec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", db.Name, err)
	}
	defer conn.Close(ctx)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", firstLine(s), err)
		}
	}
	return nil
}

// NewSchema creates an empty schema and returns a DSN whose search_path is
// that schema, so unqualified tables (im_message, the store's own tables)
// land in it.
func (db *benchDB) NewSchema(ctx context.Context, schema string) (string, error) {
	if err := db.exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return "", err
	}
	return withParam(db.DSN, "search_path", schema)
}

// Checkpoint asks the server to flush dirty pages now, so one measurement
// does not pay for the previous one's checkpoint. It needs superuser (or
// pg_checkpoint); without it the bench goes on and says so.
func (db *benchDB) Checkpoint(ctx context.Context) error {
	return db.exec(ctx, "CHECKPOINT")
}

// serverVersion returns PostgreSQL's version string and the settings that
// decide commit durability.
func (db *benchDB) serverInfo(ctx context.Context) (map[string]string, error) {
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	out := map[string]string{}
	for _, name := range []string{"server_version", "synchronous_commit", "fsync", "wal_sync_method", "shared_buffers", "max_connections"} {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return nil, fmt.Errorf("read setting %s: %w", name, err)
		}
		out[name] = v
	}
	return out, nil
}

// openPool opens a pgx pool of exactly size connections on dsn.
func openPool(ctx context.Context, dsn string, size int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse dsn: %w", err)
	}
	cfg.MaxConns = int32(size)
	cfg.MinConns = int32(size)
	cfg.MaxConnIdleTime = time.Hour
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping: %w", err)
	}
	return pool, nil
}

// isUniqueViolation reports whether err is a unique_violation of constraint
// (any constraint when constraint is "").
func isUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		return false
	}
	return constraint == "" || pgErr.ConstraintName == constraint
}

// withDatabase returns dsn pointing at database name. Both URL
// (postgres://...) and keyword/value DSNs are accepted.
func withDatabase(dsn, name string) (string, error) {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse dsn: %w", err)
		}
		u.Path = "/" + name
		return u.String(), nil
	}
	return dsn + " dbname=" + name, nil
}

// withParam returns dsn with a run-time parameter (e.g. search_path) set.
func withParam(dsn, key, value string) (string, error) {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse dsn: %w", err)
		}
		q := u.Query()
		q.Set(key, value)
		// Encode writes a space as '+', which PostgreSQL's URL parsing
		// keeps as a '+' (options=-c%20citus.shard_count%3D8 would become
		// the parameter "+citus.shard_count"); a literal '+' is %2B.
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
		return u.String(), nil
	}
	return dsn + " " + key + "=" + value, nil
}

// redactDSN hides a password in a URL DSN for messages.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	return dsn
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
