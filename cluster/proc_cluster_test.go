package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/persist/postgres"
	"github.com/sequencer-im/sequencer/ring"
)

// procCluster is a cluster of node child processes on one fresh database.
type procCluster struct {
	t     *testing.T
	dsn   string
	store *postgres.Store
	mu    sync.Mutex
	nodes map[string]*child // running (not left, not killed)
	http  *http.Client
}

func newProcCluster(t *testing.T) *procCluster {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &procCluster{t: t, dsn: dsn, store: st, nodes: map[string]*child{},
		// A client gives up on a node that does not answer (frozen) and
		// resends elsewhere with the same client_msg_id.
		http: &http.Client{Timeout: 5 * time.Second}}
}

func (pc *procCluster) start(id string) *child {
	c := startChild(pc.t, id, "node", "SEQUENCER_TEST_DSN="+pc.dsn, "SEQUENCER_TEST_NODE="+id)
	pc.mu.Lock()
	pc.nodes[id] = c
	pc.mu.Unlock()
	return c
}

func (pc *procCluster) running() []*child {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	var cs []*child
	for _, c := range pc.nodes {
		cs = append(cs, c)
	}
	return cs
}

// leave makes node id leave gracefully (it finishes in-flight sends, hands
// off and removes itself), then ends it.
func (pc *procCluster) leave(id string) {
	pc.mu.Lock()
	c := pc.nodes[id]
	delete(pc.nodes, id)
	pc.mu.Unlock()
	resp, err := (&http.Client{Timeout: time.Minute}).Post("http://"+c.addr+"/leave", "", nil)
	if err != nil {
		pc.t.Fatalf("leave %s: %v", id, err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		pc.t.Fatalf("leave %s: %s\n%s", id, resp.Status, c.log())
	}
	c.stop()
}

func (pc *procCluster) kill(id string) {
	pc.mu.Lock()
	c := pc.nodes[id]
	delete(pc.nodes, id)
	pc.mu.Unlock()
	c.kill()
}

// settled reports whether every partition is held, at a live member's
// incarnation, by the owner the current view's ring names, and every
// running node is in the view.
func (pc *procCluster) settled() (bool, string) {
	v, err := pc.store.Cluster().View(context.Background())
	if err != nil {
		return false, err.Error()
	}
	want := pc.running()
	if len(v.Members) != len(want) {
		return false, fmt.Sprintf("%d members, %d nodes running", len(v.Members), len(want))
	}
	r, err := ring.New(v.RingNodes(), ring.Config{})
	if err != nil {
		return false, err.Error()
	}
	for p := range r.Partitions() {
		o, _ := r.Owner(uint32(p))
		m, _ := v.Member(o.NodeID)
		l, ok := v.Lease(uint32(p))
		if !ok || l.Owner != m.Incarnation {
			return false, fmt.Sprintf("partition %d: lease %+v, ring owner %s (%s)", p, l, o.NodeID, m.Incarnation)
		}
	}
	return true, ""
}

func (pc *procCluster) waitSettled(within time.Duration) {
	pc.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := pc.settled()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			pc.t.Fatalf("cluster not settled after %v: %s", within, why)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}
}

type acked struct {
	conv  string
	msgID uint64
	seq   uint64
}

// send sends one message through node c, resending (same client_msg_id) on
// retryable errors as the client SDK does, until it is acked or within
// ends.
func (pc *procCluster) send(pick func() *child, conv, clientID string, within time.Duration) (res sendReply, resends int, err error) {
	deadline := time.Now().Add(within)
	var last sendReply
	for attempt := 0; ; attempt++ {
		c := pick()
		body, _ := json.Marshal(map[string]string{"convId": conv, "fromUid": "7", "clientMsgId": clientID})
		resp, err := pc.http.Post("http://"+c.addr+"/send", "application/json", bytes.NewReader(body))
		if err == nil {
			last = sendReply{}
			err = json.NewDecoder(resp.Body).Decode(&last)
			resp.Body.Close()
			if err == nil && last.Code == "" {
				return last, attempt, nil
			}
			if err == nil && last.Code != sequencer.CodeUnavailable.String() && last.Code != sequencer.CodeResourceExhausted.String() {
				return last, attempt, fmt.Errorf("send %s/%s via %s: non-retryable %s: %s", conv, clientID, c.name, last.Code, last.Error)
			}
		}
		// A node that left or was killed refuses connections: pick again.
		if time.Now().After(deadline) {
			return last, attempt, fmt.Errorf("send %s/%s not acked within %v: last %v %+v", conv, clientID, within, err, last)
		}
		time.Sleep(time.Duration(10+attempt*10) * time.Millisecond) // client backoff
	}
}

