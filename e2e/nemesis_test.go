package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/cespare/xxhash/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/cluster"
	"github.com/sequencer-im/sequencer/internal/history"
	"github.com/sequencer-im/sequencer/internal/testwait"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// nemesisTTL is the nodes' membership TTL in the nemesis runs (heartbeat
// 250ms): short, so that a fault of a few seconds outlives it.
const nemesisTTL = "2s"

// healBound is how long, after a fault heals, every node may take to be
// ready and to agree with the others on every sampled conversation's owner.
const healBound = 30 * time.Second

// nemesisCluster is 3 real nodes on one database (PostgreSQL unless
// startNemesisClusterOn names another store); node i reaches the database
// through db[i] (and, on Citus, each worker through workers[k]'s link
// from nodeSource(i+1)) and its peers reach it through peer[i] (its
// --cluster-advertise), dialing from nodeSource(i+1).
type nemesisCluster struct {
	t       *testing.T
	dsn     string
	nodes   []*proc
	db      []*proxy
	peer    []*proxy
	workers []*proxy
	convs   []string
	sdk     *client.Client
	led     *ledger
	load    *load
	// internalDups counts duplicate:true answers to a raw client's first
	// send of a key while no other send of it was under way (the client had
	// not resent it: the node did).
	internalDups atomic.Int64
	stop, done   chan struct{}
	killedAt     map[int]time.Time // by node index, for the restart
	beforeVerify func()            // finish: after the load stopped, before the checks
	// clockFiles are the nodes' test clock offset files (clock_test.go),
	// nil when the nodes run on the real clock; offsets what each holds.
	clockFiles []string
	offsets    []time.Duration
	// faultAt is when the last fault began (inject): a failed heal logs
	// what the nodes logged since.
	faultAt time.Time
	// stalls watches how late the test process wakes: its proxies carry
	// every node's links, so a stall of the process is a fault of them all.
	stalls *stallWatch
	// onError, when set before startLoad, sees every error a load client
	// got.
	onError func(err error)
	// raw is, by a 64-bit hash of the client_msg_id (pointer-free, like
	// the ledger's counts: a soak sends millions of keys), how many raw
	// sends of the key began and the node index of the latest (the SDK
	// picks its own node); faults the schedule's faults, on the history's
	// clock: both for the report of the slowest sends. A hash collision
	// can only misreport a node or an internal duplicate, never a check.
	rawMu  sync.Mutex
	raw    map[uint64]rawSends
	faults []faultSpan
}

// rawSends is what nemesisCluster.raw keeps of one key.
type rawSends struct {
	started int32
	node    int8
}

// proxiedDSN is dsn with its host and port replaced by addr.
func proxiedDSN(t *testing.T, dsn, addr string) (string, string) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(cfg.Host, "/") {
		t.Fatalf("the nemesis proxies TCP: PostgreSQL at %s is a unix socket", cfg.Host)
	}
	target := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	host, port, _ := net.SplitHostPort(addr)
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.Host = addr
		return u.String(), target
	}
	return dsn + " host=" + host + " port=" + port, target
}

// startNemesisCluster starts n nodes on a new PostgreSQL database; with
// steppedClocks each node's wall clock follows an offset file (stepClock),
// else the real clock.
func startNemesisCluster(t *testing.T, n int, steppedClocks bool) *nemesisCluster {
	return startNemesisClusterOn(t, pgNemesisStore(t, pgtest.NewDatabase(t)), n, steppedClocks)
}

