package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/idgen"
	"github.com/sequencer-im/sequencer/internal/testwait"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ownership"
	"github.com/sequencer-im/sequencer/persist/postgres"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
	"github.com/sequencer-im/sequencer/ring"
)

// Several nodes in one process, each with its own PostgreSQL pool, worker
// id, actor.Conversations and connect transport on 127.0.0.1:0 (the real wire), on one
// fresh database.

type ipNode struct {
	id    string
	cn    *Node
	an    *actor.Conversations
	store *postgres.Store
	lease *idgen.Issuer
	tr    Transport // the transport given in Config (nil: the default)
	// crashed: halted like a kill -9 (no leave; its member row expires)
	crashed atomic.Bool
}

// ipOptions shape one node.
type ipOptions struct {
	tlsFiles [3]string                 // cert, key, CA: mutual TLS
	wrap     func(Transport) Transport // wraps a plain loopback transport
	tp       trace.TracerProvider      // traces the default transport
	// listen and advertise, when set: the cluster listener's address and
	// the one peers dial (e.g. a proxy in front of it).
	listen, advertise string
	memberTTL         time.Duration // 0: 2 s
	forwardTimeout    time.Duration // 0: the default (10 s)
}

func (pc *procCluster) startInProcess(id string, o ipOptions) *ipNode {
	t := pc.t
	t.Helper()
	ctx := context.Background()
	store, err := postgres.Open(ctx, pc.dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := idgen.NewIssuer(store, idgen.IssuerConfig{Holder: id})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		NodeID: id, Store: store.Cluster(), ClusterListen: "127.0.0.1:0", APIAddr: "api-" + id,
		MemberTTL: 2 * time.Second, Heartbeat: 300 * time.Millisecond, Logger: simLogger(),
		TLSCertFile: o.tlsFiles[0], TLSKeyFile: o.tlsFiles[1], TLSCAFile: o.tlsFiles[2],
		TracerProvider: o.tp, ClusterAdvertise: o.advertise,
	}
	if o.listen != "" {
		cfg.ClusterListen = o.listen
	}
	if o.memberTTL > 0 {
		cfg.MemberTTL = o.memberTTL
	}
	cfg.ForwardTimeout = o.forwardTimeout
	n := &ipNode{id: id, store: store, lease: lease}
	if o.wrap != nil {
		tr, err := NewConnectTransport(ConnectConfig{Listen: "127.0.0.1:0", Logger: simLogger()})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Transport = o.wrap(tr)
		n.tr = cfg.Transport
	}
	if n.cn, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	if n.an, err = actor.NewConversations(actor.Config{Store: store, IDs: leaseIDs{lease}, Ownership: n.cn, Logger: simLogger()}); err != nil {
		t.Fatal(err)
	}
	if err := n.cn.Start(ctx, n.an); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		leave := n.cn.Leave
		if n.crashed.Load() {
			leave = func(context.Context) error { return nil }
		}
		if err := errors.Join(leave(lctx), n.an.Close(lctx), n.cn.Close(), lease.Close(lctx)); err != nil {
			t.Errorf("stop %s: %v", id, err)
		}
		store.Close()
	})
	return n
}

