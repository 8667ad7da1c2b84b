package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sequencer-im/sequencer/client"
	"github.com/sequencer-im/sequencer/internal/history"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// The availability runs of issue 30: one kind of client at a time (raw JSON
// clients that pick a random node per attempt and back off from 50 ms,
// doubling; or SDK clients with their defaults), 32 closed-loop clients over
// 300 conversations, each network fault of nemesisFaults on n1 alone. Every
// attempt is traced (node, code, time), so the report says where the
// clients' sends waited. The invariants are the nemesis's (no send given up,
// the history linearizable against the store); the rates are results of a
// run for docs/TESTING.md, never asserted.

// availClients is how many closed-loop clients an availability run has.
const availClients = 32

// attemptTrace is one attempt of an availability client.
type attemptTrace struct {
	node       string // "" for the SDK (it picks)
	call, ret  time.Duration
	code       string // "" when acked
	msg        string // the error's message (numbers masked) when it failed
	clientKind string
}

// availLoad is the closed-loop load of an availability run.
type availLoad struct {
	c      *nemesisCluster
	raw    bool
	mu     sync.Mutex
	trace  []attemptTrace
	stop   chan struct{}
	done   sync.WaitGroup
	gaveUp int
}

func (c *nemesisCluster) startAvailLoad(raw bool) *availLoad {
	c.led = newLedger()
	l := &availLoad{c: c, raw: raw, stop: make(chan struct{})}
	for i := 0; i < availClients; i++ {
		l.done.Add(1)
		go func(i int) { defer l.done.Done(); l.run(i) }(i)
	}
	return l
}

func (l *availLoad) run(i int) {
	rng := rand.New(rand.NewSource(int64(31 + i)))
	from := uint64(2000 + i)
	for j := 0; ; j++ {
		select {
		case <-l.stop:
			return
		default:
		}
		conv := l.c.convs[rng.Intn(len(l.c.convs))]
		cid := fmt.Sprintf("a%d-m%d", i, j)
		if !l.sendUntilAcked(rng, i, conv, from, cid) {
			l.mu.Lock()
			l.gaveUp++
			l.mu.Unlock()
		}
	}
}

// sendUntilAcked sends one message until acked, as the clients do:
// raw clients back off 50 ms, doubling up to 1 s, and pick a random node
// per attempt; SDK clients resend on the SDK's own answers.
func (l *availLoad) sendUntilAcked(rng *rand.Rand, i int, conv string, from uint64, cid string) bool {
	backoff := 50 * time.Millisecond
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		call := l.c.led.hist.Now()
		var msgID, seq uint64
		var err error
		var node string
		var dup bool
		if l.raw {
			p := l.c.nodes[rng.Intn(len(l.c.nodes))]
			node = p.name
			resp, serr := rawSend(ctx, p.Addr, conv, from, cid, []byte(cid))
			if err = serr; serr == nil {
				msgID, seq, dup = resp.MsgId, resp.Seq, resp.Duplicate
			}
		} else {
			res, serr := l.c.sdk.Send(ctx, client.SendRequest{ConvID: conv, FromUID: from, ClientMsgID: cid, Body: []byte(cid)})
			if err = serr; serr == nil {
				msgID, seq = res.MsgID, res.Seq
			}
		}
		cancel()
		code, outcome := sendOutcome(err)
		kind := "sdk"
		if l.raw {
			kind = "raw"
		}
		ret := l.c.led.hist.Now()
		var msg string
		if err != nil {
			msg = err.Error()
		}
		l.c.led.hist.Add(history.Op{Kind: history.Send, Conv: conv, Node: node, Client: i, Key: historyKey(from, cid),
			Call: call, Return: ret, Outcome: outcome, Code: code, Msg: msg, Seq: seq, MsgID: msgID, Duplicate: dup})
		l.mu.Lock()
		l.trace = append(l.trace, attemptTrace{node: node, call: call, ret: ret, code: code, msg: traceMsg(err), clientKind: kind})
		l.mu.Unlock()
		if err == nil {
			l.c.led.record(ack{conv: conv, from: from, cid: cid, msgID: msgID, seq: seq})
			return true
		}
		if c := connect.CodeOf(err); !retryableCode(err) && c != connect.CodeInternal {
			if !l.raw || outcome != history.Unknown {
				return false
			}
		}
		select {
		case <-l.stop:
			// Still resend until acked: the history must not end on an
			// unknown outcome that a retry would settle.
		default:
		}
		time.Sleep(backoff) // the client's own backoff (the load's, not settling)
		backoff = min(2*backoff, time.Second)
	}
	return false
}

