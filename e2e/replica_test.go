package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// replicaDB is the database the node uses on a replicated pair.
const replicaDB = "sequencer"

// replicaPair starts a primary and a streaming standby of it, creates
// replicaDB on the primary, and returns both with the node's multi-host DSN
// (both hosts, target_session_attrs=read-write). With sync the primary
// waits for the standby's flush before a commit returns
// (synchronous_standby_names='*', synchronous_commit=on); without it the
// standby is asynchronous. The standby itself names no synchronous standby:
// once promoted it is the only server and must not wait for a peer.
func replicaPair(t *testing.T, sync bool) (primary, standby *pgtest.Node, dsn string) {
	t.Helper()
	var settings []string
	if sync {
		settings = []string{"synchronous_standby_names=*", "synchronous_commit=on"}
	} else {
		settings = []string{"synchronous_standby_names=", "synchronous_commit=on"}
	}
	primary = pgtest.StartPrimary(t, settings...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	standby = primary.StartStandby(t, "synchronous_standby_names=")
	if err := primary.WaitStreaming(ctx, 1); err != nil {
		t.Fatalf("standby does not stream: %v\n%s", err, standby.Log())
	}
	// Only now: with a synchronous standby named, a commit waits for it.
	if err := primary.Exec(ctx, "CREATE DATABASE "+replicaDB); err != nil {
		t.Fatalf("create database: %v", err)
	}
	if sync {
		// The standby must be the synchronous one before the load starts.
		waitFor(t, 30*time.Second, "the standby to be synchronous", func() bool {
			var st string
			err := primary.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication", &st)
			return err == nil && st == "sync"
		})
	}
	dsn = fmt.Sprintf("postgres://postgres@%s,%s/%s?sslmode=disable&target_session_attrs=read-write",
		primary.Host(), standby.Host(), replicaDB)
	return primary, standby, dsn
}

// probe sends one new message every few milliseconds to its own
// conversation (resending on retryable errors) and remembers when each was
// acked: the longest pause between two acks is the outage a continuously
// sending client saw.
type probe struct {
	mu   sync.Mutex
	acks []time.Time
}

func (p *probe) run(ctx context.Context, c sequencerv1connect.SequencerServiceClient, led *ledger, stop <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond): // the probe's send rate
		}
		cid := fmt.Sprintf("probe-%d", i)
		for {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			call := led.hist.Now()
			resp, err := send(rctx, c, "probe", 42, cid, nil)
			cancel()
			if err != nil {
				led.attempt(-2, "probe", 42, cid, call, 0, 0, false, err)
			}
			if err == nil {
				led.attempt(-2, "probe", 42, cid, call, resp.MsgId, resp.Seq, resp.Duplicate, nil)
				p.mu.Lock()
				p.acks = append(p.acks, time.Now())
				p.mu.Unlock()
				break
			}
			if !retryableCode(err) || ctx.Err() != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond): // client backoff between resends
			}
		}
	}
}

// longestPauseSince is the longest pause between two consecutive acks of
// the probe where the second came after t, and when that second ack came.
func (p *probe) longestPauseSince(t time.Time) (gap time.Duration, end time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 1; i < len(p.acks); i++ {
		if d := p.acks[i].Sub(p.acks[i-1]); p.acks[i].After(t) && d > gap {
			gap, end = d, p.acks[i]
		}
	}
	return gap, end
}

// ackedAfter reports whether the probe got an ack after t.
func (p *probe) ackedAfter(t time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acks) > 0 && p.acks[len(p.acks)-1].After(t)
}