// startNemesisClusterOn is startNemesisCluster on st (nemesis_store_test.go).
func startNemesisClusterOn(t *testing.T, st nemesisStore, n int, steppedClocks bool) *nemesisCluster {
	c := &nemesisCluster{t: t, dsn: st.dsn, workers: st.workers, convs: convNames(120), killedAt: map[int]time.Time{}}
	if steppedClocks {
		dir := t.TempDir()
		for i := 1; i <= n; i++ {
			c.clockFiles = append(c.clockFiles, filepath.Join(dir, fmt.Sprintf("n%d.offset", i)))
		}
		c.offsets = make([]time.Duration, n)
	}
	for i := 1; i <= n; i++ {
		db, err := newProxy(fmt.Sprintf("n%d->db", i), st.target, false)
		if err != nil {
			t.Fatal(err)
		}
		dsn := st.nodeDSN(i, db.Addr())
		listen := freeAddr(t)
		peer, err := newProxy(fmt.Sprintf("->n%d", i), listen, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		t.Cleanup(peer.Close)
		c.db, c.peer = append(c.db, db), append(c.peer, peer)
		id := fmt.Sprintf("n%d", i)
		env := []string{cluster.TestDialFromEnv + "=" + nodeSource(i)}
		if steppedClocks {
			env = append(env, clock.TestOffsetFileEnv+"="+c.clockFiles[i-1])
		}
		p := &proc{t: t, name: id, env: env,
			args: []string{"--store", dsn, "--cluster-listen", listen, "--cluster-advertise", peer.Addr(),
				"--node-id", id, "--member-ttl", nemesisTTL, "--heartbeat", "250ms", "--log-level", "info"}}
		p.start(freeAddr(t))
		t.Cleanup(func() {
			p.kill()
			if t.Failed() {
				t.Logf("--- output of %s (last 40 lines) ---\n%s", p.name, lastLines(p.Output(), 40))
			}
		})
		c.nodes = append(c.nodes, p)
	}
	// Registered after the nodes': runs before they are killed.
	t.Cleanup(func() {
		if t.Failed() {
			c.logStoreActivity()
		}
	})
	var addrs []string
	for _, p := range c.nodes {
		addrs = append(addrs, p.Addr)
	}
	sdk, err := client.New(client.Config{Addrs: addrs}) // the SDK's defaults
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sdk.Close() })
	c.sdk = sdk
	c.stalls = watchStalls(t)
	c.waitHealed("at start")
	return c
}

// rawClient tells the load's raw JSON clients (one in four) from its SDK
// clients.
func rawClient(i int) bool { return i%4 == 3 }

