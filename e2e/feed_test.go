package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/citustest"
	"github.com/sequencer-im/sequencer/persist/mysqltest"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// feedSub is a subscriber that resumes like a careful user: on any end of
// its stream it subscribes again, at its home node or another live one,
// from the last seq it received of each conversation. It records every
// message and every violation of the contract it sees (a seq that is not
// last+1 without a truncated event before it).
type feedSub struct {
	name  string
	home  int
	nodes *nodeSet
	convs []string
	opts  []connect.ClientOption
	hc    *http.Client

	mu      sync.Mutex
	got     map[string][]*sequencerv1.Message
	seen    []delivered // every message event, as it came (duplicates and disorder too)
	bad     []string
	resumes atomic.Int64
	ends    map[string]int // stream ends by code
	at      string         // the node of the stream open now ("" between streams)
	atSince time.Time      // when it opened
	lastEv  time.Time      // the last event it brought (a heartbeat too)
}

func newFeedSub(name string, home int, nodes *nodeSet, convs []string, hc *http.Client, opts ...connect.ClientOption) *feedSub {
	return &feedSub{name: name, home: home, nodes: nodes, convs: convs, hc: hc, opts: opts,
		got: map[string][]*sequencerv1.Message{}, ends: map[string]int{}}
}

func (s *feedSub) last(conv string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.got[conv]; len(l) > 0 {
		return l[len(l)-1].GetSeq()
	}
	return 0
}

