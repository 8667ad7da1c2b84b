package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

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
	bad     []string
	resumes atomic.Int64
	ends    map[string]int // stream ends by code
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
			for st.Receive() {
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

// writers send to random nodes until stop, retrying retryable errors with
// the same key; acks counts acknowledged sends.
func feedWriters(ctx context.Context, nodes *nodeSet, convs []string, n int, acks *atomic.Int64, stop <-chan struct{}) *sync.WaitGroup {
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
						acks.Add(1)
						break
					}
					if !retryableCode(err) {
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
// conversation, then compares what each received with the store, message
// by message.
func checkFeed(t *testing.T, dsn string, convs []string, subs []*feedSub) {
	t.Helper()
	st := openStore(t, dsn)
	ctx := context.Background()
	heads := map[string]uint64{}
	for _, c := range convs {
		h, err := st.LoadHead(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		heads[c] = h
	}
	for _, s := range subs {
		waitFor(t, 90*time.Second, s.name+" to reach every head", func() bool {
			for _, c := range convs {
				if s.last(c) < heads[c] {
					return false
				}
			}
			return true
		})
	}
	for _, c := range convs {
		stored, err := st.ReadRange(ctx, c, 0, int(heads[c])+10)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(stored)) != heads[c] {
			t.Fatalf("%s: %d rows stored, head %d", c, len(stored), heads[c])
		}
		for _, s := range subs {
			s.mu.Lock()
			got := s.got[c]
			s.mu.Unlock()
			if len(got) != len(stored) {
				t.Fatalf("%s received %d messages of %s, the store holds %d", s.name, len(got), c, len(stored))
			}
			for i := range stored {
				if got[i].GetMsgId() != stored[i].MsgID || got[i].GetSeq() != stored[i].Seq || string(got[i].GetBody()) != string(stored[i].Body) {
					t.Fatalf("%s: %s seq %d: received msg_id %d, stored %d", s.name, c, stored[i].Seq, got[i].GetMsgId(), stored[i].MsgID)
				}
			}
		}
	}
	for _, s := range subs {
		if len(s.bad) > 0 {
			t.Errorf("%s saw %d violations, e.g. %v", s.name, len(s.bad), s.bad[:min(5, len(s.bad))])
		}
		t.Logf("%s: %d resumes, ends by code %v", s.name, s.resumes.Load(), s.ends)
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	subs := []*feedSub{
		newFeedSub("sub@n1 (grpc)", 0, nodes, convs, h2cClient(), connect.WithGRPC()),
		newFeedSub("sub@n2 (connect)", 1, nodes, convs, h2cClient()),
		newFeedSub("sub@n3 (connect json)", 2, nodes, convs, http.DefaultClient, connect.WithProtoJSON()),
	}
	var subsDone sync.WaitGroup
	for _, s := range subs {
		subsDone.Add(1)
		go func() { defer subsDone.Done(); s.run(ctx) }()
	}
	var acks atomic.Int64
	stop := make(chan struct{})
	writers := feedWriters(ctx, nodes, convs, 6, &acks, stop)
	await := func(what string, n int64) {
		from := acks.Load()
		waitFor(t, 90*time.Second, fmt.Sprintf("%d more acks %s", n, what), func() bool { return acks.Load() >= from+n })
	}
	await("before the crash", 300)
	t.Log("kill -9 n1")
	procs[0].kill()
	await("after kill -9 n1", 300)
	t.Log("n1 starts again")
	procs[0].start(procs[0].Addr)
	await("after n1 came back", 300)
	t.Log("SIGTERM n2 (drain)")
	if err := procs[1].term(60 * time.Second); err != nil {
		t.Fatalf("n2 graceful leave: %v\n%s", err, procs[1].Output())
	}
	await("after n2 left", 300)
	close(stop)
	writers.Wait()
	checkFeed(t, dsn, convs, subs)
	cancel()
	subsDone.Wait()
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
