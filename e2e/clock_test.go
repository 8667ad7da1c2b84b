package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/clock"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// Clock jumps: one node's wall clock is stepped while the others' are not
// (clock.Stepped, through the test-only SEQUENCER_TEST_CLOCK_OFFSET_FILE).
// Only the wall reading moves, as on a host whose clock NTP steps; Go's
// durations and timers follow the monotonic clock and do not see it.

// clockFault: node v's clock is off by off while the fault lasts; heal steps
// it back to the host's (the step that ends a clock that ran ahead is a
// step back).
func clockFault(name string, off time.Duration) nemesisFault {
	return nemesisFault{name, func(c *nemesisCluster, v int) { c.stepClock(v, off) }}
}

// clockFaults join the random schedules (TestNemesisSchedule) and are
// TestClockJumps's faults, in this order.
var clockFaults = []nemesisFault{
	clockFault("clock+5s", 5*time.Second),
	clockFault("clock-5s", -5*time.Second),
	clockFault("clock-30s", -30*time.Second),
}

// stepClock sets node v's clock offset to off and waits until the node
// logged the step (it re-reads the file every clock.TestOffsetPoll).
func (c *nemesisCluster) stepClock(v int, off time.Duration) {
	c.t.Helper()
	if c.clockFiles == nil {
		c.t.Fatal("stepClock: the nodes were started without stepped clocks")
	}
	if c.offsets[v] == off {
		return
	}
	p := c.nodes[v]
	before := strings.Count(p.Output(), "test clock stepped")
	if err := clock.WriteOffset(c.clockFiles[v], off.String()); err != nil {
		c.t.Fatal(err)
	}
	c.offsets[v] = off
	select {
	case <-p.done:
		return // a killed node reads the file when it restarts
	default:
	}
	waitFor(c.t, 10*time.Second, fmt.Sprintf("%s to step its clock to %v", p.name, off), func() bool {
		return strings.Count(p.Output(), "test clock stepped") > before
	})
}

// seen is one answer a client got at a time of the test (since the
// history's start).
type seen struct {
	at    time.Duration
	what  string // "ack", or the code and the message with numbers elided
	ready bool   // the node's /readyz answered 200 just before
}

// ownerProbe sends one message at a time to one node for conversations that node
// owns, resending each (same key) until acked, and records every answer: what
// a retrying client of that node's conversations sees.
type ownerProbe struct {
	c     *nemesisCluster
	node  int
	convs []string
	mu    sync.Mutex
	log   []seen
	stop  chan struct{}
	done  chan struct{}
}

// startProbe starts an ownerProbe of node v on up to 4 conversations it owns now.
func (c *nemesisCluster) startProbe(v int) *ownerProbe {
	pr := &ownerProbe{c: c, node: v, stop: make(chan struct{}), done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl := c.nodes[v].jsonClient()
	for _, conv := range c.convs {
		r, err := cl.Route(ctx, connect.NewRequest(&sequencerv1.RouteRequest{ConvId: conv}))
		if err == nil && r.Msg.NodeId == c.nodes[v].name {
			pr.convs = append(pr.convs, conv)
			if len(pr.convs) == 4 {
				break
			}
		}
	}
	if len(pr.convs) == 0 {
		c.t.Fatalf("%s owns none of the %d conversations", c.nodes[v].name, len(c.convs))
	}
	go pr.run()
	c.t.Cleanup(pr.halt)
	return pr
}

// ownerProbeClient is the probe's client number in the history.
const ownerProbeClient = 10000

func (pr *ownerProbe) run() {
	defer close(pr.done)
	const from = 99000
	p := pr.c.nodes[pr.node]
	for k := 0; ; k++ {
		conv := pr.convs[k%len(pr.convs)]
		cid := fmt.Sprintf("probe-%d", k)
		for {
			select {
			case <-pr.stop:
				// A last attempt whose outcome is unknown stays in the
				// history as such.
				return
			default:
			}
			code, _ := httpGet("http://" + p.Addr + "/readyz")
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			call := pr.c.led.hist.Now()
			resp, err := send(ctx, p.jsonClient(), conv, from, cid, []byte(cid))
			cancel()
			var msgID, seq uint64
			var dup bool
			if err == nil {
				msgID, seq, dup = resp.MsgId, resp.Seq, resp.Duplicate
			}
			pr.c.led.attempt(ownerProbeClient, conv, from, cid, call, msgID, seq, dup, err)
			pr.mu.Lock()
			pr.log = append(pr.log, seen{pr.c.led.hist.Now(), answerClass(err), code == 200})
			pr.mu.Unlock()
			time.Sleep(50 * time.Millisecond) // the probe's pace, not a wait for a state
			if err == nil {
				break
			}
		}
	}
}

func (pr *ownerProbe) halt() {
	select {
	case <-pr.stop:
	default:
		close(pr.stop)
	}
	<-pr.done
}

// ackedAfter reports whether the probe got an ack returned after t.
func (pr *ownerProbe) ackedAfter(t time.Duration) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for i := len(pr.log) - 1; i >= 0 && pr.log[i].at > t; i-- {
		if pr.log[i].what == "ack" {
			return true
		}
	}
	return false
}