// finish stops the load and checks the invariants.
func (l *availLoad) finish(t *testing.T) {
	close(l.stop)
	waited := make(chan struct{})
	go func() { l.done.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(4 * time.Minute):
		t.Fatalf("clients still waiting for acks 4 minutes after the load stopped")
	}
	if l.gaveUp != 0 {
		t.Errorf("%d sends were never acked (clients resend until acked)", l.gaveUp)
	}
	l.c.led.verify(t, openStore(t, l.c.dsn), l.c.convs)
}

// availRow is one fault of an availability run, measured.
type availRow struct {
	fault, clients      string
	hold                time.Duration
	before, during      float64 // acks/s: the 3 s before the cut; 2 s after it until the heal
	after2s             float64 // acks/s in the 2 s after the heal
	slowest             time.Duration
	fullRateAfter       time.Duration // from the heal until a 500 ms bucket reaches 90% of before
	settled             float64       // acks/s from 3 s to 6 s after the heal (before the next cut)
	settledAfter        time.Duration // from the heal until a 500 ms bucket reaches 90% of settled
	waits               string        // where the attempts during the cut waited, per node
	healed              time.Duration
	cutNodeP50, cutNode time.Duration // the cut node's failed attempts: p50 and max time
}

func (r availRow) String() string {
	within := func(d time.Duration) string {
		if d < 0 {
			return "not by the end of the run"
		}
		return fmt.Sprint(d)
	}
	return fmt.Sprintf("| %s | %s | %v | %.0f | %.0f | %.0f%% | %.0f | %v | %s | %.0f (%.0f%% of before) | %s | %s |", r.fault, r.clients, r.hold, r.before, r.during,
		100*r.during/max(r.before, 1), r.after2s, r.slowest.Round(time.Millisecond), within(r.fullRateAfter),
		r.settled, 100*r.settled/max(r.before, 1), within(r.settledAfter), r.waits)
}

// measureFault computes the row of one fault from the history and the
// traces: t1 the cut, t2 the heal.
func (l *availLoad) measureFault(name string, hold time.Duration, t0, t1, t2 time.Duration, healed time.Duration) availRow {
	ops := l.c.led.hist.Ops()
	r := availRow{fault: name, clients: map[bool]string{true: "raw", false: "SDK"}[l.raw], hold: hold, healed: healed}
	count := func(from, to time.Duration) int { return acksBetween(ops, from, to) }
	r.before = float64(count(t1-3*time.Second, t1)) / 3
	if d := t2 - t1 - 2*time.Second; d > 0 {
		r.during = float64(count(t1+2*time.Second, t2)) / d.Seconds()
	}
	r.after2s = float64(count(t2, t2+2*time.Second)) / 2
	for _, o := range ops {
		if o.Kind == history.Send && o.Outcome == history.OK && o.Return >= t1 && o.Call < t2+2*time.Second {
			r.slowest = max(r.slowest, o.Return-o.Call)
		}
	}
	// Full rate: the first 500 ms bucket after the heal at 90% of a
	// reference rate. Against the 3 s before the cut, the load's own drift
	// over the hold counts as a slow heal (the control row shows it);
	// against the rate it settles at 3-6 s after the heal, it does not, and
	// the settled rate beside the one before (and the control row's) says
	// whether the cluster came back to its full rate at all.
	r.settled = float64(count(t2+3*time.Second, t2+6*time.Second)) / 3
	firstAt := func(ref float64) time.Duration {
		for b := t2; b < t2+20*time.Second; b += 500 * time.Millisecond {
			if float64(count(b, b+500*time.Millisecond))*2 >= 0.9*ref {
				return b + 500*time.Millisecond - t2
			}
		}
		return -1
	}
	r.fullRateAfter = firstAt(r.before)
	r.settledAfter = firstAt(r.settled)
	// Where the attempts from 2 s after the cut to the heal waited.
	type agg struct {
		n, failed int
		d         []time.Duration
	}
	per := map[string]*agg{}
	l.mu.Lock()
	for _, a := range l.trace {
		if a.call < t1+2*time.Second || a.call >= t2 {
			continue
		}
		k := a.node
		if k == "" {
			k = "sdk"
		}
		g := per[k]
		if g == nil {
			g = &agg{}
			per[k] = g
		}
		g.n++
		if a.code != "" {
			g.failed++
		}
		g.d = append(g.d, a.ret-a.call)
	}
	l.mu.Unlock()
	var keys []string
	for k := range per {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		g := per[k]
		sort.Slice(g.d, func(i, j int) bool { return g.d[i] < g.d[j] })
		parts = append(parts, fmt.Sprintf("%s: %d attempts, %d failed, p50 %v p90 %v max %v", k, g.n, g.failed,
			g.d[len(g.d)/2].Round(time.Millisecond), g.d[len(g.d)*9/10].Round(time.Millisecond), g.d[len(g.d)-1].Round(time.Millisecond)))
	}
	r.waits = strings.Join(parts, "; ")
	return r
}

