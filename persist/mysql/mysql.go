// Package mysql is the MySQL 8 / MariaDB 10.6+ implementation of persist.Store,
// membership.Store (ClusterStore) and persist.ReadPositions, through
// github.com/go-sql-driver/mysql and database/sql.
//
// It owns the SQL schema (embedded, versioned migrations under migrations/,
// applied by Migrate; im_message is the seed's DDL as written) and the SQL of
// every method. A Commit is ONE InnoDB transaction at REPEATABLE READ
// spanning all its conversations, in one multi-statement round trip
// (commit.go): the fence check (partition_lease rows LOCK IN SHARE MODE),
// the head compare-and-set (conv_head upserts by primary key), one
// multi-row INSERT and COMMIT; a failed check stops the statements after it
// by a NULL head that strict mode refuses. It classifies errors as
// persist.Store documents; a deadlock (1213) or lock wait timeout (1205)
// before COMMIT is redone inside Commit (nothing was written) and counted
// (Retries). A lost connection or timeout once COMMIT is on its way is
// sequencer.ErrUnknownOutcome: the server thread of that connection
// (CONNECTION_ID(), read when the connection opened) may still commit, and
// Settle KILLs it and waits until it is gone (settle.go).
//
// It keeps three connection pools (reads, commits, control), like
// persist/postgres. It never assigns seqs or msg_ids and never decides
// ownership; it only refuses commits that would break contiguity,
// uniqueness or fencing. docs/MYSQL.md says which server settings keep
// "acked means stored" true.
package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/mysql/mysqlurl"
)

// Options configures a Store. The zero value is usable.
type Options struct {
	// MaxConns, CommitConns, ControlConns size the read, commit and control
	// pools (defaults 16, 4, 2), as in persist/postgres (--store-conns,
	// --store-commit-conns, --store-control-conns set them for a node).
	MaxConns, CommitConns, ControlConns int
	// MaxBody is the largest message body the store must hold (--max-body);
	// Migrate sizes im_message.body from it (BLOB up to 65,535 bytes,
	// MEDIUMBLOB up to 16 MiB - 1, else LONGBLOB). Default 65,536.
	MaxBody int
	// CommitLockWait is innodb_lock_wait_timeout for commits (whole
	// seconds, at least 1): a commit that waits longer for a row lock fails
	// with 1205 and is redone. Default 5s.
	CommitLockWait time.Duration
	// ControlLockWait is innodb_lock_wait_timeout for membership and lease
	// transactions (Acquire waiting for in-flight commits). Default 2s.
	ControlLockWait time.Duration
	// ConnectTimeout bounds one connection attempt. Default 2s.
	ConnectTimeout time.Duration
	// MaxRetries is how often Commit redoes a transaction that hit a
	// deadlock or lock wait timeout before COMMIT. Default 5.
	MaxRetries int
	// IdleTimeout is the server's wait_timeout (whole seconds, at least 1)
	// for the commit and control sessions: a session idle that long, also
	// inside a transaction (its process frozen or cut off between the
	// round trips of a commit too large for one), is closed by the server and its transaction
	// rolled back, so the partition-lease and head rows it locked cannot
	// hold the live nodes back for longer. The store's own sessions are
	// never idle inside a transaction for more than a round trip, and
	// pooled sessions idle for half a second are closed by the pool first.
	// Default 3s.
	IdleTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxConns <= 0 {
		o.MaxConns = 16
	}
	if o.CommitConns <= 0 {
		o.CommitConns = 4
	}
	if o.ControlConns <= 0 {
		o.ControlConns = 2
	}
	if o.MaxBody <= 0 {
		o.MaxBody = 65536
	}
	if o.CommitLockWait < time.Second {
		o.CommitLockWait = 5 * time.Second
	}
	if o.ControlLockWait < time.Second {
		o.ControlLockWait = 2 * time.Second
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 2 * time.Second
	}
	if o.MaxRetries <= 0 {
		o.MaxRetries = 5
	}
	if o.IdleTimeout < time.Second {
		o.IdleTimeout = 3 * time.Second
	}
	return o
}