// startLoad runs 48 clients: three in four use the SDK with its defaults,
// the others send raw JSON to a random node. Every client resends (same key)
// until acked: "a retrying client gets every send acked".
func (c *nemesisCluster) startLoad() {
	c.led = newLedger()
	c.raw = map[uint64]rawSends{}
	c.load = &load{convs: c.convs, clients: 48, led: c.led, readers: 3,
		readVia: func(rng *rand.Rand) (string, sequencerv1connect.SequencerServiceClient) {
			p := c.nodes[rng.Intn(len(c.nodes))]
			return p.name, p.jsonClient()
		},
		sendFn: func(ctx context.Context, i int, conv string, from uint64, cid string, body []byte) (uint64, uint64, error) {
			if !rawClient(i) {
				res, err := c.sdk.Send(ctx, client.SendRequest{ConvID: conv, FromUID: from, ClientMsgID: cid, Body: body})
				if err != nil {
					return 0, 0, err
				}
				return res.MsgID, res.Seq, nil
			}
			h := xxhash.Sum64String(cid)
			v := rand.Intn(len(c.nodes))
			p := c.nodes[v]
			c.rawMu.Lock()
			r := c.raw[h]
			r.started++
			r.node = int8(v)
			c.raw[h] = r
			first := r.started == 1
			c.rawMu.Unlock()
			resp, err := send(ctx, p.jsonClient(), conv, from, cid, body)
			if err != nil {
				return 0, 0, err
			}
			c.rawMu.Lock()
			alone := c.raw[h].started == 1 // no other send of the key began meanwhile
			c.rawMu.Unlock()
			if first && alone && resp.Duplicate {
				c.internalDups.Add(1)
			}
			return resp.MsgId, resp.Seq, nil
		},
		onError: func(err error) {
			if c.onError != nil {
				c.onError(err)
			}
		},
		retryable: func(err error) bool {
			var se *sequencer.Error
			if asSeqErr(err, &se) {
				return se.Code.Retryable() || se.Code == sequencer.CodeDeadlineExceeded
			}
			return retryableCode(err)
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.stop, c.done = make(chan struct{}), make(chan struct{})
	go func() { c.load.run(ctx, c.t, c.stop); close(c.done) }()
	c.t.Cleanup(func() {
		select {
		case <-c.stop:
		default:
			close(c.stop)
		}
		cancel()
		<-c.done
	})
}

// finish stops the load (in-flight sends still go until acked), then checks
// every invariant: no client gave up, and the history is linearizable
// against the store's final rows. It returns the history's counts.
func (c *nemesisCluster) finish() history.Counts {
	t := c.t
	close(c.stop)
	select {
	case <-c.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("clients still waiting for acks 2 minutes after the load stopped")
	}
	if n := c.load.errs.Load(); n != 0 {
		t.Errorf("%d sends were never acked (clients resend until acked)", n)
	}
	if c.beforeVerify != nil {
		c.beforeVerify()
	}
	counts := c.led.verify(t, openStore(t, c.dsn), c.convs)
	t.Logf("duplicate:true on a raw client's first send of a key (an internal resend): %d", c.internalDups.Load())
	return counts
}

// logStoreActivity logs what the PostgreSQL store's sessions of this
// test's database are doing, and what blocks them, straight from the
// server (not through the proxies): when every node lost the store at
// once (two soak runs), was it the server, a lock or the proxies?
func (c *nemesisCluster) logStoreActivity() {
	if !strings.HasPrefix(c.dsn, "postgres") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.dsn)
	if err != nil {
		c.t.Logf("store activity: connect: %v", err)
		return
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid, coalesce(application_name, ''), coalesce(client_addr::text, ''),
		coalesce(state, ''), coalesce(wait_event_type || ':' || wait_event, ''),
		coalesce(round(extract(epoch FROM now() - xact_start)::numeric, 1)::text, '-'),
		pg_blocking_pids(pid)::text, left(regexp_replace(query, '\s+', ' ', 'g'), 160)
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
		ORDER BY xact_start NULLS LAST`)
	if err != nil {
		c.t.Logf("store activity: %v", err)
		return
	}
	var b strings.Builder
	for rows.Next() {
		var pid int
		var app, addr, state, wait, xact, blockers, query string
		if err := rows.Scan(&pid, &app, &addr, &state, &wait, &xact, &blockers, &query); err != nil {
			c.t.Logf("store activity: %v", err)
			return
		}
		fmt.Fprintf(&b, "  pid %d %s %s %s wait=%s xact=%ss blocked_by=%s: %s\n", pid, app, addr, state, wait, xact, blockers, query)
	}
	c.t.Logf("--- the store's sessions at the failure (pg_stat_activity) ---\n%s", b.String())
}

// heal puts every link back to pass with no delay and steps every clock
// that is off back to the host's.
func (c *nemesisCluster) heal() {
	for _, ps := range [][]*proxy{c.db, c.peer, c.workers} {
		for _, p := range ps {
			p.all(func(l *link) { l.delay.Store(0); l.set(pass, pass) })
		}
	}
	for v, off := range c.offsets {
		if off != 0 {
			c.stepClock(v, 0)
		}
	}
}

// waitHealed waits until every node is ready and all agree on the owner of
// every sampled conversation; it fails the test after healBound, naming
// what was still not healed (a node's /readyz answer, or a conversation
// the nodes route differently) and logging each node's lines since the
// fault.
func (c *nemesisCluster) waitHealed(what string) time.Duration {
	start := time.Now()
	healed := false
	defer func() {
		if !healed { // Until failed the test
			c.logSinceFault()
		}
	}()
	testwait.Until(c.t, healBound, 10*time.Millisecond, "every node ready and agreeing on owners "+what, func() error {
		for _, p := range c.nodes {
			if code, body := readyz(p.Addr); code != 200 {
				return fmt.Errorf("%s /readyz: %d %q", p.name, code, body)
			}
		}
		return c.ownersAgree()
	})
	healed = true
	return time.Since(start)
}

// ownersAgree is nil when every node routes each of the first 40
// conversations to the same owner at the same membership version, else the
// first disagreement with every node's answer. Each Route call has 2 s of
// its own (120 calls sharing 2 s could all time out on a loaded machine).
func (c *nemesisCluster) ownersAgree() error {
	for _, conv := range c.convs[:40] {
		var answers []string
		var first string
		agree := true
		for i, p := range c.nodes {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			r, err := p.jsonClient().Route(ctx, connect.NewRequest(&sequencerv1.RouteRequest{ConvId: conv}))
			cancel()
			who := ""
			switch {
			case err != nil:
				who, agree = "error "+err.Error(), false
			case r.Msg.NodeId == "":
				who, agree = "no owner", false
			default:
				who = r.Msg.NodeId + "@" + strconv.FormatUint(r.Msg.MembershipVersion, 10)
			}
			if i == 0 {
				first = who
			} else if who != first {
				agree = false
			}
			answers = append(answers, p.name+": "+who)
		}
		if !agree {
			return fmt.Errorf("%s routed as %s", conv, strings.Join(answers, ", "))
		}
	}
	return nil
}

// logSinceFault logs, one line per node, what the node logged at WARN or
// about the membership and its partitions since the last fault began (the
// lines a failed heal is read from; the nodes' whole output follows at the
// cleanup, but a CI report keeps only the first lines of a failure).
func (c *nemesisCluster) logSinceFault() {
	for _, p := range c.nodes {
		var keep []string
		for _, l := range strings.Split(p.Output(), "\n") {
			ts, rest, ok := strings.Cut(strings.TrimPrefix(l, "time="), " ")
			at, err := time.Parse(time.RFC3339Nano, ts)
			if !ok || err != nil || at.Before(c.faultAt) {
				continue
			}
			if strings.Contains(rest, "level=WARN") || strings.Contains(rest, "level=ERROR") ||
				strings.Contains(rest, "membership") || strings.Contains(rest, "partitions") ||
				strings.Contains(rest, "presumed dead") || strings.Contains(rest, "joined") {
				keep = append(keep, at.UTC().Format("15:04:05.000")+" "+rest)
			}
		}
		n := len(keep)
		if n > 24 { // the first 8 and the last 16
			keep = append(append(keep[:8:8], fmt.Sprintf("[%d lines]", n-24)), keep[n-16:]...)
		}
		c.t.Logf("%s since the fault (%d lines): %s", p.name, n, strings.Join(keep, " | "))
	}
	for _, p := range c.nodes {
		c.t.Logf("%s now: %s", p.name, healMetrics(p.Addr))
	}
	c.stalls.report()
}

// healGauges are the metrics a failed heal logs of each node: whether it
// is ready, its view, what it holds, and its store pools' connections in
// use (a pool held by something stuck starves the heartbeat).
var healGauges = []string{"sequencer_ready", "sequencer_worker_lease_held", "sequencer_cluster_membership_version",
	"sequencer_cluster_members", "sequencer_cluster_heartbeat_age_seconds", "sequencer_cluster_step_downs_total",
	"sequencer_cluster_partitions_held", "sequencer_cluster_partitions_moving", "sequencer_cluster_peers_unreachable",
	"sequencer_store_pool_acquired_conns", "sequencer_pending_sends", "sequencer_commit_queue_batches",
	"sequencer_conversation_actors"}

// healMetrics is healGauges as node addr's /metrics answers them now.
func healMetrics(addr string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "no /metrics: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, n := range healGauges {
			if strings.HasPrefix(l, n+" ") || strings.HasPrefix(l, n+"{") {
				out = append(out, strings.TrimPrefix(l, "sequencer_"))
			}
		}
	}
	return strings.Join(out, ", ")
}

// nemesisFault is one fault of node v (0-based), undone by heal.
type nemesisFault struct {
	name  string
	apply func(c *nemesisCluster, v int)
}

// dbLinks applies f to node v's links to the database: its proxy to the
// database and, on Citus, its links to each worker.
func (c *nemesisCluster) dbLinks(v int, f func(l *link)) {
	c.db[v].all(f)
	for _, w := range c.workers {
		f(w.from(nodeSource(v + 1)))
	}
}

// peerLinks applies f to every link between node v and another node, in
// the directions asked: in (others -> v) and out (v -> others).
func (c *nemesisCluster) peerLinks(v int, in, out bool, f func(l *link)) {
	for j := range c.nodes {
		if j == v {
			continue
		}
		if in {
			f(c.peer[v].from(nodeSource(j + 1)))
		}
		if out {
			f(c.peer[j].from(nodeSource(v + 1)))
		}
	}
}

var nemesisFaults = []nemesisFault{
	{"db-blackhole", func(c *nemesisCluster, v int) { c.dbLinks(v, func(l *link) { l.set(blackhole, blackhole) }) }},
	{"db-reset", func(c *nemesisCluster, v int) { c.dbLinks(v, func(l *link) { l.set(reset, reset) }) }},
	{"db-answers-lost", func(c *nemesisCluster, v int) { c.dbLinks(v, func(l *link) { l.set(pass, blackhole) }) }},
	{"db-slow-150ms", func(c *nemesisCluster, v int) {
		c.dbLinks(v, func(l *link) { l.delay.Store(int64(150 * time.Millisecond)) })
	}},
	{"peers-blackhole", func(c *nemesisCluster, v int) {
		c.peerLinks(v, true, true, func(l *link) { l.set(blackhole, blackhole) })
	}},
	{"peers-one-way-in", func(c *nemesisCluster, v int) {
		c.peerLinks(v, true, false, func(l *link) { l.set(blackhole, blackhole) })
	}},
	{"peers-slow-150ms", func(c *nemesisCluster, v int) {
		c.peerLinks(v, true, true, func(l *link) { l.delay.Store(int64(150 * time.Millisecond)) })
	}},
	{"db-and-peers-blackhole", func(c *nemesisCluster, v int) {
		c.dbLinks(v, func(l *link) { l.set(blackhole, blackhole) })
		c.peerLinks(v, true, true, func(l *link) { l.set(blackhole, blackhole) })
	}},
}

// inject applies fault f to node v and notes when (faultAt).
func (c *nemesisCluster) inject(f nemesisFault, v int) {
	c.faultAt = time.Now()
	f.apply(c, v)
}

// processFaults join the network's in the random schedules: the existing
// kill -9 (restarted at heal) and SIGSTOP (resumed at heal).
var processFaults = []nemesisFault{
	{"kill-9", func(c *nemesisCluster, v int) { c.nodes[v].kill(); c.killedAt[v] = time.Now() }},
	{"sigstop", func(c *nemesisCluster, v int) { _ = c.nodes[v].cmd.Process.Signal(syscall.SIGSTOP) }},
}

// healProcesses restarts killed nodes and resumes stopped ones.
// A killed node restarts once its membership lease has expired: its
// node id is refused while a live member holds it.
func (c *nemesisCluster) healProcesses() {
	ttl, _ := time.ParseDuration(nemesisTTL)
	for i, p := range c.nodes {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		select {
		case <-p.done:
			if wait := time.Until(c.killedAt[i].Add(ttl + time.Second)); wait > 0 {
				time.Sleep(wait) // the lease's own expiry: a protocol bound, not settling
			}
			p.start(p.Addr)
		default:
		}
	}
}

// window is the measured behaviour of the cluster over a stretch of time.
type window struct {
	acks      int     // acked sends returned in the window (every client)
	sdkAcks   int     // of which by SDK clients
	perSec    float64 // acks / s
	sdkPerSec float64
	slowest   time.Duration // slowest acked SDK send that overlapped the window
}

func (c *nemesisCluster) measure(from, to time.Duration) window {
	var w window
	for _, o := range c.led.hist.Ops() {
		if o.Kind != history.Send || o.Outcome != history.OK {
			continue
		}
		if o.Return >= from && o.Return < to {
			w.acks++
			if !rawClient(o.Client) {
				w.sdkAcks++
			}
		}
		if !rawClient(o.Client) && o.Return >= from && o.Call < to {
			if d := o.Return - o.Call; d > w.slowest {
				w.slowest = d
			}
		}
	}
	w.perSec = float64(w.acks) / (to - from).Seconds()
	w.sdkPerSec = float64(w.sdkAcks) / (to - from).Seconds()
	return w
}

// timeline counts the acked SDK sends per 500 ms of [from, to).
func (c *nemesisCluster) timeline(from, to time.Duration) []int {
	out := make([]int, (to-from+500*time.Millisecond-1)/(500*time.Millisecond))
	for _, o := range c.led.hist.Ops() {
		if o.Kind == history.Send && o.Outcome == history.OK && !rawClient(o.Client) && o.Return >= from && o.Return < to {
			out[(o.Return-from)/(500*time.Millisecond)]++
		}
	}
	return out
}

// faultSpan is one fault as it ran: healthy from t0 to t1, the fault from
// t1 to t2, then healed: every node ready and agreeing after that long.
type faultSpan struct {
	name       string
	node       int           // the victim, from 1 (the schedule's report)
	t0, t1, t2 time.Duration // history times
	healed     time.Duration
}

// runFault runs a healthy stretch, then f on node v for hold, heals and
// waits until every node is ready and agreeing (healBound).
func (c *nemesisCluster) runFault(f nemesisFault, v int, healthy, hold time.Duration) faultSpan {
	s := faultSpan{name: f.name, t0: c.led.hist.Now()}
	time.Sleep(healthy) // a healthy stretch to compare with (measured, not settling)
	s.t1 = c.led.hist.Now()
	c.t.Logf("fault %s on %s", f.name, c.nodes[v].name)
	c.inject(f, v)
	time.Sleep(hold) // the fault lasts this long
	s.t2 = c.led.hist.Now()
	c.heal()
	s.healed = c.waitHealed("after " + f.name)
	return s
}

// row measures s for the report (after the load ended, so that a send
// stuck in a fault counts with its full time).
func (c *nemesisCluster) row(s faultSpan) faultRow {
	return faultRow{name: s.name, healthy: c.measure(s.t0, s.t1), during: c.measure(s.t1, s.t2), healed: s.healed}
}

// faultRow is one line of the nemesis report.
type faultRow struct {
	name            string
	healthy, during window
	healed          time.Duration
}

func (r faultRow) String() string {
	ratio := 0.0
	if r.healthy.perSec > 0 {
		ratio = 100 * r.during.perSec / r.healthy.perSec
	}
	sdk := 0.0
	if r.healthy.sdkAcks > 0 {
		sdk = 100 * r.during.sdkPerSec / r.healthy.sdkPerSec
	}
	return fmt.Sprintf("| %s | %.0f | %.0f | %.0f%% | %.0f%% | %v | %v |", r.name, r.healthy.perSec, r.during.perSec, ratio, sdk,
		r.during.slowest.Round(time.Millisecond), r.healed.Round(10*time.Millisecond))
}

// writeReport logs the table and writes it to the artifacts directory.
func writeReport(t *testing.T, name, head string, rows []faultRow) {
	var b strings.Builder
	b.WriteString(head + "\n\n| fault (node n1) | healthy acks/s | acks/s during | kept | kept, SDK clients | slowest acked SDK send | ready+agreeing after heal |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		b.WriteString(r.String() + "\n")
	}
	t.Log("\n" + b.String())
	dir := historyArtifacts()
	if err := os.MkdirAll(dir, 0o755); err == nil {
		_ = os.WriteFile(filepath.Join(dir, name+".md"), []byte(b.String()), 0o644)
	}
}

// TestNemesisFaults: 3 nodes, each reaching PostgreSQL and its peers through
// its own proxies, under load from SDK (defaults) and raw JSON clients. Each
// network fault of nemesisFaults hits n1 alone for 5 s, then heals; after
// each, every node is ready and all agree on owners within healBound. At the
// end no client gave up on a send and the history of every conversation is
// linearizable (internal/history) against the store's rows. Throughput kept
// and the slowest acked send per fault are logged for docs/TESTING.md (not
// asserted: wall-clock speed is the machine's).
func TestNemesisFaults(t *testing.T) {
	c := startNemesisCluster(t, 3, false)
	c.startLoad()
	waitFor(t, 60*time.Second, "200 acks before the first fault", func() bool { return c.led.count() >= 200 })
	var spans []faultSpan
	for _, f := range nemesisFaults {
		spans = append(spans, c.runFault(f, 0, 3*time.Second, 5*time.Second))
	}
	c.finish()
	// Measured after the load ended, so a send stuck in a fault counts with
	// its full time.
	var rows []faultRow
	for _, s := range spans {
		rows = append(rows, c.row(s))
		t.Logf("%s: SDK acks per 500 ms from 1 s before the fault to 1 s after it: %v", s.name, c.timeline(s.t1-time.Second, s.t2+time.Second))
	}
	writeReport(t, "nemesis-faults", fmt.Sprintf("nemesis faults, member TTL %s, 48 clients (36 SDK defaults, 12 raw JSON), 5 s per fault", nemesisTTL), rows)
}

// nemesisSchedule returns the seed and length of a random schedule:
// SOAK_SEED and SOAK_MINUTES when set (make soak), else a fresh seed and def.
func nemesisSchedule(t *testing.T, def time.Duration) (int64, time.Duration) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("SOAK_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: %v", s, err)
		}
		seed = v
	}
	d := def
	if s := os.Getenv("SOAK_MINUTES"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			t.Fatalf("SOAK_MINUTES=%q: want a positive number", s)
		}
		d = time.Duration(v * float64(time.Minute))
	}
	return seed, d
}

// TestNemesisSchedule runs a random schedule of network, process and clock
// faults (one node at a time, 1-6 s each, 0.5-3 s apart) for 40 s, or
// SOAK_MINUTES (make soak). The schedule follows from the printed SOAK_SEED: the same
// seed gives the same faults, victims and durations. The invariants are
// TestNemesisFaults's, checked after every fault and at the end.
func TestNemesisSchedule(t *testing.T) {
	seed, length := nemesisSchedule(t, 40*time.Second)
	fmt.Printf("nemesis schedule: SOAK_SEED=%d SOAK_MINUTES=%g\n", seed, length.Minutes())
	t.Logf("SOAK_SEED=%d (length %v): rerun with SOAK_SEED=%d SOAK_MINUTES=%g make soak", seed, length, seed, length.Minutes())
	rng := rand.New(rand.NewSource(seed))
	c := startNemesisCluster(t, 3, true)
	c.startLoad()
	waitFor(t, 60*time.Second, "200 acks before the first fault", func() bool { return c.led.count() >= 200 })
	all := append(append(append([]nemesisFault(nil), nemesisFaults...), processFaults...), clockFaults...)
	injected := map[string]int{}
	var slowestHeal time.Duration
	end := time.Now().Add(length)
	for i := 0; time.Now().Before(end); i++ {
		f := all[rng.Intn(len(all))]
		v := rng.Intn(len(c.nodes))
		hold := time.Duration(1000+rng.Intn(5000)) * time.Millisecond
		gap := time.Duration(500+rng.Intn(2500)) * time.Millisecond
		t.Logf("fault %d: %s on n%d for %v at %.1fs (%s UTC)", i, f.name, v+1, hold, c.led.hist.Now().Seconds(), time.Now().UTC().Format("15:04:05.000"))
		span := faultSpan{name: f.name, node: v + 1, t1: c.led.hist.Now()}
		c.inject(f, v)
		injected[f.name]++
		time.Sleep(hold)
		span.t2 = c.led.hist.Now()
		c.heal()
		c.healProcesses()
		span.healed = c.waitHealed(fmt.Sprintf("after fault %d (%s on n%d)", i, f.name, v+1))
		slowestHeal = max(slowestHeal, span.healed)
		c.faults = append(c.faults, span)
		time.Sleep(gap)
	}
	// Before the history check, which takes minutes on a soak's
	// history: what the slowest attempts waited through, and the logs to
	// read it in, are kept whatever the check says.
	c.beforeVerify = func() {
		c.stalls.report()
		c.logSlowest(c.led.hist.Ops(), 3)
		c.keepNodeLogs()
	}
	counts := c.finish()
	var names []string
	total := 0
	for k, n := range injected {
		names = append(names, fmt.Sprintf("%s=%d", k, n))
		total += n
	}
	sort.Strings(names)
	t.Logf("soak summary: seed %d, %v, %d faults {%s}, slowest heal %v; %v; acked messages %d; raw first-send duplicates %d",
		seed, length, total, strings.Join(names, " "), slowestHeal.Round(10*time.Millisecond), counts, c.led.count(), c.internalDups.Load())
	if fail := t.Failed(); !fail {
		t.Logf("0 invariant violations")
	}
}

// stallWatch measures how late a goroutine of the test process wakes from
// a 50 ms sleep: the test process runs the clients, whose latencies the
// soak reports, and the proxies every node reaches the store through, so a
// stall of it is a slow answer and a store outage for every node at once
// (docs/TESTING.md "Soak", run 8).
type stallWatch struct {
	t     *testing.T
	mu    sync.Mutex
	worst time.Duration
	at    time.Time
	over  int // wakes more than 1 s late
}

func watchStalls(t *testing.T) *stallWatch {
	w := &stallWatch{t: t}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := 50 * time.Millisecond
		for {
			before := time.Now()
			select {
			case <-stop:
				return
			case <-time.After(tick):
			}
			late := time.Since(before) - tick
			w.mu.Lock()
			if late > w.worst {
				w.worst, w.at = late, before
			}
			if late > time.Second {
				w.over++
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return w
}

// report logs the worst stall and the heap the collector had to mark.
func (w *stallWatch) report() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Logf("test process: worst wake-up %v late (a 50 ms sleep begun %s UTC), %d wake-ups over 1 s late; heap in use %d MB, %d collections, %v paused in all",
		w.worst.Round(time.Millisecond), w.at.UTC().Format("15:04:05.000"), w.over, ms.HeapAlloc>>20, ms.NumGC, time.Duration(ms.PauseTotalNs).Round(time.Millisecond))
}

// logSlowest logs the n slowest acked send attempts: who sent (SDK or raw
// JSON, and then the node asked), when (history clock) and the faults that
// overlapped the attempt, so that a soak's "slowest acked attempt" comes with
// what it waited through.
func (c *nemesisCluster) logSlowest(ops []history.Op, n int) {
	var acked []history.Op
	for _, o := range ops {
		if o.Kind == history.Send && o.Outcome == history.OK {
			acked = append(acked, o)
		}
	}
	sort.Slice(acked, func(i, j int) bool { return acked[i].Return-acked[i].Call > acked[j].Return-acked[j].Call })
	for i, o := range acked[:min(n, len(acked))] {
		who := fmt.Sprintf("SDK client %d", o.Client)
		if rawClient(o.Client) {
			c.rawMu.Lock()
			r := c.raw[xxhash.Sum64String(o.Key[strings.IndexByte(o.Key, '/')+1:])]
			c.rawMu.Unlock()
			who = fmt.Sprintf("raw JSON client %d via %s", o.Client, c.nodes[r.node].name)
		}
		var during []string
		for _, f := range c.faults {
			if end := f.t2 + f.healed; f.t1 < o.Return && end > o.Call {
				during = append(during, fmt.Sprintf("%s on n%d %.1f-%.1fs healed %.1fs", f.name, f.node, f.t1.Seconds(), f.t2.Seconds(), end.Seconds()))
			}
		}
		c.t.Logf("slowest acked attempt %d: %v, %s, conv %s key %s seq %d, %.1f-%.1fs (%s-%s UTC); faults overlapping (start to healed): %s",
			i+1, (o.Return - o.Call).Round(time.Millisecond), who, o.Conv, o.Key, o.Seq, o.Call.Seconds(), o.Return.Seconds(),
			c.wall(o.Call), c.wall(o.Return), strings.Join(during, "; "))
	}
}

// wall is the UTC wall-clock time of history time h, to find an attempt in
// the node logs.
func (c *nemesisCluster) wall(h time.Duration) string {
	return time.Now().Add(h - c.led.hist.Now()).UTC().Format("15:04:05.000")
}

// keepNodeLogs writes every node's whole output (all its restarts) to the
// artifacts directory, pass or fail, so that a soak's slowest attempt can be
// read against what the nodes logged at the time.
func (c *nemesisCluster) keepNodeLogs() {
	dir := historyArtifacts()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Logf("node logs not kept: %v", err)
		return
	}
	for _, p := range c.nodes {
		f := filepath.Join(dir, c.t.Name()+"-"+p.name+".log")
		if err := os.WriteFile(f, []byte(p.Output()), 0o644); err != nil {
			c.t.Logf("node logs not kept: %v", err)
			return
		}
		c.t.Logf("node log: %s", f)
	}
}

var _ = http.DefaultClient
