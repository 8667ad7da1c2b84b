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
// It keeps three connection pools (reads, commits, control: Options) that
// follow one server through a primary switch (primary.go).
//
// It never assigns seqs or msg_ids and never decides ownership; it only
// refuses commits that would break contiguity, uniqueness or fencing.
//
// It is also the PostgreSQL dialect that persist/citus composes (pools,
// error mapping, CommitOn over a CommitPlan, the SQL pieces, reads on a
// chosen pool, ApplyMigrations: README.md lists them); it never branches
// on Citus itself.
//
// Ids are uint64 in Go and BIGINT in SQL; they are always below 2^63
// (persist.CheckBatches refuses larger ones). server_at is stored with
// millisecond precision and returned in UTC.
package postgres

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// Options configures a Store. The zero value is usable: zero pool sizes are
// DefaultOptions'.
//
// The store keeps three connection pools, so that one kind of work cannot
// take the connections of another: reads (MaxConns), commits
// (CommitConns) and control (ControlConns: cluster membership heartbeats,
// partition leases, the worker-id lease, settling unknown commits, Ping). All
// three follow the same server after a primary switch (primary.go).
type Options struct {
	// MaxConns is the read pool's size: Pull (ReadRange), lookups, head
	// loads, retention.
	MaxConns int32
	// CommitConns is the commit pool's size: only Commit uses it, so a
	// burst of reads never delays a commit. Give it at least as many
	// connections as commits run in parallel (the group-commit workers).
	CommitConns int32
	// ControlConns is the control pool's size: cluster membership
	// (heartbeats, joins, partition leases), the worker-id lease, Settle
	// and Ping, so that neither reads nor commits can starve a heartbeat
	// or the readiness ping and make a healthy node look dead.
	ControlConns int32
	// ConnectTimeout bounds one connection attempt to one host of the DSN
	// (dial, TLS, authentication, the target_session_attrs check). With a
	// multi-host DSN every new connection tries the hosts in order, so a
	// host that accepts TCP but never answers (a frozen or cut-off old
	// primary) costs this much per new connection: keep it well below
	// the commit timeout. Default 2s; connect_timeout in the DSN wins.
	ConnectTimeout time.Duration
	// PingTimeout bounds the liveness ping of a connection taken from the
	// pool after more than 1s idle; a connection that fails it is dropped
	// and another taken. Default 1s.
	PingTimeout time.Duration
	// IdleInTxTimeout is the server's idle_in_transaction_session_timeout
	// for the store's sessions: a session left idle inside a transaction
	// this long (its process frozen or partitioned away mid-transaction) is
	// terminated and rolled back, so its row locks (partition leases, the
	// membership version row) cannot stall the live nodes past their
	// membership TTL. The store's own transactions never wait on the client
	// that long. Default 1s; a value in the DSN's options wins.
	IdleInTxTimeout time.Duration
	// Logger receives the store's rare notices. Optional.
	Logger *slog.Logger
}

// DefaultOptions returns the default pool sizes (every other zero field
// has its documented default).
func DefaultOptions() Options {
	return Options{MaxConns: 8, CommitConns: 4, ControlConns: 2}
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.MaxConns <= 0 {
		o.MaxConns = d.MaxConns
	}
	if o.CommitConns <= 0 {
		o.CommitConns = d.CommitConns
	}
	if o.ControlConns <= 0 {
		o.ControlConns = d.ControlConns
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 2 * time.Second
	}
	if o.PingTimeout <= 0 {
		o.PingTimeout = time.Second
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
	pool    *pgxpool.Pool // reads (Options.MaxConns)
	commits *pgxpool.Pool // Commit (Options.CommitConns)
	control *pgxpool.Pool // membership, worker-id lease, Settle, Ping (Options.ControlConns)
	primary *primaryTracker
	mode    insertMode

	settleMu  sync.Mutex
	unsettled map[backendKey]unsettledCommit // backends of commits whose outcome is unknown (settle.go)

	base *pgxpool.Config // the DSN's config without the failover hooks (DSNConfig)
	log  *slog.Logger

	commitBackend func(pid uint32) // tests: called with a commit's backend pid before it is sent (export_test.go)

	markOnce sync.Once
	marks    *persist.MarkBatcher // MarkRead's group commit (readpos.go)
}

var (
	_ persist.Store       = (*Store)(nil)
	_ persist.ConvSettler = (*Store)(nil)
)

const idleInTxParam = "idle_in_transaction_session_timeout"

// sqlReadOnlyTx is SQLSTATE read_only_sql_transaction.
const sqlReadOnlyTx = "25006"

// Open connects to the database at dsn (a postgres:// URL or keyword/value
// DSN) and checks it answers. It does not migrate; call Migrate.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse DSN: %w", err)
	}
	if cfg.ConnConfig.ConnectTimeout <= 0 { // not set by the DSN
		cfg.ConnConfig.ConnectTimeout = opts.ConnectTimeout
	}
	cfg.AfterConnect = afterConnect
	if _, set := cfg.ConnConfig.RuntimeParams[idleInTxParam]; !set {
		cfg.ConnConfig.RuntimeParams[idleInTxParam] = strconv.FormatInt(opts.IdleInTxTimeout.Milliseconds(), 10)
	}
	cfg.PingTimeout = opts.PingTimeout
	base := cfg.Copy() // DSNConfig: without the failover hooks
	primary := newPrimaryTracker()
	forFailover(cfg, primary)
	// The three pools share the hooks (and with them the host preference
	// and the current server).
	s := &Store{primary: primary, base: base}
	for _, p := range []struct {
		pool **pgxpool.Pool
		name string
		size int32
	}{{&s.pool, "read", opts.MaxConns}, {&s.commits, "commit", opts.CommitConns}, {&s.control, "control", opts.ControlConns}} {
		pc := cfg.Copy()
		pc.MaxConns = p.size
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			s.Close()
			return nil, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrStoreUnavailable, fmt.Sprintf("postgres: open %s pool: %v", p.name, err))
		}
		*p.pool = pool
	}
	for _, p := range []*pgxpool.Pool{s.pool, s.commits, s.control} {
		if err := p.Ping(ctx); err != nil {
			s.Close()
			return nil, unavailable("ping", err)
		}
	}
	s.log = opts.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