// errorsNot returns the probe's error answers whose code is not want.
func (pr *ownerProbe) errorsNot(want string) []string {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	var out []string
	for _, s := range pr.log {
		if s.what != "ack" && !strings.HasPrefix(s.what, want+":") {
			out = append(out, s.what)
		}
	}
	return out
}

// runs summarises the probe's answers in [from, to) as runs of equal
// answers, times relative to zero.
func (pr *ownerProbe) runs(from, to, zero time.Duration) []string {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	var out []string
	var cur string
	var start, end time.Duration
	n := 0
	flush := func() {
		if n > 0 {
			out = append(out, fmt.Sprintf("%+.1fs..%+.1fs %dx %s", (start-zero).Seconds(), (end-zero).Seconds(), n, cur))
		}
	}
	for _, s := range pr.log {
		if s.at < from || s.at >= to {
			continue
		}
		what := s.what + " (/readyz 503)"
		if s.ready {
			what = s.what
		}
		if what != cur {
			flush()
			cur, start, n = what, s.at, 0
		}
		end = s.at
		n++
	}
	flush()
	return out
}

// TestClockJumps: 3 nodes on PostgreSQL under the nemesis load (SDK and raw
// clients, readers, the checked history); n1's wall clock is stepped +5s,
// -5s and -30s, each held 3 s, then stepped back. A probe resends to n1's own
// conversations and records what it is answered. After each fault every
// node is ready and all agree on owners within healBound, and the probe's
// retried send is acked; at the end every send was acked and the history
// (acked means stored, contiguous, an error never stored later, heads never
// back, msg_ids unique) holds.
func TestClockJumps(t *testing.T) {
	c := startNemesisCluster(t, 3, true)
	errs := newAnswers(false)
	c.onError = errs.note
	c.startLoad()
	waitFor(t, 60*time.Second, "200 acks before the first fault", func() bool { return c.led.count() >= 200 })
	pr := c.startProbe(0)
	var rows []faultRow
	var spans []faultSpan
	for _, f := range clockFaults {
		errs.record(true)
		s := c.runFault(f, 0, 2*time.Second, 3*time.Second)
		waitFor(t, healBound, "the probe's retried send to n1 acked after "+f.name, func() bool { return pr.ackedAfter(s.t2) })
		acked := c.led.hist.Now()
		time.Sleep(time.Second) // what clients see just after
		errs.record(false)
		t.Logf("%s: probe of n1's conversations (seconds from the step; heal at %+.1fs, ack after heal at %+.1fs):\n  %s",
			f.name, (s.t2 - s.t1).Seconds(), (acked - s.t1).Seconds(), strings.Join(pr.runs(s.t1-time.Second, c.led.hist.Now(), s.t1), "\n  "))
		t.Logf("%s: errors the load's clients got from 2 s before the step to 1 s after the probe's ack:\n  %s", f.name, strings.Join(errs.take(), "\n  "))
		spans = append(spans, s)
	}
	pr.halt()
	if bad := pr.errorsNot("unavailable"); len(bad) > 0 {
		t.Errorf("n1 answered its own conversations' sends with %d errors other than unavailable (retryable, nothing stored), e.g. %s", len(bad), bad[0])
	}
	c.finish()
	for _, s := range spans {
		rows = append(rows, c.row(s))
	}
	writeReport(t, "clock-jumps", "clock jumps of n1, 3 s each, then stepped back; 48 clients (36 SDK defaults, 12 raw JSON)", rows)
}