func (s *feedSub) run(ctx context.Context) {
	addrs := s.nodes.all()
	at := s.home
	for ctx.Err() == nil {
		addr := addrs[at%len(addrs)]
		c := sequencerv1connect.NewSequencerServiceClient(s.hc, "http://"+addr, s.opts...)
		req := &sequencerv1.SubscribeRequest{}
		for _, cv := range s.convs {
			req.Cursors = append(req.Cursors, &sequencerv1.Cursor{ConvId: cv, AfterSeq: s.last(cv)})
		}
		st, err := c.Subscribe(ctx, connect.NewRequest(req))
		if err == nil {
			s.mu.Lock()
			s.at, s.atSince = addr, time.Now()
			s.mu.Unlock()
			for st.Receive() {
				s.mu.Lock()
				s.lastEv = time.Now()
				s.mu.Unlock()
				m := st.Msg().GetMessage()
				if m == nil {
					if tr := st.Msg().GetTruncated(); tr != nil {
						s.mu.Lock()
						s.bad = append(s.bad, fmt.Sprintf("truncated %v without retention", tr))
						s.mu.Unlock()
					}
					continue
				}
				s.mu.Lock()
				s.seen = append(s.seen, delivered{conv: m.GetConvId(), seq: m.GetSeq(), msgID: m.GetMsgId(), body: string(m.GetBody()), via: addr})
				l := s.got[m.GetConvId()]
				want := uint64(1)
				if len(l) > 0 {
					want = l[len(l)-1].GetSeq() + 1
				}
				if m.GetSeq() != want {
					s.bad = append(s.bad, fmt.Sprintf("%s: seq %d after %d (via %s)", m.GetConvId(), m.GetSeq(), want-1, addr))
				} else {
					s.got[m.GetConvId()] = append(l, m)
				}
				s.mu.Unlock()
			}
			err = st.Err()
			st.Close()
			s.mu.Lock()
			s.at = ""
			s.mu.Unlock()
		}
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		s.ends[connect.CodeOf(err).String()]++
		s.mu.Unlock()
		s.resumes.Add(1)
		at++ // resume at the next node: any node serves
		addrs = s.nodes.all()
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// feedLoad is the writers of a feed test: they send to random nodes until
// stop; most retry a retryable error with the same key until acked, but
// writers numbered below abandon give up on a key at its first error, so
// that sends whose answer was an error (and that nobody retries) exist for
// the checker (checkDelivered): such a send may be stored (the commit
// happened, its answer was lost) or not, and it must never be delivered
// unless it is stored.
type feedLoad struct {
	acks atomic.Int64 // acknowledged sends

	mu     sync.Mutex
	failed []failedSend
}

// failedSend is a send whose answer was an error and that was not sent
// again.
type failedSend struct {
	conv, body string
	err        string
}

// feedWriters starts n writers (the first abandon of them give up on their
// first error).
func feedWriters(ctx context.Context, nodes *nodeSet, convs []string, n, abandon int, fl *feedLoad, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				conv, cid := convs[rng.Intn(len(convs))], fmt.Sprintf("w%d-%d", w, i)
				for ctx.Err() == nil {
					c := sequencerv1connect.NewSequencerServiceClient(http.DefaultClient, "http://"+nodes.pick(rng), connect.WithProtoJSON())
					sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					_, err := send(sctx, c, conv, uint64(1+w), cid, []byte(cid))
					cancel()
					if err == nil {
						fl.acks.Add(1)
						break
					}
					if w < abandon || !retryableCode(err) {
						fl.mu.Lock()
						fl.failed = append(fl.failed, failedSend{conv: conv, body: cid, err: connect.CodeOf(err).String()})
						fl.mu.Unlock()
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	return &wg
}

// checkFeed waits until every subscriber reached the stored head of every
// conversation, then checks what each received against the store
// (checkFeedStore).
func checkFeed(t *testing.T, dsn string, convs []string, subs []*feedSub, fl *feedLoad) {
	t.Helper()
	checkFeedStore(t, openStore(t, dsn), convs, subs, fl)
}

// storedRows reads every row of convs.
func storedRows(t *testing.T, st persist.Store, convs []string) map[string][]sequencer.Message {
	t.Helper()
	ctx := context.Background()
	out := map[string][]sequencer.Message{}
	for _, c := range convs {
		h, err := st.LoadHead(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := st.ReadRange(ctx, c, 0, int(h)+10)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(rows)) != h {
			t.Fatalf("%s: %d rows stored, head %d", c, len(rows), h)
		}
		out[c] = rows
	}
	return out
}

// checkFeedStore waits until every subscriber reached st's head of every
// conversation, then compares what each received with the store, message
// by message (exactly the stored sequence), and runs checkDelivered.
func checkFeedStore(t *testing.T, st persist.Store, convs []string, subs []*feedSub, fl *feedLoad) {
	t.Helper()
	// A send given up on (its client's deadline passed) may still commit
	// after the writers stopped: read again until the store stands still.
	var stored map[string][]sequencer.Message
	for again := true; again; {
		prev := stored
		stored = storedRows(t, st, convs)
		again = false
		for _, c := range convs {
			again = again || prev == nil || len(prev[c]) != len(stored[c])
		}
		for _, s := range subs {
			waitSubAtHeads(t, s, convs, stored)
		}
	}
	for _, c := range convs {
		for _, s := range subs {
			s.mu.Lock()
			got := s.got[c]
			s.mu.Unlock()
			if len(got) != len(stored[c]) {
				t.Fatalf("%s received %d messages of %s, the store holds %d", s.name, len(got), c, len(stored[c]))
			}
			for i, r := range stored[c] {
				if got[i].GetMsgId() != r.MsgID || got[i].GetSeq() != r.Seq || string(got[i].GetBody()) != string(r.Body) {
					t.Fatalf("%s: %s seq %d: received msg_id %d, stored %d", s.name, c, r.Seq, got[i].GetMsgId(), r.MsgID)
				}
			}
		}
	}
	checkDelivered(t, stored, subs, fl)
	for _, s := range subs {
		if len(s.bad) > 0 {
			t.Errorf("%s saw %d violations, e.g. %v", s.name, len(s.bad), s.bad[:min(5, len(s.bad))])
		}
		t.Logf("%s: %d resumes, ends by code %v", s.name, s.resumes.Load(), s.ends)
	}
}

// waitSubAtHeads waits up to 90 s until s received every stored message of
// convs; else it fails with where s stands: the conversations behind (its
// last seq against the head), the node its stream is open on and since
// when, its last event, and its ends by code.
func waitSubAtHeads(t *testing.T, s *feedSub, convs []string, stored map[string][]sequencer.Message) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var behind []string
		for _, c := range convs {
			if l, h := s.last(c), uint64(len(stored[c])); l < h {
				behind = append(behind, fmt.Sprintf("%s at %d of %d", c, l, h))
			}
		}
		if len(behind) == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.mu.Lock()
			at, since, lastEv, ends := s.at, s.atSince, s.lastEv, fmt.Sprint(s.ends)
			s.mu.Unlock()
			t.Fatalf("timed out after 90s waiting for %s to reach every head: %d conversations behind (%s); its stream is open on %q since %s, last event %s ago; %d resumes, ends by code %s",
				s.name, len(behind), strings.Join(behind, ", "), at, since.Format("15:04:05.000"), time.Since(lastEv).Round(time.Millisecond), s.resumes.Load(), ends)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// delivered is one message event a subscriber received.
type delivered struct {
	conv       string
	seq, msgID uint64
	body, via  string
}

// checkDelivered is the checker of "a subscriber never sees a message that
// is not stored" (docs/TESTING.md argues why it is exact): every message
// event any subscriber received, duplicates and out-of-order ones
// included, must be the stored row at its (conversation, seq), with its
// msg_id and body; and a send whose answer was an error and that was never
// sent again may be delivered only if the store holds it.
func checkDelivered(t testing.TB, stored map[string][]sequencer.Message, subs []*feedSub, fl *feedLoad) {
	t.Helper()
	storedBodies := map[string]bool{}
	for c, rows := range stored {
		for _, r := range rows {
			storedBodies[c+"\x00"+string(r.Body)] = true
		}
	}
	deliveredBodies := map[string]bool{}
	n := 0
	for _, s := range subs {
		s.mu.Lock()
		seen := slices.Clone(s.seen)
		s.mu.Unlock()
		for _, d := range seen {
			n++
			deliveredBodies[d.conv+"\x00"+d.body] = true
			rows, ok := stored[d.conv]
			if !ok {
				t.Errorf("%s received %s seq %d, a conversation it did not follow", s.name, d.conv, d.seq)
				continue
			}
			if d.seq == 0 || d.seq > uint64(len(rows)) {
				t.Errorf("%s received %s seq %d (msg_id %d, via %s): not stored (head %d)", s.name, d.conv, d.seq, d.msgID, d.via, len(rows))
				continue
			}
			if r := rows[d.seq-1]; r.MsgID != d.msgID || string(r.Body) != d.body {
				t.Errorf("%s received %s seq %d as msg_id %d %q (via %s): the store holds msg_id %d %q there",
					s.name, d.conv, d.seq, d.msgID, d.body, d.via, r.MsgID, r.Body)
			}
		}
	}
	if fl == nil {
		t.Logf("checked %d delivered messages against the store", n)
		return
	}
	fl.mu.Lock()
	failed := slices.Clone(fl.failed)
	fl.mu.Unlock()
	storedFailed := 0
	for _, f := range failed {
		k := f.conv + "\x00" + f.body
		if storedBodies[k] {
			storedFailed++
		} else if deliveredBodies[k] {
			t.Errorf("send %q to %s answered %s, is not stored, and was delivered", f.body, f.conv, f.err)
		}
	}
	t.Logf("checked %d delivered messages against the store; %d sends answered an error and were given up, %d of them stored all the same",
		n, len(failed), storedFailed)
}

// TestFeedClusterKill: 3 nodes on one database, a resuming subscriber on
// every node (gRPC, Connect and Connect JSON) following every conversation,
// writers on random nodes; meanwhile n1 is kill -9'ed and started again
// and n2 leaves with SIGTERM (a drain: its partitions hand off). Each
// subscriber's sequence, after its resumes, equals the stored one for
// every conversation: no gap, no duplicate, nothing that is not stored.
func TestFeedClusterKill(t *testing.T) { feedClusterKill(t, pgtest.NewDatabase(t)) }

// TestFeedClusterKillMySQL is TestFeedClusterKill on MySQL.
func TestFeedClusterKillMySQL(t *testing.T) { feedClusterKill(t, mysqltest.NewDatabase(t)) }

func feedClusterKill(t *testing.T, dsn string) {
	nodes := &nodeSet{}
	var procs []*proc
	for i := 1; i <= 3; i++ {
		p := startNode(t, fmt.Sprintf("n%d", i), clusterArgs(t, dsn, fmt.Sprintf("n%d", i), "2s")...)
		procs = append(procs, p)
		nodes.add(p.Addr)
	}
	convs := convNames(24)
	r := startFeedRun(t, nodes, convs, 6, 2, 4*time.Minute, threeSubs(nodes, convs)...)
	r.await("before the crash", 300)
	t.Log("kill -9 n1")
	procs[0].kill()
	r.await("after kill -9 n1", 300)
	t.Log("n1 starts again")
	procs[0].start(procs[0].Addr)
	r.await("after n1 came back", 300)
	t.Log("SIGTERM n2 (drain)")
	if err := procs[1].term(60 * time.Second); err != nil {
		t.Fatalf("n2 graceful leave: %v\n%s", err, procs[1].Output())
	}
	r.await("after n2 left", 300)
	r.stopWriters()
	checkFeed(t, dsn, convs, r.subs, r.fl)
	r.stopSubs()
}

// threeSubs are subscribers homed on the first three nodes, one per
// protocol: gRPC, Connect, Connect JSON.
func threeSubs(nodes *nodeSet, convs []string) []*feedSub {
	return []*feedSub{
		newFeedSub("sub@n1 (grpc)", 0, nodes, convs, h2cClient(), connect.WithGRPC()),
		newFeedSub("sub@n2 (connect)", 1, nodes, convs, h2cClient()),
		newFeedSub("sub@n3 (connect json)", 2, nodes, convs, http.DefaultClient, connect.WithProtoJSON()),
	}
}

// feedRun is a feed test under way: its subscribers and writers.
type feedRun struct {
	t       *testing.T
	ctx     context.Context
	cancel  context.CancelFunc
	nodes   *nodeSet
	subs    []*feedSub
	subsWG  sync.WaitGroup
	fl      *feedLoad
	stop    chan struct{}
	writers *sync.WaitGroup
}

// startFeedRun starts subs and n writers (abandon of them give up on a
// send at its first error) on convs; the run ends after d at the latest.
func startFeedRun(t *testing.T, nodes *nodeSet, convs []string, n, abandon int, d time.Duration, subs ...*feedSub) *feedRun {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	r := &feedRun{t: t, ctx: ctx, cancel: cancel, nodes: nodes, fl: &feedLoad{}, stop: make(chan struct{})}
	for _, s := range subs {
		r.add(s)
	}
	r.writers = feedWriters(ctx, nodes, convs, n, abandon, r.fl, r.stop)
	return r
}

// add starts one more subscriber.
func (r *feedRun) add(s *feedSub) {
	r.subs = append(r.subs, s)
	r.subsWG.Add(1)
	go func() { defer r.subsWG.Done(); s.run(r.ctx) }()
}

// await waits for n more acks.
func (r *feedRun) await(what string, n int64) {
	from := r.fl.acks.Load()
	waitFor(r.t, 90*time.Second, fmt.Sprintf("%d more acks %s", n, what), func() bool { return r.fl.acks.Load() >= from+n })
}

func (r *feedRun) stopWriters() {
	close(r.stop)
	r.writers.Wait()
}

func (r *feedRun) stopSubs() {
	r.cancel()
	r.subsWG.Wait()
}

// TestFeedSlowConsumer: a subscriber that stops reading while 1,000 large
// messages are written is cut with resource_exhausted (the writers never
// wait for it), and resuming from its last seq ends with exactly the stored
// sequence. On every store.
func TestFeedSlowConsumer(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		n := startNode(t, "node", "--store", spec, "--subscribe-queue", "64", "--max-batch-bytes", "8388608")
		nodes := &nodeSet{}
		nodes.add(n.Addr)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		// A client whose HTTP/2 windows are small, as a phone on a slow
		// link: what it does not read stays on the server.
		hc := h2cClient()
		hc.Transport.(*http.Transport).HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerStream: 64 << 10, MaxReceiveBufferPerConnection: 64 << 10}
		c := sequencerv1connect.NewSequencerServiceClient(hc, "http://"+n.Addr)
		w := n.grpcClient() // the writer's own connection
		// 60 MB in all: more than the transport's windows and the sockets'
		// buffers hold, so the server's writes block and its queue fills.
		const total = 1000
		body := make([]byte, 60<<10)
		if _, err := send(ctx, w, "slow", 1, "k0", body); err != nil {
			t.Fatal(err)
		}
		st, err := c.Subscribe(ctx, connect.NewRequest(&sequencerv1.SubscribeRequest{Cursors: []*sequencerv1.Cursor{{ConvId: "slow"}}}))
		if err != nil {
			t.Fatal(err)
		}
		if !st.Receive() || st.Msg().GetMessage().GetSeq() != 1 {
			t.Fatalf("first event: %v %v", st.Msg(), st.Err())
		}
		// The subscriber reads nothing while the messages are written: none
		// of the sends waits for it.
		for i := 1; i <= total; i += 50 {
			req := &sequencerv1.SendBatchRequest{}
			for k := i; k < i+50; k++ {
				req.Items = append(req.Items, &sequencerv1.SendRequest{ConvId: "slow", FromUid: 1, ClientMsgId: fmt.Sprint("k", k), Body: body})
			}
			resp, err := w.SendBatch(ctx, connect.NewRequest(req))
			if err != nil {
				t.Fatalf("send batch at %d while a subscriber stalls: %v", i, err)
			}
			for _, r := range resp.Msg.GetResults() {
				if r.GetError() != nil {
					t.Fatalf("send while a subscriber stalls: %v", r.GetError())
				}
			}
		}
		last := uint64(1)
		for st.Receive() {
			if m := st.Msg().GetMessage(); m != nil {
				if m.GetSeq() != last+1 {
					t.Fatalf("seq %d after %d", m.GetSeq(), last)
				}
				last = m.GetSeq()
			}
		}
		if connect.CodeOf(st.Err()) != connect.CodeResourceExhausted {
			t.Fatalf("the stalled stream ended with %v after seq %d, want resource_exhausted", st.Err(), last)
		}
		st.Close()
		t.Logf("cut after seq %d of %d", last, total+1)
		if v := metricValue(t, n.Addr, "sequencer_feed_slow_consumers_cut_total"); v != 1 {
			t.Errorf("sequencer_feed_slow_consumers_cut_total is %v after one cut, want 1", v)
		}
		// Resume exactly where it was cut.
		sub := newFeedSub("resumed", 0, nodes, []string{"slow"}, h2cClient(), connect.WithGRPC())
		sub.got["slow"] = make([]*sequencerv1.Message, 0, last)
		for s := uint64(1); s <= last; s++ {
			sub.got["slow"] = append(sub.got["slow"], &sequencerv1.Message{Seq: s})
		}
		done := make(chan struct{})
		sctx, stop := context.WithCancel(ctx)
		go func() { defer close(done); sub.run(sctx) }()
		waitFor(t, 60*time.Second, "the resumed subscriber at the head", func() bool { return sub.last("slow") >= total+1 })
		stop()
		<-done
		if len(sub.bad) > 0 {
			t.Fatalf("after the resume: %v", sub.bad)
		}
		// What the store holds after the cut, read through the node (the
		// embedded store is the node's alone while it runs).
		var stored []*sequencerv1.Message
		for after := last; ; {
			page, err := w.Pull(ctx, connect.NewRequest(&sequencerv1.PullRequest{ConvId: "slow", AfterSeq: after, Limit: 1000}))
			if err != nil {
				t.Fatal(err)
			}
			stored = append(stored, page.Msg.GetMessages()...)
			if !page.Msg.GetHasMore() {
				break
			}
			after = stored[len(stored)-1].GetSeq()
		}
		got := sub.got["slow"][last:]
		if len(got) != len(stored) {
			t.Fatalf("resumed with %d messages, the store holds %d after seq %d", len(got), len(stored), last)
		}
		for i := range stored {
			if got[i].GetMsgId() != stored[i].GetMsgId() || got[i].GetSeq() != stored[i].GetSeq() {
				t.Fatalf("seq %d: msg_id %d, stored %d", stored[i].GetSeq(), got[i].GetMsgId(), stored[i].GetMsgId())
			}
		}
	})
}

// TestFeedClusterKillCitus is TestFeedClusterKill on Citus (a coordinator
// and two workers): the backlog is read per conversation on its shard's
// worker.
func TestFeedClusterKillCitus(t *testing.T) { feedClusterKill(t, citustest.NewDatabase(t).DSN()) }