// acksBetween counts the acked sends of ops that returned in [from, to).
func acksBetween(ops []history.Op, from, to time.Duration) int {
	n := 0
	for _, o := range ops {
		if o.Kind == history.Send && o.Outcome == history.OK && o.Return >= from && o.Return < to {
			n++
		}
	}
	return n
}

// availControl is the control row: no fault, measured like the others (the
// same waits, the same columns). What it shows for "full rate after the
// heal" is what the measure itself gives on this machine: the load's own
// drift over the hold (the tables grow by the hold's sends) and its noise.
var availControl = nemesisFault{"none", func(*nemesisCluster, int) {}}

// availFaults is the faults of a run: AVAIL_FAULTS (comma-separated names;
// "none" is the control row) or every network fault of the nemesis, then
// the control row.
func availFaults(t *testing.T) []nemesisFault {
	names := os.Getenv("AVAIL_FAULTS")
	all := append(slices.Clone(nemesisFaults), availControl)
	if names == "" {
		return all
	}
	var out []nemesisFault
	for _, n := range strings.Split(names, ",") {
		found := false
		for _, f := range all {
			if f.name == n {
				out, found = append(out, f), true
			}
		}
		if !found {
			t.Fatalf("AVAIL_FAULTS: no fault %q", n)
		}
	}
	return out
}