// TestProcessCluster runs nodes as separate processes (each with its own
// connect transport on a random port, its own actor.Conversations and worker id) on
// one database, and sends through random nodes while a node leaves
// gracefully, a new one joins and one is killed. Every acked message is
// stored at its seq, seqs are 1..head in every conversation, and no msg_id
// or resend key repeats.
func TestProcessCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several node processes")
	}
	pc := newProcCluster(t)
	for _, id := range []string{"n1", "n2", "n3"} {
		pc.start(id)
	}
	pc.waitSettled(30 * time.Second)

	// Route answers the ring owner, its API address and the lease epoch.
	var rt sequencer.Route
	resp, err := pc.http.Get("http://" + pc.nodes["n1"].addr + "/route?conv=g:route")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&rt)
	resp.Body.Close()
	if owner := pc.nodes[rt.NodeID]; owner == nil || owner.addr != rt.Address || rt.Epoch == 0 || rt.MembershipVersion == 0 {
		t.Fatalf("route %+v does not name a running owner with its API address", rt)
	}

	// Senders run through every step: a graceful leave, a join, a crash.
	const convs, senders = 24, 4
	var (
		mu      sync.Mutex
		acks    = map[string]acked{} // by client_msg_id
		errs    []error
		retries int
		wg      sync.WaitGroup
		stop    = make(chan struct{})
	)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acks)
	}
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(s), 7))
			pick := func() *child {
				cs := pc.running()
				return cs[rng.IntN(len(cs))]
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				conv := fmt.Sprintf("g:%d", rng.IntN(convs))
				id := fmt.Sprintf("s%d-%d", s, i)
				res, tries, err := pc.send(pick, conv, id, 30*time.Second)
				mu.Lock()
				retries += tries
				if err != nil {
					errs = append(errs, err)
				} else {
					acks[id] = acked{conv, res.MsgID, res.Seq}
				}
				mu.Unlock()
			}
		}()
	}
	waitAcks := func(n int, what string) {
		deadline := time.Now().Add(60 * time.Second)
		for target := count() + n; count() < target; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: fewer than %d sends acked in 60s", what, n)
			}
			time.Sleep(10 * time.Millisecond) // polling a condition
		}
	}
	waitAcks(60, "3 nodes")
	start := time.Now()
	pc.leave("n2")
	t.Logf("graceful leave of n2 (handoff of its partitions, in-flight sends finished) took %v", time.Since(start).Round(time.Millisecond))
	pc.waitSettled(30 * time.Second)
	t.Logf("n2's partitions held by their new owners %v after the leave began", time.Since(start).Round(time.Millisecond))
	waitAcks(40, "after n2 left")
	start = time.Now()
	pc.start("n4")
	waitAcks(40, "while n4 joins")
	pc.waitSettled(30 * time.Second)
	t.Logf("n4 started and holds its share %v after its process started", time.Since(start).Round(time.Millisecond))
	waitAcks(40, "after n4 joined")
	start = time.Now()
	pc.kill("n3")
	waitAcks(20, "after n3 was killed")
	pc.waitSettled(30 * time.Second)
	t.Logf("n3 killed: its partitions taken over %v later (member TTL 2s)", time.Since(start).Round(time.Millisecond))
	waitAcks(40, "after takeover")
	close(stop)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	t.Logf("%d sends acked, %d resends after retryable errors", len(acks), retries)

	pc.checkStored(acks)
}

// TestProcessClusterZombie freezes a node (SIGSTOP) past its membership TTL
// while sends run: the others take its partitions over (epoch bump), and
// when it resumes (SIGCONT) its stale writes are fenced, it steps down and
// rejoins as a new incarnation; no acked message is lost or doubled.
func TestProcessClusterZombie(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several node processes")
	}
	pc := newProcCluster(t)
	for _, id := range []string{"z1", "z2", "z3"} {
		pc.start(id)
	}
	pc.waitSettled(30 * time.Second)
	ctx := context.Background()
	before, err := pc.store.Cluster().View(ctx)
	if err != nil {
		t.Fatal(err)
	}
	z2, _ := before.Member("z2")

	var (
		mu   sync.Mutex
		acks = map[string]acked{}
		errs []error
		wg   sync.WaitGroup
		stop = make(chan struct{})
	)
	for s := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(s), 11))
			pick := func() *child {
				cs := pc.running()
				return cs[rng.IntN(len(cs))]
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				conv := fmt.Sprintf("z:%d", rng.IntN(16))
				id := fmt.Sprintf("z%d-%d", s, i)
				res, _, err := pc.send(pick, conv, id, 40*time.Second)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					acks[id] = acked{conv, res.MsgID, res.Seq}
				}
				mu.Unlock()
			}
		}()
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acks)
	}
	t0 := time.Now()
	waitFor := func(what string, cond func() bool) {
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond) // polling a condition
		}
		t.Logf("%6.2fs %s", time.Since(t0).Seconds(), what)
	}
	n := count()
	waitFor("sends before the freeze", func() bool { return count() >= n+50 })

	// Clients stop picking the frozen node (its /readyz would fail; a
	// request to it times out after 5 s and is resent elsewhere).
	pc.mu.Lock()
	zombie := pc.nodes["z2"]
	delete(pc.nodes, "z2")
	pc.mu.Unlock()
	zombie.cmd.Process.Signal(syscall.SIGSTOP)
	// Its member row expires (TTL 2 s) and the others take its partitions.
	waitFor("z2's partitions taken over", func() bool {
		v, err := pc.store.Cluster().View(ctx)
		if err != nil || v.Live(z2.Incarnation) {
			return false
		}
		for _, l := range v.Leases {
			if l.Owner == z2.Incarnation {
				return false
			}
		}
		return true
	})
	n = count()
	waitFor("sends while z2 is frozen", func() bool { return count() >= n+30 })
	zombie.cmd.Process.Signal(syscall.SIGCONT)
	waitFor("z2 back as a new incarnation", func() bool {
		v, err := pc.store.Cluster().View(ctx)
		if err != nil {
			return false
		}
		m, ok := v.Member("z2")
		return ok && m.Incarnation != z2.Incarnation
	})
	pc.mu.Lock()
	pc.nodes["z2"] = zombie
	pc.mu.Unlock()
	pc.waitSettled(30 * time.Second)
	n = count()
	waitFor("sends after z2 rejoined", func() bool { return count() >= n+50 })
	close(stop)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if !strings.Contains(zombie.log(), "stepping down") {
		t.Errorf("z2 did not step down after resuming:\n%s", zombie.log())
	}
	pc.checkStored(acks)
}

