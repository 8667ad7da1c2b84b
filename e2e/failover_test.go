package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/client"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// sendTimes is what the failover test learns about each send: which
// conversation, when it was issued and when it was acked.
type sendTimes struct {
	conv       string
	start, end time.Time
	err        error
}

// TestClusterFailoverDefaults measures, with the DEFAULT membership settings
// (no --member-ttl / --heartbeat), what SDK callers see when a node is
// killed with kill -9 and when another leaves with SIGTERM: 3 real nodes, 48
// senders through the Go SDK over 240 conversations. It checks that no SDK
// call failed and that every acked message is stored at its seq (seqs
// 1..head), and logs the numbers the README reports: p99 and max time from
// the kill (or the send's start, if later) to the ack of sends to the dead
// node's conversations, and the longest pause of a leaving node's
// conversation. (Tests never assert wall-clock speed: the figures are
// reported, not asserted.)
func TestClusterFailoverDefaults(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	var procs []*proc
	var addrs []string
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("f%d", i)
		p := startNode(t, id, "--store", dsn, "--cluster-listen", freeAddr(t), "--node-id", id)
		procs = append(procs, p)
		addrs = append(addrs, p.Addr)
	}
	sdk, err := client.New(client.Config{Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Close()
	ctx := context.Background()
	convs := convNames(240)
	owner := func() map[string]string {
		m := map[string]string{}
		for _, c := range convs {
			r, err := sdk.Route(ctx, c)
			if err != nil {
				t.Fatalf("route %s: %v", c, err)
			}
			m[c] = r.NodeID
		}
		return m
	}
	waitFor(t, 30*time.Second, "every node to own conversations", func() bool {
		seen := map[string]bool{}
		for _, o := range owner() {
			seen[o] = true
		}
		return len(seen) == 3
	})

	led := newLedger()
	var mu sync.Mutex
	var sends []sendTimes
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for s := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				conv := convs[(s*31+i*7)%len(convs)]
				cid := fmt.Sprintf("s%d-%d", s, i)
				st := sendTimes{conv: conv, start: time.Now()}
				call := led.hist.Now()
				res, err := sdk.Send(ctx, client.SendRequest{ConvID: conv, FromUID: uint64(s + 1), ClientMsgID: cid, Body: []byte(cid)})
				st.end, st.err = time.Now(), err
				led.attempt(s, conv, uint64(s+1), cid, call, res.MsgID, res.Seq, res.Duplicate, err)
				mu.Lock()
				sends = append(sends, st)
				mu.Unlock()
			}
		}()
	}
	stats := func(name string, at time.Time, hit map[string]bool) {
		mu.Lock()
		defer mu.Unlock()
		var lat []time.Duration
		for _, s := range sends {
			if !hit[s.conv] || s.end.Before(at) || s.start.After(at.Add(time.Second)) {
				continue
			}
			if s.err != nil {
				t.Errorf("%s: an SDK send failed: %v", name, s.err)
				continue
			}
			from := s.start
			if from.Before(at) {
				from = at
			}
			lat = append(lat, s.end.Sub(from))
		}
		if len(lat) == 0 {
			t.Fatalf("%s: no send to the affected conversations in the window", name)
		}
		slices.Sort(lat)
		p99 := lat[(len(lat)*99)/100]
		t.Logf("%s with default settings: %d sends to the affected %d conversations; from the event (or a later start) to the ack: p50 %v, p99 %v, max %v",
			name, len(lat), len(hit), lat[len(lat)/2].Round(time.Millisecond), p99.Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	}

	victim := func(own map[string]bool) *proc {
		for _, p := range procs {
			r, _ := sdk.Route(ctx, firstKey(own))
			if r.Address == p.Addr {
				return p
			}
		}
		t.Fatal("no process owns the conversation")
		return nil
	}
	killAt, killHit := eventOn(t, led, owner, convs, "kill -9", func(own map[string]bool) { victim(own).kill() })
	stats("kill -9", killAt, killHit)
	leaveAt, leaveHit := eventOn(t, led, owner, convs, "SIGTERM leave", func(own map[string]bool) {
		p := victim(own)
		go func() { _ = p.term(30 * time.Second) }()
	})
	stats("SIGTERM leave", leaveAt, leaveHit)
	close(stop)
	wg.Wait()
	for _, p := range procs {
		_ = p.term(30 * time.Second)
	}
	led.verify(t, openStore(t, dsn), convs)
}

// eventOn waits for load, picks the owner of the first conversation among
// the live nodes, runs what on it, and keeps the load running 4 s.
func eventOn(t *testing.T, led *ledger, owner func() map[string]string, convs []string, name string, what func(own map[string]bool)) (time.Time, map[string]bool) {
	t.Helper()
	base := led.count()
	waitFor(t, 30*time.Second, "load before "+name, func() bool { return led.count() >= base+300 })
	own := owner()
	v := own[convs[0]]
	hit := map[string]bool{}
	for c, o := range own {
		if o == v {
			hit[c] = true
		}
	}
	at := time.Now()
	what(hit)
	time.Sleep(4 * time.Second) // the measured window: the load keeps running through the event
	return at, hit
}

func firstKey(m map[string]bool) string {
	for k := range m {
		return k
	}
	return ""
}