// forFailover sets the pool up to follow a primary switch behind a
// multi-host DSN (see also hostPreference) and to drop a silent old primary
// fast. When a pooled connection breaks, pgx closes it in the background (a
// cancel request on a new socket, Terminate, then a drain of the old socket
// until the server closes it, bounded only by 15s) and the pool counts it
// against MaxConns until that is done: a server that accepts TCP but never
// answers (frozen, or cut off without a reset) would hold every slot for
// 15s after each failure. So:
//   - every socket pgx dials gets a deadline of ConnectTimeout, cleared once
//     it has become a pool connection: connection attempts never wait
//     longer than that;
//   - no cancel request is ever sent (noCancelRequests: unsafe with
//     synchronous replication, and it would wait on a silent server);
//   - a connection the pool destroys that is already broken has its socket
//     closed at once, ending the drain (a healthy one is closed politely);
//   - new connections try first the host of the newest connection;
//   - a connection to a server that refuses writes is dropped;
//   - every connection is tagged with its server, and only connections to
//     the current server (the newest connection's) are handed out;
//     servers on an older timeline than one seen are refused (primary.go).
func forFailover(cfg *pgxpool.Config, primary *primaryTracker) {
	limit := cfg.ConnConfig.ConnectTimeout
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(limit))
		return c, nil
	}
	pref := newHostPreference()
	cfg.ConnConfig.LookupFunc = pref.lookup(cfg.ConnConfig.LookupFunc)
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		pref.order(&cc.Config)
		NoCancelRequests(&cc.Config)
		return nil
	}
	// After target_session_attrs' check (if any), per host tried: read the
	// server's identity, refuse a demoted primary.
	validate := cfg.ConnConfig.ValidateConnect
	cfg.ConnConfig.ValidateConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		if validate != nil {
			if err := validate(ctx, c); err != nil {
				return err
			}
		}
		return primary.validate(ctx, c)
	}
	next := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		established(c.PgConn().Conn())
		if err := c.PgConn().Conn().SetDeadline(time.Time{}); err != nil {
			return err
		}
		if next != nil {
			if err := next(ctx, c); err != nil {
				return err
			}
		}
		pref.connected(c.PgConn().Conn())
		primary.connected(c.PgConn())
		return nil
	}
	cfg.PrepareConn = primary.usable
	// pgxpool pings a connection idle for more than 1s before PrepareConn
	// sees it; a connection to a server that is no longer current is not
	// pinged (its server may be silent: the ping would wait PingTimeout)
	// but destroyed by PrepareConn.
	cfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
		return p.IdleDuration > time.Second && primary.isCurrent(serverOf(p.Conn.PgConn()))
	}
	// A server that refuses writes (a primary demoted or fenced read-only,
	// or a standby reached without target_session_attrs=read-write)
	// answers read_only_sql_transaction: drop the connection, so the next
	// one is made, and checked against target_session_attrs, afresh. The
	// statement failed before COMMIT: nothing was written.
	onPgError := cfg.ConnConfig.OnPgError
	cfg.ConnConfig.OnPgError = func(c *pgconn.PgConn, e *pgconn.PgError) bool {
		if e.Code == sqlReadOnlyTx {
			return false
		}
		return onPgError == nil || onPgError(c, e)
	}
	cfg.BeforeClose = func(c *pgx.Conn) {
		if stale, _ := c.PgConn().CustomData()[staleKey].(bool); c.IsClosed() || stale {
			_ = c.PgConn().Conn().Close()
		}
	}
}