// checkStored asserts that every acked send is stored at its seq with its
// msg_id, that every conversation's seqs are 1..head, and that nothing but
// acked sends was stored (every send was resent until acked).
func (pc *procCluster) checkStored(acks map[string]acked) {
	t := pc.t
	ctx := context.Background()
	rows, err := pc.store.Pool().Query(ctx, `SELECT conv_id, seq, msg_id, client_msg_id FROM im_message ORDER BY conv_id, seq`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		conv        string
		seq, msgID  int64
		clientMsgID string
	}
	stored, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.conv, &x.seq, &x.msgID, &x.clientMsgID)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	byClient := map[string]row{}
	next := map[string]int64{}
	for _, r := range stored {
		if r.seq != next[r.conv]+1 {
			t.Fatalf("conversation %s: seq %d after %d (not contiguous)", r.conv, r.seq, next[r.conv])
		}
		next[r.conv] = r.seq
		byClient[r.clientMsgID] = r
	}
	for id, a := range acks {
		r, ok := byClient[id]
		if !ok || r.conv != a.conv || uint64(r.seq) != a.seq || uint64(r.msgID) != a.msgID {
			t.Fatalf("send %s acked as %+v, stored %+v (found %v)", id, a, r, ok)
		}
	}
	if len(stored) != len(acks) {
		t.Fatalf("%d rows stored for %d acked sends (every send was resent until acked)", len(stored), len(acks))
	}
	for conv, head := range next {
		h, err := pc.store.LoadHead(ctx, conv)
		if err != nil || int64(h) != head {
			t.Fatalf("conversation %s head %d (%v), rows end at %d", conv, h, err, head)
		}
	}
	t.Logf("%d sends acked over %d conversations; stored rows match", len(acks), len(next))
}

// TestProcessForwardLatency measures one sender's send latency through the
// owner and through another node (forwarded over the connect transport). It only runs with
// SEQUENCER_CLUSTER_MEASURE=1:
//
//	SEQUENCER_CLUSTER_MEASURE=1 go test -run TestProcessForwardLatency -v ./cluster/
func TestProcessForwardLatency(t *testing.T) {
	if os.Getenv("SEQUENCER_CLUSTER_MEASURE") == "" {
		t.Skip("measurement: set SEQUENCER_CLUSTER_MEASURE=1")
	}
	pc := newProcCluster(t)
	pc.start("m1")
	pc.start("m2")
	pc.waitSettled(30 * time.Second)
	const n = 400
	measure := func(via func(conv string) *child) []time.Duration {
		var ds []time.Duration
		for i := range n {
			conv := fmt.Sprintf("m:%d", i%8)
			c := via(conv)
			start := time.Now()
			if _, _, err := pc.send(func() *child { return c }, conv, fmt.Sprintf("%s-%d-%d", c.name, i, time.Now().UnixNano()), 10*time.Second); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		return ds
	}
	owner := func(conv string) *child {
		resp, err := pc.http.Get("http://" + pc.nodes["m1"].addr + "/route?conv=" + conv)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var rt sequencer.Route
		json.NewDecoder(resp.Body).Decode(&rt)
		return pc.nodes[rt.NodeID]
	}
	other := func(conv string) *child {
		if o := owner(conv); o.name == "m1" {
			return pc.nodes["m2"]
		}
		return pc.nodes["m1"]
	}
	direct := measure(owner)
	forwarded := measure(other)
	q := func(ds []time.Duration, f float64) time.Duration {
		return ds[int(f*float64(len(ds)-1))].Round(10 * time.Microsecond)
	}
	t.Logf("%d sequential sends, 8 conversations, 2 nodes", n)
	t.Logf("via the owner:   p50 %v  p90 %v  p99 %v", q(direct, .5), q(direct, .9), q(direct, .99))
	t.Logf("via other node:  p50 %v  p90 %v  p99 %v", q(forwarded, .5), q(forwarded, .9), q(forwarded, .99))
}
