package postgres

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/testwait"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// silentProxy forwards TCP to a PostgreSQL server until frozen; then it
// behaves like a frozen or cut-off primary: connections stay open, new ones
// are accepted, and nothing is ever answered.
type silentProxy struct {
	ln       net.Listener
	target   string
	frozen   atomic.Bool
	accepted atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
	done     chan struct{}
}

func newSilentProxy(t *testing.T, target string) *silentProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silentProxy{ln: ln, target: target, done: make(chan struct{})}
	go p.serve()
	t.Cleanup(func() {
		close(p.done)
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	return p
}

func (p *silentProxy) addr() string { return p.ln.Addr().String() }

func (p *silentProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *silentProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		p.track(c)
		if p.frozen.Load() {
			continue // held open, never answered
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.track(b)
		go p.pipe(b, c)
		go p.pipe(c, b)
	}
}

// pipe copies src to dst until frozen; then it swallows everything.
func (p *silentProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			dst.Close()
			return
		}
		if p.frozen.Load() {
			<-p.done
			return
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestSilentOldPrimaryReleasesPoolSlots: the first host of a multi-host DSN
// goes silent (accepts TCP, never answers), as a frozen or cut-off old
// primary does. The pool's connections to it break on timeouts; pgx would
// then keep each in cleanup (cancel request, drain) for 15s and the pool
// would count them against MaxConns, so no connection to the second host
// could be made in that time. The store must reach the second host well
// before that, and once it has, new connections must go to it directly
// instead of spending ConnectTimeout on the silent host each time.
func TestSilentOldPrimaryReleasesPoolSlots(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newSilentProxy(t, u.Host)
	direct := u.Host
	u.Host = proxy.addr() + "," + direct
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	ctx := context.Background()
	st, err := Open(ctx, u.String(), Options{MaxConns: 2, ConnectTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer st.Close()

	// Both pool connections go through the first host.
	c1, err := st.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := st.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c1.Release()
	c2.Release()
	if got := proxy.accepted.Load(); got < 2 {
		t.Fatalf("%d connections through the first host, want 2", got)
	}

	proxy.frozen.Store(true)
	// Break both connections: each statement times out on the silent host.
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			if _, err := st.pool.Exec(qctx, "SELECT 1"); err == nil {
				t.Errorf("a statement through the silent host succeeded")
			}
		}()
	}
	wg.Wait()

	// pgx's own cleanup would hold both slots for 15s; the store must get a
	// connection to the second host long before that.
	pctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	if err := st.pool.Ping(pctx); err != nil {
		t.Fatalf("no connection to the second host while the first is silent: %v (pool: %d total, %d acquired, %d constructing)",
			err, st.pool.Stat().TotalConns(), st.pool.Stat().AcquiredConns(), st.pool.Stat().ConstructingConns())
	}

	// New connections now try the second host first.
	before := proxy.accepted.Load()
	st.pool.Reset()
	for i := 0; i < 3; i++ {
		if err := st.pool.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		st.pool.Reset()
	}
	if got := proxy.accepted.Load(); got != before {
		t.Fatalf("%d new connections tried the silent first host after the second one answered", got-before)
	}

	// The store's own ping (the control pool, whose connection still goes
	// to the silent host) fails at its deadline, as the node's watch and
	// /readyz ask it (1 s, 2 s), which breaks that connection; a later one
	// reaches the second host.
	testwait.Until(t, 8*time.Second, 10*time.Millisecond, "the store's ping through the second host", func() error {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return st.Ping(pctx)
	})
}

func TestHostPreferenceOrder(t *testing.T) {
	tlsA, tlsB := &tls.Config{}, &tls.Config{}
	cfg := func() *pgconn.Config {
		return &pgconn.Config{Host: "a", Port: 1, TLSConfig: tlsA, Fallbacks: []*pgconn.FallbackConfig{
			{Host: "a", Port: 1}, {Host: "10.0.0.2", Port: 2, TLSConfig: tlsB}, {Host: "10.0.0.2", Port: 2}, {Host: "c", Port: 3},
		}}
	}
	hosts := func(c *pgconn.Config) []string {
		out := []string{net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))}
		for _, f := range c.Fallbacks {
			out = append(out, net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port))))
		}
		return out
	}
	h := newHostPreference()
	c := cfg()
	h.order(c)
	if got := hosts(c); got[0] != "a:1" || got[2] != "10.0.0.2:2" {
		t.Fatalf("no preference yet: order changed to %v", got)
	}
	// An IP host: its TLS and plain entries move first, in their order.
	h.connected(fakeConn{"10.0.0.2:2"})
	c = cfg()
	h.order(c)
	if got, want := hosts(c), []string{"10.0.0.2:2", "10.0.0.2:2", "a:1", "a:1", "c:3"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if c.TLSConfig != tlsB || c.Fallbacks[0].TLSConfig != nil {
		t.Fatalf("TLS settings did not move with their host")
	}
	// A host name is matched through what it resolved to.
	look := h.lookup(func(ctx context.Context, host string) ([]string, error) { return []string{"10.0.0.3"}, nil })
	if _, err := look(context.Background(), "c"); err != nil {
		t.Fatal(err)
	}
	h.connected(fakeConn{"10.0.0.3:3"})
	c = cfg()
	h.order(c)
	if got, want := hosts(c), []string{"c:3", "a:1", "a:1", "10.0.0.2:2", "10.0.0.2:2"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

type fakeConn struct{ remote string }

func (f fakeConn) RemoteAddr() net.Addr {
	a, _ := net.ResolveTCPAddr("tcp", f.remote)
	return a
}
func (fakeConn) Read([]byte) (int, error)         { return 0, nil }
func (fakeConn) Write(b []byte) (int, error)      { return len(b), nil }
func (fakeConn) Close() error                     { return nil }
func (fakeConn) LocalAddr() net.Addr              { return nil }
func (fakeConn) SetDeadline(time.Time) error      { return nil }
func (fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (fakeConn) SetWriteDeadline(time.Time) error { return nil }

// TestReadOnlyServerDropsConnection: a server that turns read-only under an
// open pool connection (a fenced or demoted primary) refuses the commit as
// unavailable, and the connection is dropped so the next one is made (and
// checked against target_session_attrs) afresh.
func TestReadOnlyServerDropsConnection(t *testing.T) {
	srv := pgtest.StartServer(t) // private: its settings change
	ctx := context.Background()
	st, err := Open(ctx, srv.DSN(), Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(ctx, []persist.ConvBatch{msgs("ro", 0, 1, 1)}); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, q := range []string{"ALTER SYSTEM SET default_transaction_read_only = on", "SELECT pg_reload_conf()"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// The pool's session applies the reload at its next statement; wait
	// until the commit is refused.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		err = st.Commit(ctx, []persist.ConvBatch{msgs(fmt.Sprintf("ro-%d", i), 0, 1, uint64(100+i))})
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("commits still succeed 20s after the server turned read-only")
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
	if !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("commit on a read-only server: %v, want ErrStoreUnavailable", err)
	}
	for st.commits.Stat().TotalConns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the connection to the read-only server is still pooled")
		}
		time.Sleep(10 * time.Millisecond) // the pool destroys connections asynchronously
	}
}