// TestAvailability runs each network fault on n1 of 3 nodes for
// AVAIL_HOLD (default 5s; the runs: 5s and 30s) under 32 clients of
// one kind (AVAIL_CLIENTS raw, sdk or both; default both), over 300
// conversations, and writes the table to test-artifacts/availability-<hold>.md,
// each row's timeline around its heal to availability-<hold>-timeline.md
// (availability_timeline_test.go) and every node's log to
// availability-<hold>-<clients>-<node>.log. It asserts the invariants only; the figures go into docs/TESTING.md.
func TestAvailability(t *testing.T) {
	if os.Getenv("SEQUENCER_AVAILABILITY") == "" {
		t.Skip("the availability run (several minutes): SEQUENCER_AVAILABILITY=1 (make availability)")
	}
	hold := 5 * time.Second
	if s := os.Getenv("AVAIL_HOLD"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("AVAIL_HOLD=%q: %v", s, err)
		}
		hold = d
	}
	kinds := []bool{true, false}
	switch os.Getenv("AVAIL_CLIENTS") {
	case "raw":
		kinds = []bool{true}
	case "sdk":
		kinds = []bool{false}
	}
	var rows []availRow
	var timelines strings.Builder
	for _, raw := range kinds {
		// A subtest per kind of client: its cluster stops and its database
		// (about a million rows) is dropped before the next kind's cluster
		// starts on the same machine.
		kind := map[bool]string{true: "raw", false: "sdk"}[raw]
		t.Run(kind, func(t *testing.T) {
			c := startNemesisCluster(t, 3, false)
			c.convs = convNames(300)
			l := c.startAvailLoad(raw)
			sampler := startMetricSampler(c, c.led.hist.Now)
			pg := startPGSampler(c.dsn, c.led.hist.Now)
			waitFor(t, 60*time.Second, "300 acks before the first fault", func() bool { return c.led.count() >= 300 })
			type span struct {
				f              nemesisFault
				t0, t1, t2, hd time.Duration
			}
			var spans []span
			for _, f := range availFaults(t) {
				s := span{f: f, t0: c.led.hist.Now()}
				// A healthy stretch: its last 3 s are this row's "before"; its
				// first 6 s after the previous heal hold that row's settled rate.
				time.Sleep(6 * time.Second)
				s.t1 = c.led.hist.Now()
				t.Logf("fault %s on n1 for %v (%s clients)", f.name, hold, map[bool]string{true: "raw", false: "SDK"}[raw])
				c.inject(f, 0)
				time.Sleep(hold) // the fault lasts this long
				s.t2 = c.led.hist.Now()
				c.heal()
				s.hd = c.waitHealed("after " + f.name)
				spans = append(spans, s)
			}
			time.Sleep(8 * time.Second) // the stretch after the last heal that the last row measures
			sampler.close()
			pg.close()
			l.finish(t)
			for _, s := range spans {
				rows = append(rows, l.measureFault(s.f.name, hold, s.t0, s.t1, s.t2, s.hd))
				l.timeline(&timelines, sampler, pg, s.f.name, s.t1, s.t2)
			}
			saveNodeLogs(c, hold, kind)
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "availability: 3 nodes on one PostgreSQL, %d closed-loop clients of one kind over 300 conversations, member TTL %s, each fault on n1 for %v\n\n", availClients, nemesisTTL, hold)
	b.WriteString("| fault | clients | hold | acks/s before | acks/s from 2 s after the cut to the heal | kept | acks/s in the 2 s after the heal | slowest acked send | full rate after the heal (90% of before) | acks/s settled, 3-6 s after the heal | full rate after the heal (90% of settled) | attempts from 2 s after the cut to the heal, by node |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		b.WriteString(r.String() + "\n")
	}
	t.Log("\n" + b.String())
	dir := historyArtifacts()
	if err := os.MkdirAll(dir, 0o755); err == nil {
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("availability-%v.md", hold)), []byte(b.String()), 0o644)
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("availability-%v-timeline.md", hold)), []byte(timelines.String()), 0o644)
	}
}

// rawHTTP is the raw clients' HTTP client: net/http's defaults (it follows
// redirects, as curl -L, fetch and requests do), with room for every
// client's connection to every node.
var rawHTTP = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * availClients}}

// rawSend is a raw JSON client's Send: a POST of the Connect JSON form with
// a plain HTTP client, as a logic layer in any language sends it. A Connect
// error body is the server's answer (a wire error, like connect-go's); no
// answer (a transport error, a body that is neither) leaves the outcome
// unknown.
func rawSend(ctx context.Context, addr, conv string, from uint64, cid string, body []byte) (*sequencerv1.SendResponse, error) {
	in, err := protojson.Marshal(&sequencerv1.SendRequest{ConvId: conv, FromUid: from, ClientMsgId: cid, Body: body})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/sequencer.v1.SequencerService/Send", bytes.NewReader(in))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := rawHTTP.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, connect.NewError(connect.CodeDeadlineExceeded, err)
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	if resp.StatusCode == http.StatusOK {
		var res sequencerv1.SendResponse
		if err := protojson.Unmarshal(out, &res); err != nil {
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("answer %q: %w", out, err))
		}
		return &res, nil
	}
	var e struct{ Code, Message string }
	var code connect.Code
	if json.Unmarshal(out, &e) != nil || code.UnmarshalText([]byte(e.Code)) != nil {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("HTTP %d: %q", resp.StatusCode, out))
	}
	return nil, connect.NewWireError(code, errors.New(e.Message))
}