// NoCancelRequests makes the connection about to be made with cc never send
// a cancel request. pgx sends one whenever a connection breaks (a timeout,
// a context cancel), and with synchronous replication that is unsafe: a
// backend whose COMMIT waits for the standby has already committed
// locally, and a cancel (or a terminate) ends the wait and makes the
// transaction visible on the primary although no standby has it (the
// server warns "the transaction has already committed locally, but might
// not have been replicated"). The next reader would take it as stored; a
// failover would lose it. Without the cancel the backend keeps waiting,
// the transaction stays invisible until a standby confirms it, and our
// side just closes the socket. The only dial pgx makes on a connection
// after it is established is the cancel request's; it is refused here.
// Pools to other servers of the same cluster (Citus's workers) use it too.
func NoCancelRequests(cc *pgconn.Config) {
	st := &dialState{}
	dial := cc.DialFunc
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if st.established.Load() {
			return nil, errNoCancelRequest
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &dialedConn{Conn: c, state: st}, nil
	}
}

var errNoCancelRequest = errors.New("postgres: cancel requests are not sent (they would end a synchronous-replication wait)")

// dialState is shared by the sockets dialed for one pool connection.
type dialState struct{ established atomic.Bool }

// dialedConn is a socket dialed by NoCancelRequests' DialFunc.
type dialedConn struct {
	net.Conn
	state *dialState
}

// established marks the connection whose socket (or TLS over it) is c as
// made: later dials for it are cancel requests.
func established(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if dc, ok := c.(*dialedConn); ok {
		dc.state.established.Store(true)
	}
}

// Pool is the read pool (Options.MaxConns).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// CommitPool is the commit pool (Options.CommitConns).
func (s *Store) CommitPool() *pgxpool.Pool { return s.commits }

// ControlPool is the control pool (Options.ControlConns).
func (s *Store) ControlPool() *pgxpool.Pool { return s.control }

// DSNConfig returns a copy of the pool config parsed from the DSN, with
// the store's connection settings (timeouts, session parameters, the
// backend_start tag) but none of its failover hooks: for pools to other
// servers of the same cluster (persist/citus: one per worker).
func (s *Store) DSNConfig() *pgxpool.Config { return s.base.Copy() }

// Logger is Options.Logger (a discarding logger when none was given).
func (s *Store) Logger() *slog.Logger { return s.log }

// PoolNames are the store's connection pools, as StorePool names them.
var PoolNames = []string{"read", "commit", "control"}

// StorePools names the store's connection pools (persist.PoolReporter).
func (s *Store) StorePools() []string { return PoolNames }

// StorePool reports one pool's connections (name: one of PoolNames) for
// the sequencer_store_pool_* gauges; the zero PoolStat for another name.
func (s *Store) StorePool(name string) persist.PoolStat {
	var p *pgxpool.Pool
	switch name {
	case "read":
		p = s.pool
	case "commit":
		p = s.commits
	case "control":
		p = s.control
	default:
		return persist.PoolStat{}
	}
	st := p.Stat()
	return persist.PoolStat{Acquired: st.AcquiredConns(), Idle: st.IdleConns(), Total: st.TotalConns(), Max: st.MaxConns()}
}

// Ping checks the database answers, on the control pool: a burst of reads
// (10,000 Subscribe streams each reading its backlog at once) queues on the
// read pool for seconds while the database answers at once, and a ping
// queued behind them made /readyz answer 503 "store unavailable" and the
// node log the store unreachable.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.control.Ping(ctx); err != nil {
		return unavailable("ping", err)
	}
	return nil
}

// Close closes every connection.
func (s *Store) Close() error {
	for _, p := range []*pgxpool.Pool{s.pool, s.commits, s.control} {
		if p != nil {
			p.Close()
		}
	}
	return nil
}

// unavailable wraps err as sequencer.ErrStoreUnavailable: the operation did
// not change anything and may be retried.
func unavailable(op string, err error) error {
	return fmt.Errorf("postgres: %s: %w (%w)", op, sequencer.ErrStoreUnavailable, err)
}

// Unavailable is unavailable for the packages over this one (persist/citus).
func Unavailable(op string, err error) error { return unavailable(op, err) }

// Classify is classify for the packages over this one (persist/citus).
func Classify(op string, err error) error { return classify(op, err) }

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

// The abilities a PostgreSQL store has beyond persist.Store.
var (
	_ persist.Migrator       = (*Store)(nil)
	_ persist.PoolReporter   = (*Store)(nil)
	_ persist.MessagesGetter = (*Store)(nil)
)