// TestPostgresPrimarySwitchSync runs load through the node(s) whose store
// is a primary with a synchronous standby behind a multi-host DSN, loses the
// primary, promotes the standby, and checks: sends recover without
// restarting any node, every acked message is on the new primary, and every
// conversation's seqs are 1..head. Three ways to lose the primary:
//   - kill9: SIGKILL to the postmaster and its backends (a crashed host:
//     connections are reset at once); one node;
//   - frozen: SIGSTOP to the primary's postmaster only: new dials hang, but
//     the established sessions keep running on the old data (reads answer,
//     commits wait for the gone standby), so the nodes must stop using them
//     once the new primary is reached; two nodes in cluster mode, so
//     membership heartbeats and partition fences ride through the switch
//     too;
//   - paused: SIGSTOP to every process of the primary (a paused VM or a host
//     cut off without resets: connections and new dials hang); two nodes in
//     cluster mode.
func TestPostgresPrimarySwitchSync(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cluster bool
		lose    func(primary *pgtest.Node)
	}{
		{"kill9", false, func(p *pgtest.Node) { p.Kill9() }},
		{"frozen", true, func(p *pgtest.Node) { p.Freeze() }},
		{"paused", true, func(p *pgtest.Node) { p.FreezeAll() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary, standby, dsn := replicaPair(t, true)
			defer primary.Kill9() // a frozen primary never comes back
			var nodes []*proc
			if tc.cluster {
				nodes = append(nodes,
					startNode(t, "a", "--store", dsn, "--cluster-listen", freeAddr(t), "--node-id", "a"),
					startNode(t, "b", "--store", dsn, "--cluster-listen", freeAddr(t), "--node-id", "b"))
			} else {
				nodes = append(nodes, startNode(t, "node", "--store", dsn))
			}
			switchPrimary(t, nodes, primary, standby, tc.lose)
		})
	}
}

// switchPrimary runs load through nodes, loses primary with lose, promotes
// standby and checks the outcome (see TestPostgresPrimarySwitchSync).
func switchPrimary(t *testing.T, nodes []*proc, primary, standby *pgtest.Node, lose func(*pgtest.Node)) {
	convs := convNames(200)
	l := &load{convs: convs, clients: 32, led: newLedger(),
		clientFor: func(i int) sequencerv1connect.SequencerServiceClient { return nodes[i%len(nodes)].grpcClient() }}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { l.run(ctx, t, stop); close(done) }()
	pr := &probe{}
	probeDone := make(chan struct{})
	go func() { pr.run(ctx, nodes[0].grpcClient(), l.led, stop); close(probeDone) }()
	waitFor(t, 60*time.Second, "1000 acks before losing the primary", func() bool { return l.led.count() >= 1000 })

	lost := time.Now()
	lose(primary)
	if err := standby.Promote(); err != nil {
		t.Fatalf("promote: %v\n%s", err, standby.Log())
	}
	promoted := time.Now()
	before := l.led.count()
	waitFor(t, 90*time.Second, "the load to make progress on the new primary", func() bool { return l.led.count() >= before+1000 })
	waitFor(t, 60*time.Second, "the probe to be acked on the new primary", func() bool { return pr.ackedAfter(promoted) })
	close(stop)
	<-done
	<-probeDone
	if l.errs.Load() != 0 {
		t.Fatalf("%d sends failed for good", l.errs.Load())
	}
	gap, end := pr.longestPauseSince(lost)
	t.Logf("primary lost -> standby promoted: %v; the probe's longest pause between two acks since the loss: %v, ending %v after the promotion; load retried %d times",
		promoted.Sub(lost).Round(time.Millisecond), gap.Round(time.Millisecond), end.Sub(promoted).Round(time.Millisecond), l.retries.Load())

	// Sends keep working on the same processes: each conversation
	// continues at head+1 of the new primary.
	st := openStore(t, standby.DSN(replicaDB))
	for i, conv := range convs[:20] {
		head, err := st.LoadHead(context.Background(), conv)
		if err != nil {
			t.Fatal(err)
		}
		cid := "after-switch-" + conv
		call := l.led.hist.Now()
		resp, err := send(context.Background(), nodes[i%len(nodes)].grpcClient(), conv, 7, cid, nil)
		if err != nil {
			t.Fatalf("send after the switch: %v", err)
		}
		l.led.attempt(-3, conv, 7, cid, call, resp.MsgId, resp.Seq, resp.Duplicate, nil)
		if resp.Seq != head+1 {
			t.Fatalf("conv %s: after the switch got seq %d, want head+1 = %d", conv, resp.Seq, head+1)
		}
	}
	for _, n := range nodes {
		if err := n.term(30 * time.Second); err != nil {
			t.Fatalf("SIGTERM %s: %v", n.name, err)
		}
	}
	l.led.verify(t, st, append(convs, "probe"))
}

// metricsText is the node's /metrics page.
func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricValue reads one unlabelled counter or gauge from /metrics (0 when
// absent).
func metricValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(metricsText(t, addr), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("/metrics: %s: %v", line, err)
			}
			return v
		}
	}
	return 0
}
