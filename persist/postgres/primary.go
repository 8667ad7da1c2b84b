package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// After a primary switch behind a multi-host DSN, the old primary is not
// always gone. A server whose postmaster stopped answering (frozen, or its
// listener cut off) keeps its established sessions: PostgreSQL puts every
// backend in a session of its own (setsid), so stopping the postmaster stops
// no backend. Such a session still answers reads, from the old primary's
// data, while new connections (target_session_attrs=read-write) reach the
// promoted standby and commit there. A read on the old session then misses
// acknowledged commits: a conversation loading its head there gets a head
// below one it acked (seen as sequencer.ErrHeadRegressed), a Pull misses
// acked messages. Writes on the old session cannot succeed with a
// synchronous standby (they wait for it forever), so nothing else exposes
// that session as stale.
//
// So every connection of the store's pools is tagged with the server it is
// on (serverID), and the store follows ONE server, the "current" one:
//   - the current server is the server of the newest connection made by any
//     of the store's pools (new connections go to the writable server of the
//     DSN, tried in order, the current one first: hostPreference);
//   - a pooled connection to another server is never handed out again
//     (pgxpool's PrepareConn destroys it), so once a connection to the new
//     primary exists, no read, commit or heartbeat runs on the old one;
//   - a server on an older timeline than one already seen (same
//     system_identifier) is refused at connect time: a demoted primary still
//     accepting connections cannot become current again.
//
// Hence an operation that starts after a commit returned runs on that
// commit's server or on a newer one: the connection the commit ran on was
// made (and became current) before the commit, and any later switch only
// moves to a newer server.

// serverID names one running PostgreSQL server.
type serverID struct {
	system   string // pg_control_system().system_identifier: one per initdb, shared by its standbys
	timeline uint64 // the WAL timeline: a promotion starts a new, higher one (0: in recovery)
	started  string // pg_postmaster_start_time(), epoch seconds: one per server run
}

func (s serverID) String() string {
	return fmt.Sprintf("system %s, timeline %d, started %s", s.system, s.timeline, s.started)
}

// serverIDSQL reads the serverID of the connection's server (in the simple
// protocol, so it runs during connection validation).
const serverIDSQL = `SELECT (SELECT system_identifier FROM pg_control_system())::text,
  CASE WHEN pg_is_in_recovery() THEN '0'
       ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8::text END,
  extract(epoch FROM pg_postmaster_start_time())::text`

const serverIDKey = "sequencer.server"

// errOlderTimeline refuses a server on an older timeline than one the store
// already uses (a demoted primary).
var errOlderTimeline = errors.New("postgres: server is on an older timeline than the current primary (a demoted primary)")

// serverStartSQL is the fallback of serverIDSQL on a server that refuses
// the control or WAL functions (some managed services): the server is then
// known by its start time only, and no timeline is compared.
const serverStartSQL = `SELECT '', '0', extract(epoch FROM pg_postmaster_start_time())::text`

// readServerID reads and returns c's serverID.
func readServerID(ctx context.Context, c *pgconn.PgConn) (serverID, error) {
	res, err := c.Exec(ctx, serverIDSQL).ReadAll()
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		res, err = c.Exec(ctx, serverStartSQL).ReadAll()
	}
	if err != nil {
		return serverID{}, fmt.Errorf("postgres: read the server's identity: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 3 {
		return serverID{}, errors.New("postgres: unreadable server identity")
	}
	row := res[0].Rows[0]
	tl, err := strconv.ParseUint(string(row[1]), 10, 64)
	if err != nil {
		return serverID{}, fmt.Errorf("postgres: unreadable timeline %q", row[1])
	}
	return serverID{system: string(row[0]), timeline: tl, started: string(row[2])}, nil
}

// serverOf returns the serverID recorded on c (zero if none).
func serverOf(c *pgconn.PgConn) serverID {
	id, _ := c.CustomData()[serverIDKey].(serverID)
	return id
}

// primaryTracker is the current server of a store's pools (see above). It is
// shared by all of them.
type primaryTracker struct {
	mu       sync.Mutex
	current  serverID          // server of the newest connection
	timeline map[string]uint64 // highest timeline seen, by system identifier
}

func newPrimaryTracker() *primaryTracker {
	return &primaryTracker{timeline: map[string]uint64{}}
}

// validate is a pgconn ValidateConnect step: it reads the server's identity
// onto the connection and refuses a server on an older timeline than the
// store has seen, so pgx tries the DSN's next host.
func (p *primaryTracker) validate(ctx context.Context, c *pgconn.PgConn) error {
	id, err := readServerID(ctx, c)
	if err != nil {
		return err
	}
	if err := p.admit(id); err != nil {
		return err
	}
	c.CustomData()[serverIDKey] = id
	return nil
}

// admit refuses a server on an older timeline of a system already seen.
func (p *primaryTracker) admit(id serverID) error {
	p.mu.Lock()
	high := p.timeline[id.system]
	p.mu.Unlock()
	if id.timeline < high {
		return fmt.Errorf("%w: %s, timeline %d already seen", errOlderTimeline, id, high)
	}
	return nil
}

// connected makes the server of a new pool connection the current one.
func (p *primaryTracker) connected(c *pgconn.PgConn) { p.connect(serverOf(c)) }

func (p *primaryTracker) connect(id serverID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.current = id
	if id.timeline > p.timeline[id.system] {
		p.timeline[id.system] = id.timeline
	}
}

// usable reports whether a pooled connection is on the current server
// (pgxpool PrepareConn: false destroys it and takes another).
func (p *primaryTracker) usable(_ context.Context, c *pgx.Conn) (bool, error) {
	if p.isCurrent(serverOf(c.PgConn())) {
		return true, nil
	}
	c.PgConn().CustomData()[staleKey] = true
	return false, nil
}

func (p *primaryTracker) isCurrent(id serverID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return id == p.current
}

// Current returns the server the store's pools follow (for tests and logs).
func (p *primaryTracker) Current() serverID {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.current
}

// staleKey marks a connection to a server that is no longer current: its
// socket is closed at once when the pool destroys it (its server may be
// silent; a polite close would hold the pool slot until it answers).
const staleKey = "sequencer.stale"