// The driver's own messages (a bad idle connection closed, a packet error)
// go to slog's default logger as warnings, so a process that installs a
// JSON handler with slog.SetDefault gets them as JSON. They never hold a
// DSN.
func init() { _ = gomysql.SetLogger(driverLog{}) }

type driverLog struct{}

func (driverLog) Print(v ...any) { slog.Warn("mysql driver", "msg", fmt.Sprint(v...)) }

// Store is a persist.Store on MySQL / MariaDB. It is safe for concurrent use.
type Store struct {
	read    *sql.DB
	commits *sql.DB
	control *sql.DB
	opts    Options
	mariadb bool
	// maxPacket is the server's max_allowed_packet: one round trip of a
	// commit stays below half of it (commit.go).
	maxPacket int

	retries  atomic.Uint64 // transactions redone after 1213/1205
	settleMu sync.Mutex
	// unsettled are the server threads of commits whose outcome is unknown.
	unsettled map[uint64]bool
	// started is the server's start time (seconds), to tell a restart.
	started int64

	beforeLast func(thread uint64) // tests: called before a commit's last round trip (the one with COMMIT) is sent
}

var (
	_ persist.Store         = (*Store)(nil)
	_ persist.ReadPositions = (*Store)(nil)
)

// ParseURL turns a mysql:// URL into the driver's configuration (package
// mysqlurl says which forms).
func ParseURL(raw string) (*gomysql.Config, error) { return mysqlurl.Parse(raw) }

// Open connects to the database at rawURL (see ParseURL) and checks it
// answers. It does not migrate; call Migrate.
func Open(ctx context.Context, rawURL string, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	cfg, err := ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.InterpolateParams = true
	cfg.MultiStatements = true
	cfg.ClientFoundRows = true
	cfg.Collation = "utf8mb4_general_ci" // the connection charset; columns carry their own collation
	if cfg.Timeout == 0 {
		cfg.Timeout = opts.ConnectTimeout
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	// Strict mode: a value the column cannot hold is an error, never a
	// silent change (rejected), and a commit's failed check (a NULL head)
	// stops the commit (commit.go).
	cfg.Params["sql_mode"] = "'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'"
	s := &Store{opts: opts}
	for _, p := range []struct {
		db      **sql.DB
		size    int
		wait    time.Duration
		bounded bool // wait_timeout = IdleTimeout
	}{{&s.read, opts.MaxConns, opts.CommitLockWait, false}, {&s.commits, opts.CommitConns, opts.CommitLockWait, true}, {&s.control, opts.ControlConns, opts.ControlLockWait, true}} {
		pc := cfg.Clone()
		pc.Params["innodb_lock_wait_timeout"] = strconv.Itoa(int(p.wait / time.Second))
		idle := time.Minute
		if p.bounded {
			pc.Params["wait_timeout"] = strconv.Itoa(int(opts.IdleTimeout / time.Second))
			idle = 500 * time.Millisecond
		}
		conn, err := gomysql.NewConnector(pc)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("mysql: %w", err)
		}
		if p.db == &s.commits {
			conn = threadConnector{conn}
		}
		db := sql.OpenDB(conn)
		db.SetMaxOpenConns(p.size)
		db.SetMaxIdleConns(p.size)
		db.SetConnMaxIdleTime(idle)
		*p.db = db
	}
	var version string
	if err := s.control.QueryRowContext(ctx, `SELECT VERSION(), @@max_allowed_packet, CAST(UNIX_TIMESTAMP() - (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME') AS SIGNED)`).
		Scan(&version, &s.maxPacket, &s.started); err != nil {
		s.Close()
		return nil, unavailable("connect", err)
	}
	s.mariadb = strings.Contains(strings.ToLower(version), "mariadb")
	for _, db := range []*sql.DB{s.read, s.commits} {
		if err := db.PingContext(ctx); err != nil {
			s.Close()
			return nil, unavailable("ping", err)
		}
	}
	return s, nil
}