// waitInProcess waits until the partitions are held by the ring owners of
// exactly these nodes.
func (pc *procCluster) waitInProcess(nodes ...*ipNode) {
	pc.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := pc.store.Cluster().View(context.Background())
		ok, why := err == nil && len(v.Members) == len(nodes), fmt.Sprint(err, len(v.Members))
		if ok {
			r, _ := ring.New(v.RingNodes(), ring.Config{})
			for p := range r.Partitions() {
				o, _ := r.Owner(uint32(p))
				m, _ := v.Member(o.NodeID)
				if l, held := v.Lease(uint32(p)); !held || l.Owner != m.Incarnation {
					ok, why = false, fmt.Sprintf("partition %d not held by its owner yet", p)
					break
				}
			}
		}
		if ok {
			for _, n := range nodes { // every node's view has caught up
				caught := read(n.cn.member, (*ownership.Core).View).Version == v.Version
				if n.cn.Serving() != nil || !caught {
					ok, why = false, n.id+" not caught up"
				}
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			pc.t.Fatalf("in-process cluster not settled: %s", why)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}
}

// addr is the node's cluster address.
func (n *ipNode) addr() string {
	return read(n.cn.member, (*ownership.Core).Self).ClusterAddr
}

func (n *ipNode) incarnation() string {
	return read(n.cn.member, (*ownership.Core).Self).Incarnation
}

// convsOwnedBy returns k conversation ids that node owner owns by via's view.
func convsOwnedBy(t *testing.T, via *ipNode, owner, prefix string, k int) []string {
	t.Helper()
	var cs []string
	for i := 0; len(cs) < k; i++ {
		c := fmt.Sprintf("%s:%d", prefix, i)
		loc, err := via.cn.locate(c)
		if err != nil {
			t.Fatal(err)
		}
		if loc.NodeID == owner {
			cs = append(cs, c)
		}
	}
	return cs
}

func (pc *procCluster) countRows() int {
	pc.t.Helper()
	var n int
	if err := pc.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM im_message`).Scan(&n); err != nil {
		pc.t.Fatal(err)
	}
	return n
}

// countingTransport counts forwarded batches and items, and can lose the
// replies of the first batches (the owner handled them; the forwarder never
// hears back).
type countingTransport struct {
	Transport
	batches, items atomic.Int64
	maxItems       atomic.Int64
	loseReplies    atomic.Int64 // batches whose reply is lost after delivery
	dropRequests   atomic.Int64 // batches dropped before delivery
	hang           atomic.Bool  // batches wait for their context and get no answer
	refuseFor      atomic.Int64 // ns: after a lost reply, batches are refused (nothing stored) this long
	refuseUntil    atomic.Int64 // unix ns
}

func (c *countingTransport) Forward(ctx context.Context, addr string, req *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
	c.batches.Add(1)
	if c.hang.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if time.Now().UnixNano() < c.refuseUntil.Load() {
		return nil, &RefusedError{Msg: "test: refused, nothing stored"}
	}
	if c.dropRequests.Add(-1) >= 0 {
		return nil, errors.New("test: connection reset before the request was sent")
	}
	n := int64(len(req.Items))
	c.items.Add(n)
	for {
		m := c.maxItems.Load()
		if n <= m || c.maxItems.CompareAndSwap(m, n) {
			break
		}
	}
	reply, err := c.Transport.Forward(ctx, addr, req)
	if err == nil && c.loseReplies.Add(-1) >= 0 {
		if d := c.refuseFor.Load(); d > 0 {
			c.refuseUntil.Store(time.Now().Add(time.Duration(d)).UnixNano())
		}
		return nil, errors.New("test: connection reset before the reply arrived")
	}
	return reply, err
}

// TestInProcessForwardBatches sends through a node that owns only some of
// the conversations, as one SendBatch and as many concurrent Sends, over the
// real connect transport: every item is answered, items of a conversation
// get seqs in item order, the forwards went out in batches, and every acked
// message is stored at its seq with seqs 1..head.
func TestInProcessForwardBatches(t *testing.T) {
	// 6 MiB through one node's bound (ForwardTimeout) takes more than the
	// default 10 s with -race on a busy 2-core machine: this test is about
	// batching, not the bound.
	pc, a, _, ct := countedPair(t, ipOptions{forwardTimeout: 60 * time.Second})
	acks := map[string]acked{}
	var acksMu sync.Mutex
	ack := func(req sequencer.SendRequest, res sequencer.SendResult) {
		acksMu.Lock()
		defer acksMu.Unlock()
		acks[req.ClientMsgID] = acked{conv: req.ConvID, msgID: res.MsgID, seq: res.Seq}
	}

	// One batch: 8 conversations on b, 4 on a, 40 items each, interleaved.
	remote := convsOwnedBy(t, a, "b", "r", 8)
	local := convsOwnedBy(t, a, "a", "l", 4)
	convs := append(append([]string(nil), remote...), local...)
	var reqs []sequencer.SendRequest
	for i := range 40 {
		for _, c := range convs {
			reqs = append(reqs, sequencer.SendRequest{ConvID: c, FromUID: 7, ClientMsgID: fmt.Sprintf("batch-%s-%d", c, i), MsgType: 1, Body: []byte("x")})
		}
	}
	out := make([]sequencer.SendOutcome, len(reqs))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	a.cn.SendBatch(ctx, reqs, out)
	next := map[string]uint64{}
	for i, o := range out {
		if o.Err != nil {
			t.Fatalf("item %d (%s): %v", i, reqs[i].ConvID, o.Err)
		}
		if o.Result.Seq != next[reqs[i].ConvID]+1 {
			t.Fatalf("item %d of %s: seq %d after %d (not in item order)", i, reqs[i].ConvID, o.Result.Seq, next[reqs[i].ConvID])
		}
		next[reqs[i].ConvID] = o.Result.Seq
		ack(reqs[i], o.Result)
	}
	// Batched: one forward carried every remote item. On a loaded machine
	// the owner may answer a few items unavailable (a commit past its
	// timeout), and those alone are forwarded again (answered once each:
	// the order check above holds, the stored check below too).
	want := int64(len(remote) * 40)
	if m := ct.maxItems.Load(); m != want || ct.items.Load() < want {
		t.Fatalf("one SendBatch forwarded %d items in %d batches, the largest of %d; want all %d in one", ct.items.Load(), ct.batches.Load(), m, want)
	}
	if n := ct.batches.Load(); n != 1 {
		t.Logf("%d items were forwarded again, in %d more batches (retries)", ct.items.Load()-want, n-1)
	}

	// A call past the batch limits (here 6 MiB for one conversation) goes
	// out in pieces, one after the other, in item order.
	before := ct.batches.Load()
	ct.maxItems.Store(0)
	big := make([]sequencer.SendRequest, 100)
	for i := range big {
		big[i] = sequencer.SendRequest{ConvID: remote[0], FromUID: 7, ClientMsgID: fmt.Sprintf("big-%d", i), MsgType: 1, Body: make([]byte, 60<<10)}
	}
	bout := make([]sequencer.SendOutcome, len(big))
	a.cn.SendBatch(ctx, big, bout)
	for i, o := range bout {
		if o.Err != nil || o.Result.Seq != 41+uint64(i) {
			t.Fatalf("big item %d: %+v", i, o)
		}
		ack(big[i], o.Result)
	}
	// Two pieces of 4 MiB at most (68 items of 60 KiB): the largest holds
	// at least half; retries under load add batches, never larger ones.
	if n, m := ct.batches.Load()-before, ct.maxItems.Load(); n < 2 || m > 68 || m < 50 {
		t.Fatalf("6 MiB forwarded in %d batches, the largest of %d items; want 2 (4 MiB each at most)", n, m)
	} else if n != 2 {
		t.Logf("6 MiB forwarded in %d batches (retries)", n)
	}

	// Concurrent unary sends through a: what queues while a batch is in
	// flight goes out together.
	before = ct.batches.Load()
	ct.maxItems.Store(0)
	var wg sync.WaitGroup
	errc := make(chan error, 200)
	for g := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				req := sequencer.SendRequest{ConvID: remote[(g+i)%len(remote)], FromUID: 7, ClientMsgID: fmt.Sprintf("unary-%d-%d", g, i), MsgType: 1}
				res, err := a.cn.Send(ctx, req)
				if err != nil {
					errc <- err
					return
				}
				ack(req, res)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	sent := ct.batches.Load() - before
	t.Logf("1000 concurrent forwarded sends went out in %d batches (largest %d items)", sent, ct.maxItems.Load())
	if sent >= 1000 || ct.maxItems.Load() < 2 {
		t.Fatalf("concurrent sends were not batched: %d batches for 1000 sends", sent)
	}
	pc.checkStored(acks)
}

// TestInProcessForwardRetriesWithoutAnswer: a forward whose reply is lost
// (the owner stored the items) or whose request never left is sent again
// with the same keys until it is answered; it is never answered
// unavailable, and each message is stored once.
func TestInProcessForwardRetriesWithoutAnswer(t *testing.T) {
	pc, a, _, ct := countedPair(t, ipOptions{})
	convs := convsOwnedBy(t, a, "b", "q", 3)
	acks := map[string]acked{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ct.loseReplies.Store(2)
	req := sequencer.SendRequest{ConvID: convs[0], FromUID: 7, ClientMsgID: "lost-reply", MsgType: 1}
	res, err := a.cn.Send(ctx, req)
	if err != nil || res.Seq != 1 || res.Duplicate {
		t.Fatalf("send whose replies were lost twice: %+v %v (want seq 1, stored by the first try; not duplicate: the client sent it once)", res, err)
	}
	acks[req.ClientMsgID] = acked{conv: req.ConvID, msgID: res.MsgID, seq: res.Seq}
	// The client's own resend is a duplicate.
	if again, err := a.cn.Send(ctx, req); err != nil || again.Seq != 1 || again.MsgID != res.MsgID || !again.Duplicate {
		t.Fatalf("client's resend: %+v %v (want the first ids, duplicate)", again, err)
	}

	ct.dropRequests.Store(1)
	ct.loseReplies.Store(1)
	var reqs []sequencer.SendRequest
	for i := range 6 {
		reqs = append(reqs, sequencer.SendRequest{ConvID: convs[i%3], FromUID: 7, ClientMsgID: fmt.Sprintf("batch-%d", i), MsgType: 1})
	}
	out := make([]sequencer.SendOutcome, len(reqs))
	a.cn.SendBatch(ctx, reqs, out)
	for i, o := range out {
		if o.Err != nil {
			t.Fatalf("item %d after a dropped request and a lost reply: %v", i, o.Err)
		}
		if o.Result.Duplicate {
			t.Errorf("item %d sent once by the client answered duplicate after the node's own resend", i)
		}
		acks[reqs[i].ClientMsgID] = acked{conv: reqs[i].ConvID, msgID: o.Result.MsgID, seq: o.Result.Seq}
	}
	if out[0].Result.Seq != 2 || out[3].Result.Seq != 3 || out[1].Result.Seq != 1 || out[4].Result.Seq != 2 {
		t.Fatalf("seqs not in item order: %+v", out)
	}

	// A lost reply, then refusals for longer than the handoff wait: the
	// first try stored it, so the refusals' unavailable must not answer it
	// (an error answer says "not stored"); it is acked once they stop.
	ct.refuseFor.Store(int64(a.cn.cfg.HandoffWait + time.Second))
	ct.loseReplies.Store(1)
	req = sequencer.SendRequest{ConvID: convs[2], FromUID: 7, ClientMsgID: "lost-then-refused", MsgType: 1}
	res, err = a.cn.Send(ctx, req)
	ct.refuseFor.Store(0)
	if err != nil || res.Duplicate {
		t.Fatalf("send stored by a try whose reply was lost, then refused past the handoff wait: %+v %v (want the stored ids, not duplicate)", res, err)
	}
	acks[req.ClientMsgID] = acked{conv: req.ConvID, msgID: res.MsgID, seq: res.Seq}

	// An owner that never answers: the caller's deadline ends the send, and
	// the error says so (not an answer), never unavailable.
	ct.dropRequests.Store(1 << 30)
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = a.cn.Send(sctx, sequencer.SendRequest{ConvID: convs[1], FromUID: 7, ClientMsgID: "never", MsgType: 1})
	scancel()
	if !errors.Is(err, context.DeadlineExceeded) || sequencer.ErrorCode(err) == sequencer.CodeUnavailable {
		t.Fatalf("send to an owner that never answers: %v (code %v)", err, sequencer.ErrorCode(err))
	}
	ct.dropRequests.Store(0)
	pc.checkStored(acks)
}

// holeProxy forwards TCP connections to target; while hole is set it reads
// and drops the bytes of both directions (a blackholed link: connections
// stay open, nothing arrives).
type holeProxy struct {
	ln     net.Listener
	target string
	hole   atomic.Bool
	delay  atomic.Int64 // a time.Duration each chunk waits before it passes (a slow link)
}

func newHoleProxy(t *testing.T, target string) *holeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holeProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); u.Close() })
			go p.pipe(c, u)
			go p.pipe(u, c)
		}
	}()
	return p
}

func (p *holeProxy) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		k, err := from.Read(buf)
		if err != nil {
			to.Close()
			return
		}
		if p.hole.Load() {
			continue
		}
		if d := time.Duration(p.delay.Load()); d > 0 {
			time.Sleep(d)
		}
		if _, err := to.Write(buf[:k]); err != nil {
			from.Close()
			return
		}
	}
}

// TestInProcessForwardIntoBlackhole: the link from a to the owner b is
// blackholed (b stays a live member, so the route keeps naming it). A send
// forwarded into it is answered deadline_exceeded (outcome unknown: never
// an error that says "not stored") while its caller's deadline is still far
// off, so that the client re-routes; once the link passes again, the resend
// with the same key is acked and the message is stored once.
func TestInProcessForwardIntoBlackhole(t *testing.T) {
	pc, a, hole, conv := proxiedOwner(t, "hole")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	acks := map[string]acked{}
	req := sequencer.SendRequest{ConvID: conv, FromUID: 7, ClientMsgID: "before", MsgType: 1}
	res, err := a.cn.Send(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	acks[req.ClientMsgID] = acked{conv: conv, msgID: res.MsgID, seq: res.Seq}

	hole.hole.Store(true)
	req = sequencer.SendRequest{ConvID: conv, FromUID: 7, ClientMsgID: "into-the-hole", MsgType: 1}
	_, err = a.cn.Send(ctx, req)
	if ctx.Err() != nil {
		t.Fatalf("the send into a blackholed link ended with its caller's deadline (%v), want an answer before it", err)
	}
	if sequencer.ErrorCode(err) != sequencer.CodeDeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send into a blackholed link: %v (code %v), want deadline_exceeded (outcome unknown)", err, sequencer.ErrorCode(err))
	}
	// The answer names the owner's client address: the cut may be between
	// the nodes only (the API edge redirects plain clients there).
	var oe *sequencer.OwnerElsewhere
	if !errors.As(err, &oe) || oe.NodeID != "b" || oe.Addr != "api-b" {
		t.Fatalf("send into a blackholed link: %v does not name the owner b at api-b", err)
	}
	if loc, _ := a.cn.locate(conv); loc.NodeID != "b" {
		t.Fatalf("%s moved to %s during the test", conv, loc.NodeID)
	}

	// The link is down for a now: a send to b is answered at once, not
	// sent (unavailable), until a's probe of the link answers again.
	unsent := sequencer.SendRequest{ConvID: conv, FromUID: 7, ClientMsgID: "while-down", MsgType: 1}
	if _, err := a.cn.Send(ctx, unsent); sequencer.ErrorCode(err) != sequencer.CodeUnavailable || !errors.As(err, &oe) || oe.Addr != "api-b" {
		t.Fatalf("send while the link is down: %v (code %v), want unavailable at once, naming the owner's address", err, sequencer.ErrorCode(err))
	}
	hole.hole.Store(false)
	// The client's resend, until the link is up again (probed every
	// downProbe).
	testwait.For(t, 30*time.Second, 10*time.Millisecond, "the resend acked after the link healed", func() bool {
		res, err = a.cn.Send(ctx, req)
		if err != nil && sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
			t.Fatalf("resend after the link healed: %v", err)
		}
		return err == nil
	})
	acks[req.ClientMsgID] = acked{conv: conv, msgID: res.MsgID, seq: res.Seq}
	pc.checkStored(acks)
}

// TestInProcessSlowLinkRedirects: the link from a to the owner b is slow
// (150 ms each way). A send from a client that follows redirects
// (sequencer.WithRedirects, set by the API edge) is answered at once with
// b's address once forwards measured the link, not sent; one from a client
// that does not is still forwarded. When the verdict ages out, a probe
// measures the link while the sends are still redirected; after the link
// heals, the next probe finds it fast and forwards resume.
func TestInProcessSlowLinkRedirects(t *testing.T) {
	pc, a, slow, conv := proxiedOwner(t, "slow")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	redirects := sequencer.WithRedirects(ctx)
	acks := map[string]acked{}
	send := func(ctx context.Context, key string) error {
		res, err := a.cn.Send(ctx, sequencer.SendRequest{ConvID: conv, FromUID: 7, ClientMsgID: key, MsgType: 1})
		if err == nil {
			acks[key] = acked{conv: conv, msgID: res.MsgID, seq: res.Seq}
		}
		return err
	}
	if err := send(redirects, "fast"); err != nil {
		t.Fatalf("send over a fast link: %v", err)
	}

	slow.delay.Store(int64(150 * time.Millisecond))
	// Three forwards measure the link (one slow forward among fast ones
	// does not make it slow: the average rises by 30% of the difference).
	for i := range 3 {
		if err := send(ctx, fmt.Sprintf("measures-%d", i)); err != nil {
			t.Fatalf("send over a slow link (no redirects): %v", err)
		}
	}
	err := send(redirects, "redirected")
	var oe *sequencer.OwnerElsewhere
	if sequencer.ErrorCode(err) != sequencer.CodeUnavailable || !errors.As(err, &oe) || oe.NodeID != "b" || oe.Addr != "api-b" {
		t.Fatalf("a redirectable send over a slow link: %v, want unavailable naming b at api-b", err)
	}
	if err := send(ctx, "forwarded"); err != nil {
		t.Fatalf("a send that cannot be redirected over the slow link: %v, want it forwarded", err)
	}
	// The verdict ages out (linkFresh): a probe measures the link again in
	// the background, and the sends are still redirected meanwhile, none of
	// them forwarded over the slow link to measure it.
	time.Sleep(linkFresh + 50*time.Millisecond) // let the verdict age out
	for i := range 5 {
		err := send(redirects, fmt.Sprintf("stale-%d", i))
		if !errors.As(err, &oe) {
			t.Fatalf("redirectable send %d after the verdict aged out, the link still slow: %v, want redirected", i, err)
		}
		time.Sleep(100 * time.Millisecond) // across the probe's 300 ms round trip
	}

	slow.delay.Store(0)
	// The verdict ages out again: a probe finds the link fast.
	testwait.For(t, 10*time.Second, 50*time.Millisecond, "forwards resume after the link healed", func() bool {
		err := send(redirects, "healed")
		if err != nil && !errors.As(err, &oe) {
			t.Fatalf("send after the link healed: %v", err)
		}
		return err == nil
	})
	if err := send(redirects, "after"); err != nil {
		t.Fatalf("send after the link measured fast again: %v", err)
	}
	// The redirected attempt stored nothing: its key is new to the owner.
	res, err := a.cn.Send(ctx, sequencer.SendRequest{ConvID: conv, FromUID: 7, ClientMsgID: "redirected", MsgType: 1})
	if err != nil || res.Duplicate {
		t.Fatalf("the redirected send's key: %+v %v, want a fresh store", res, err)
	}
	acks["redirected"] = acked{conv: conv, msgID: res.MsgID, seq: res.Seq}
	pc.checkStored(acks)
}

// countedPair starts nodes a (with options o, its forwards counted) and b
// on a fresh database and waits until they hold their partitions.
func countedPair(t *testing.T, o ipOptions) (pc *procCluster, a, b *ipNode, ct *countingTransport) {
	pc = newProcCluster(t)
	o.wrap = func(tr Transport) Transport {
		ct = &countingTransport{Transport: tr}
		return ct
	}
	a = pc.startInProcess("a", o)
	b = pc.startInProcess("b", ipOptions{})
	pc.waitInProcess(a, b)
	return pc, a, b, ct
}

// proxiedOwner starts nodes a and b, b's cluster link behind a holeProxy,
// and returns a conversation (named with prefix) that b owns.
func proxiedOwner(t *testing.T, prefix string) (*procCluster, *ipNode, *holeProxy, string) {
	pc := newProcCluster(t)
	a := pc.startInProcess("a", ipOptions{})
	listen := freeLoopback(t)
	proxy := newHoleProxy(t, listen)
	b := pc.startInProcess("b", ipOptions{listen: listen, advertise: proxy.ln.Addr().String()})
	pc.waitInProcess(a, b)
	return pc, a, proxy, convsOwnedBy(t, a, "b", prefix, 1)[0]
}

// freeLoopback returns a free 127.0.0.1 port's address.
func freeLoopback(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestInProcessOwnerCrashesMidForward: the owner of a conversation stops
// answering (its forward hangs) and then crashes; once it drops out of the
// membership, the forward is abandoned and the send is retried at the new
// owner (this node), not answered unavailable.
func TestInProcessOwnerCrashesMidForward(t *testing.T) {
	pc, a, b, ct := countedPair(t, ipOptions{})
	conv := convsOwnedBy(t, a, "b", "crash", 1)[0]
	ct.hang.Store(true)
	type result struct {
		res sequencer.SendResult
		err error
	}
	done := make(chan result, 1)
	req := sequencer.SendRequest{ConvID: conv, FromUID: 7, ClientMsgID: "mid-forward", MsgType: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		res, err := a.cn.Send(ctx, req)
		done <- result{res, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for ct.batches.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the forward never left")
		}
		time.Sleep(5 * time.Millisecond) // polling a condition: the forward is in flight
	}
	ct.batches.Store(0)
	b.crashed.Store(true)
	t0 := time.Now()
	b.cn.halt()
	t.Logf("halted in %v", time.Since(t0))
	r := <-done
	t.Logf("answered %v after the crash", time.Since(t0))
	if r.err != nil || r.res.Seq != 1 {
		t.Fatalf("send whose owner crashed mid-forward: %+v %v", r.res, r.err)
	}
	if loc, _ := a.cn.locate(conv); loc.NodeID != "a" {
		t.Fatalf("after the crash %s is owned by %s", conv, loc.NodeID)
	}
	pc.checkStored(map[string]acked{req.ClientMsgID: {conv: conv, msgID: r.res.MsgID, seq: r.res.Seq}})
}

// TestInProcessRefusedPeerIsPresumedDead: a node whose cluster port refuses
// connections (the process is gone, as after kill -9) is presumed dead by
// the peer whose forward it refused, once probes confirm it: its member row
// is removed and its partitions taken over long before its lease (60 s
// here) would run out, so the send is stored by the survivor.
func TestInProcessRefusedPeerIsPresumedDead(t *testing.T) {
	pc := newProcCluster(t)
	a := pc.startInProcess("a", ipOptions{memberTTL: time.Minute})
	b := pc.startInProcess("b", ipOptions{memberTTL: time.Minute})
	pc.waitInProcess(a, b)
	conv := convsOwnedBy(t, a, "b", "refused", 1)[0]
	b.crashed.Store(true)
	b.cn.halt() // its listener is closed: connections are refused
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := sequencer.SendRequest{ConvID: conv, FromUID: 7, ClientMsgID: "after-crash", MsgType: 1}
	var res sequencer.SendResult
	testwait.For(t, 20*time.Second, 20*time.Millisecond, "the send acked by the survivor", func() bool {
		var err error
		res, err = a.cn.Send(ctx, req)
		if err != nil && sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
			t.Fatalf("send while b is presumed dead: %v", err)
		}
		return err == nil
	})
	if loc, _ := a.cn.locate(conv); loc.NodeID != "a" {
		t.Fatalf("after b's port refused connections %s is owned by %s", conv, loc.NodeID)
	}
	v, err := pc.store.Cluster().View(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := v.Member("b"); ok {
		t.Fatal("b's row is still in the membership")
	}
	pc.checkStored(map[string]acked{req.ClientMsgID: {conv: conv, msgID: res.MsgID, seq: res.Seq}})
}

// TestInProcessForgedForwards plays an attacker on the cluster port of a
// node with mutual TLS: without a client certificate, with one of another
// CA, with a valid certificate but a batch that names no sender, and with
// invalid items. Each is refused and nothing is stored; a valid item next to
// the invalid ones is stored. A batch from a sender that is not a live
// member is routed by the receiver as its own clients' sends (one more hop
// at most).
func TestInProcessForgedForwards(t *testing.T) {
	pc := newProcCluster(t)
	ca := newTestCA(t, "cluster")
	other := newTestCA(t, "other")
	dir := t.TempDir()
	var files [3]string
	files[0], files[1], files[2] = ca.files(t, dir, "node")
	a := pc.startInProcess("a", ipOptions{tlsFiles: files})
	b := pc.startInProcess("b", ipOptions{tlsFiles: files})
	pc.waitInProcess(a, b)
	target := a.addr()
	conv := convsOwnedBy(t, a, "a", "f", 1)[0]
	item := func(c string) *clusterv1.ForwardItem {
		return &clusterv1.ForwardItem{ConvId: c, FromUid: 7, ClientMsgId: "forged-" + c, MsgType: 1, Body: []byte("hi")}
	}
	forge := func(tls *PeerTLS, b *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
		tr, err := NewConnectTransport(ConnectConfig{Listen: "127.0.0.1:0", TLS: tls, Logger: simLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return tr.Forward(ctx, target, b)
	}
	member := func() *clusterv1.ForwardBatch {
		return &clusterv1.ForwardBatch{FromNode: "b", FromIncarnation: b.incarnation(), Items: []*clusterv1.ForwardItem{item(conv)}}
	}

	// (a), (b): refused at the handshake.
	good, _, _ := ca.issue(t, "mallory")
	noCert := NewPeerTLS(good, ca.pool)
	noCert.Client.Certificates = nil
	wrong, _, _ := other.issue(t, "mallory")
	for name, tls := range map[string]*PeerTLS{
		"no client certificate":   noCert,
		"certificate of other CA": NewPeerTLS(wrong, ca.pool),
		"plain h2c":               nil,
	} {
		_, err := forge(tls, member())
		var re *RefusedError
		if err == nil || errors.As(err, &re) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// (c): a valid certificate, but a batch that names no sender: refused.
	mallory := NewPeerTLS(good, ca.pool)
	for name, bt := range map[string]*clusterv1.ForwardBatch{
		"no node id":     {FromIncarnation: "mallory/1", Items: []*clusterv1.ForwardItem{item(conv)}},
		"no incarnation": {FromNode: "b", Items: []*clusterv1.ForwardItem{item(conv)}},
	} {
		_, err := forge(mallory, bt)
		var re *RefusedError
		if !errors.As(err, &re) {
			t.Fatalf("%s: %v (want refused)", name, err)
		}
	}
	if n := pc.countRows(); n != 0 {
		t.Fatalf("%d rows stored by refused forwards", n)
	}
	// A sender that is not a live member (a node cut from the store
	// forwarding to its partitions' next owners) is served by the
	// receiver's own routing: stored only where the receiver holds the
	// partition, never forwarded again.
	theirs := convsOwnedBy(t, a, "b", "g", 1)[0]
	reply0, err := forge(mallory, &clusterv1.ForwardBatch{FromNode: "mallory", FromIncarnation: "mallory/1",
		Items: []*clusterv1.ForwardItem{item(conv), item(theirs)}})
	reply := reply0
	if err != nil {
		t.Fatal(err)
	}
	if r := reply.Results[0].GetResult(); r == nil || r.Seq != 1 {
		t.Fatalf("a's conversation from a non-member: %v", reply.Results[0])
	}
	// b's conversation: a routes a non-member's item as its own client's
	// send, one more hop, to b.
	if r := reply.Results[1].GetResult(); r == nil || r.Seq != 1 {
		t.Fatalf("b's conversation from a non-member, through a: %v (want stored by b)", reply.Results[1])
	}
	if n := pc.countRows(); n != 2 {
		t.Fatalf("%d rows stored, want the two items", n)
	}
	// (d): a member's identity, invalid items (each refused alone) next to
	// a valid one.
	bad := []*clusterv1.ForwardItem{
		{ConvId: conv, FromUid: 7, ClientMsgId: "big", MsgType: 1, Body: make([]byte, 3<<20)},
		{ConvId: conv, FromUid: 7, ClientMsgId: "neg-type", MsgType: -5},
		{ConvId: conv, FromUid: 7, ClientMsgId: "wide-type", MsgType: 70000},
		{ConvId: "g:\x01ctl", FromUid: 7, ClientMsgId: "ctl", MsgType: 1},
		{ConvId: strings.Repeat("c", 100), FromUid: 7, ClientMsgId: "long-conv", MsgType: 1},
		{ConvId: conv, FromUid: 0, ClientMsgId: "no-uid", MsgType: 1},
		{ConvId: conv, FromUid: 7, ClientMsgId: "", MsgType: 1},
	}
	bt := member()
	bt.Items = append(bad, item(conv))
	reply, err = forge(mallory, bt)
	if err != nil {
		t.Fatal(err)
	}
	if len(reply.Results) != len(bt.Items) {
		t.Fatalf("%d results for %d items", len(reply.Results), len(bt.Items))
	}
	for i, r := range reply.Results[:len(bad)] {
		f := r.GetFailure()
		if f == nil || sequencer.Code(f.Code) != sequencer.CodeInvalidArgument {
			t.Fatalf("invalid item %d (%s): %v", i, bad[i].ClientMsgId, r)
		}
	}
	ok := reply.Results[len(bad)].GetResult()
	if ok == nil || ok.Seq != 1 || !ok.Duplicate {
		t.Fatalf("valid item (stored before, by the non-member's batch): %v", reply.Results[len(bad)])
	}
	if n := pc.countRows(); n != 2 {
		t.Fatalf("%d rows stored, want only the valid item (and the non-member's two)", n)
	}
	pc.checkStored(map[string]acked{"forged-" + conv: {conv: conv, msgID: ok.MsgId, seq: ok.Seq},
		"forged-" + theirs: {conv: theirs, msgID: reply0.Results[1].GetResult().MsgId, seq: 1}})

	// The nodes themselves talk over mutual TLS: a send through b for a's
	// conversation is forwarded and stored.
	res, err := b.cn.Send(context.Background(), sequencer.SendRequest{ConvID: conv, FromUID: 7, ClientMsgID: "via-b", MsgType: 1})
	if err != nil || res.Seq != 2 {
		t.Fatalf("forward over mutual TLS: %+v %v", res, err)
	}
}

// TestInProcessWakeRateLimit: wake-ups beyond the per-sender budget are
// dropped (each accepted one makes the node read the membership table).
func TestInProcessWakeRateLimit(t *testing.T) {
	core, err := ownership.New(ownership.Config{NodeID: "n", MemberTTL: time.Second}, membership.Member{})
	if err != nil {
		t.Fatal(err)
	}
	n := &peerServer{router: &router{member: &member{core: core, wakeBeat: make(chan struct{}, 1)}}, wakes: map[string]*rate.Limiter{}}
	accepted := 0
	for range 1000 {
		n.HandleWake("10.0.0.9", &clusterv1.WakeRequest{FromNode: "flood"})
		select {
		case <-n.wakeBeat:
			accepted++
		default:
		}
	}
	if accepted > wakeBurst+2 || accepted == 0 {
		t.Fatalf("%d of 1000 wake-ups in a burst accepted (burst %d)", accepted, wakeBurst)
	}
}

// TestInProcessForwardThroughput measures durable sends/s on a 2-node
// cluster in one process (PostgreSQL, connect transport over 127.0.0.1):
// closed-loop senders calling the owner directly, then calling the other
// node (every send forwarded), as unary sends and as 50-item batches. It
// only runs with SEQUENCER_FORWARD_BENCH=1 (a measurement, not a check):
//
//	SEQUENCER_FORWARD_BENCH=1 go test -run TestInProcessForwardThroughput -v ./cluster/
func TestInProcessForwardThroughput(t *testing.T) {
	if os.Getenv("SEQUENCER_FORWARD_BENCH") == "" {
		t.Skip("measurement: set SEQUENCER_FORWARD_BENCH=1")
	}
	pc := newProcCluster(t)
	a := pc.startInProcess("a", ipOptions{})
	var ct *countingTransport // b's forwards: batches formed
	b := pc.startInProcess("b", ipOptions{wrap: func(tr Transport) Transport {
		ct = &countingTransport{Transport: tr}
		return ct
	}})
	pc.waitInProcess(a, b)
	convs := convsOwnedBy(t, a, "a", "bench", 1000)
	const batch = 50
	senders := 256
	if n, err := strconv.Atoi(os.Getenv("SEQUENCER_FORWARD_BENCH_SENDERS")); err == nil && n > 0 {
		senders = n
	}
	window := 5 * time.Second
	if d, err := time.ParseDuration(os.Getenv("SEQUENCER_FORWARD_BENCH_WINDOW")); err == nil {
		window = d
	}
	var run atomic.Int64
	measure := func(name string, via *ipNode, items int) float64 {
		r := run.Add(1)
		var acked atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), window)
		defer cancel()
		var wg sync.WaitGroup
		for g := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				reqs := make([]sequencer.SendRequest, items)
				out := make([]sequencer.SendOutcome, items)
				for i := 0; ctx.Err() == nil; i++ {
					for k := range reqs {
						reqs[k] = sequencer.SendRequest{ConvID: convs[(g*7+i*items+k)%len(convs)], FromUID: 7,
							ClientMsgID: fmt.Sprintf("%d-%d-%d-%d", r, g, i, k), MsgType: 1, Body: []byte("hello, world")}
					}
					if items == 1 {
						if _, err := via.cn.Send(ctx, reqs[0]); err == nil {
							acked.Add(1)
						}
						continue
					}
					via.cn.SendBatch(ctx, reqs, out)
					for _, o := range out {
						if o.Err == nil {
							acked.Add(1)
						}
					}
				}
			}()
		}
		start, cpu0, pg0, tx0 := time.Now(), processCPU(), backendsCPU(pc.dsn), xactCommits(t, pc.dsn)
		b0, i0 := ct.batches.Load(), ct.items.Load()
		wg.Wait()
		rate := float64(acked.Load()) / time.Since(start).Seconds()
		perSend := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(max(acked.Load(), 1)) }
		line := fmt.Sprintf("%-32s %8.0f sends/s, µs CPU/send: %5.1f this process (both nodes), %5.1f its PostgreSQL backends",
			name, rate, perSend(processCPU()-cpu0), perSend(backendsCPU(pc.dsn)-pg0))
		time.Sleep(time.Second) // PostgreSQL publishes its counters at most once a second
		line += fmt.Sprintf(", %.1f sends/transaction", float64(acked.Load())/float64(max(xactCommits(t, pc.dsn)-tx0, 1)))
		if nb := ct.batches.Load() - b0; nb > 0 {
			line += fmt.Sprintf(", %.1f items/forwarded batch", float64(ct.items.Load()-i0)/float64(nb))
		}
		t.Log(line)
		return rate
	}
	t.Logf("2 nodes in one process, %d closed-loop senders, %d conversations owned by a, %v each", senders, len(convs), window)
	// SEQUENCER_FORWARD_BENCH_ONLY runs one row (to profile it alone).
	switch os.Getenv("SEQUENCER_FORWARD_BENCH_ONLY") {
	case "unary-direct":
		measure("unary, direct to the owner", a, 1)
		return
	case "unary-forwarded":
		measure("unary, forwarded by the other", b, 1)
		return
	case "batches-direct":
		measure("batches of 50, direct", a, batch)
		return
	case "batches-forwarded":
		measure("batches of 50, forwarded", b, batch)
		return
	}
	du := measure("unary, direct to the owner", a, 1)
	fu := measure("unary, forwarded by the other", b, 1)
	db := measure("batches of 50, direct", a, batch)
	fb := measure("batches of 50, forwarded", b, batch)
	t.Logf("forwarded/direct: unary %.0f%%, batches %.0f%%", 100*fu/du, 100*fb/db)
}

// processCPU is the CPU time (user + system) this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// xactCommits is the database's count of committed transactions.
func xactCommits(t *testing.T, dsn string) int64 {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int64
	if err := c.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// backendsCPU is the CPU time used so far by the PostgreSQL backends
// serving the database of dsn, when they run on this machine (read from
// /proc by their process title; 0 otherwise).
func backendsCPU(dsn string) time.Duration {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return 0
	}
	dirs, _ := os.ReadDir("/proc")
	var ticks int64
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil || !strings.HasPrefix(string(cmd), "postgres: ") || !strings.Contains(string(cmd), " "+cfg.Database+" ") {
			continue
		}
		stat, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: utime and stime
		// are the 12th and 13th.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) > 12 {
			u, _ := strconv.ParseInt(f[11], 10, 64)
			s, _ := strconv.ParseInt(f[12], 10, 64)
			ticks += u + s
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ = 100 on Linux
}

// held counts the partitions n holds.
func (n *member) held() int { return read(n, (*ownership.Core).Held) }

// halt stops n as a crash would: no handoff, no removal of its row (it
// expires), the transport closed.
func (n *member) halt() {
	n.update((*ownership.Core).Left)
	if n.stopRecon != nil {
		n.stopRecon()
		<-n.reconDone
	}
	if n.stopBeat != nil {
		n.stopBeat()
		<-n.beatDone
	}
	_ = n.tr.Close()
}

// self is n's member record (its current incarnation).
func (n *member) self() membership.Member { return read(n, (*ownership.Core).Self) }

// parts is a copy of what n knows of every partition.
func (n *member) parts() []ownership.Part {
	n.mu.RLock()
	defer n.mu.RUnlock()
	ps := make([]ownership.Part, n.partitions)
	for p := range ps {
		ps[p] = n.core.Part(uint32(p))
	}
	return ps
}