// DB exposes the read pool (tests and tools read the tables through it).
func (s *Store) DB() *sql.DB { return s.read }

// Retries is how many commit transactions were redone after a deadlock
// (1213) or lock wait timeout (1205) before COMMIT (nothing was written).
// The server exposes it as sequencer_store_commit_retries_total.
func (s *Store) Retries() uint64 { return s.retries.Load() }

// StorePools names the store's connection pools (persist.PoolReporter).
func (s *Store) StorePools() []string { return []string{"read", "commit", "control"} }

// StorePool reports one pool's connections ("read", "commit" or
// "control") for the sequencer_store_pool_* gauges.
func (s *Store) StorePool(name string) persist.PoolStat {
	var db *sql.DB
	switch name {
	case "read":
		db = s.read
	case "commit":
		db = s.commits
	case "control":
		db = s.control
	default:
		return persist.PoolStat{}
	}
	st := db.Stats()
	return persist.PoolStat{Acquired: int32(st.InUse), Idle: int32(st.Idle), Total: int32(st.OpenConnections), Max: int32(st.MaxOpenConnections)}
}

// Ping checks the database answers, on the control pool: a burst of reads
// queues on the read pool while the database answers at once (see
// persist/postgres's Ping).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.control.PingContext(ctx); err != nil {
		return unavailable("ping", err)
	}
	return nil
}

// Close closes every connection.
func (s *Store) Close() error {
	for _, db := range []*sql.DB{s.read, s.commits, s.control} {
		if db != nil {
			db.Close()
		}
	}
	return nil
}

// MySQL error numbers the store reacts to.
const (
	erBadNull         = 1048 // column cannot be null: a failed check (commit.go)
	erDupEntry        = 1062
	erLockWaitTimeout = 1205
	erLockDeadlock    = 1213
	erNoSuchThread    = 1094
	erOptionPreventsS = 1290 // --read-only / super_read_only
	erReadOnlyTx      = 1792
)

func mysqlErr(err error) (*gomysql.MySQLError, bool) {
	var me *gomysql.MySQLError
	ok := errors.As(err, &me)
	return me, ok
}

func isNumber(err error, n uint16) bool {
	me, ok := mysqlErr(err)
	return ok && me.Number == n
}

// retryable reports a deadlock or lock wait timeout: the server rolled the
// statement (1205) or the transaction (1213) back; the caller rolls back
// the rest and may redo the transaction.
func retryable(err error) bool {
	return isNumber(err, erLockDeadlock) || isNumber(err, erLockWaitTimeout)
}

// unavailable wraps err as sequencer.ErrStoreUnavailable: nothing changed.
func unavailable(op string, err error) error {
	return fmt.Errorf("mysql: %s: %w (%w)", op, sequencer.ErrStoreUnavailable, err)
}

// unknownOutcome wraps err as sequencer.ErrUnknownOutcome.
func unknownOutcome(op string, err error) error {
	return fmt.Errorf("mysql: %s: %w (%w)", op, sequencer.ErrUnknownOutcome, err)
}

// connLost reports an error of the connection rather than of a statement.
func connLost(err error) bool {
	if _, ok := mysqlErr(err); ok {
		return false
	}
	var ne net.Error
	return errors.Is(err, gomysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled)
}

func notFound(format string, args ...any) error {
	return fmt.Errorf("mysql: %s: %w", fmt.Sprintf(format, args...), sequencer.ErrNotFound)
}

// The abilities a MySQL store has beyond persist.Store.
var (
	_ persist.Store          = (*Store)(nil)
	_ persist.Migrator       = (*Store)(nil)
	_ persist.PoolReporter   = (*Store)(nil)
	_ persist.RetryCounter   = (*Store)(nil)
	_ persist.MessagesGetter = (*Store)(nil)
)
