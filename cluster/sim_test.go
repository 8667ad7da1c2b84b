package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ownership"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
	"github.com/sequencer-im/sequencer/ring"
)

// The simulation runs whole cluster nodes in one process, each with the
// real writer stack (actor.Conversations: conversation actors, conv.Core,
// the group-commit writer) on ONE persist/memstore, which is both the
// message store and the membership table (commits are fenced against its
// partition leases inside the store, as on PostgreSQL). A fake clock plays
// the database's clock and the nodes' clocks, MemNetwork the network. The
// membership side runs in the test's goroutine: nothing heartbeats or
// reconciles in the background; the test decides when each node does (a
// "step"), when time passes, and who is frozen. A frozen node's commits can
// be held at its store's door (simGate): a batch in flight, fence taken,
// that reaches the store only after the node resumes.

const simPartitions = 31

var simRing = ring.Config{Partitions: simPartitions}

// simStore is the store every node commits to: one memstore, with every
// successful commit's fences logged in the store's commit order (commits
// are serialized here so that the log's order is the store's), and every
// refusal counted by kind.
type simStore struct {
	*memstore.Store

	mu         sync.Mutex
	commits    map[uint32][]persist.Fence // per partition, the fences of successful commits in order
	stale      int                        // commits refused for a stale fence
	mismatches int                        // commits refused for a head mismatch (a stale cached head)
}

func (d *simStore) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.Store.Commit(ctx, batches)
	switch {
	case err == nil:
		fences, _ := persist.Fences(batches)
		for _, f := range fences {
			d.commits[f.Partition] = append(d.commits[f.Partition], f)
		}
	case errors.Is(err, sequencer.ErrStaleEpoch):
		d.stale++
	case errors.Is(err, sequencer.ErrHeadMismatch):
		d.mismatches++
	}
	if os.Getenv("SIM_LOG") != "" {
		for _, b := range batches {
			if b.ConvID == os.Getenv("SIM_CONV") {
				fmt.Fprintf(os.Stderr, "COMMIT %s fence=%v prev=%d n=%d err=%v\n", b.ConvID, b.Fence, b.PrevHead, len(b.Messages), err)
			}
		}
	}
	return err
}

func (d *simStore) refusals() (stale, mismatches int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stale, d.mismatches
}

// simGate is one node's door to the store: while closed, the node's commits
// wait at it (fence taken, nothing sent yet), as a batch in flight does
// while its node is frozen; opening it lets them through.
type simGate struct {
	persist.ConvStore
	mu   sync.Mutex
	wait chan struct{} // non-nil while closed
	held int           // messages of the commits that arrived while closed
}

func (g *simGate) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	g.mu.Lock()
	wait := g.wait
	if wait != nil {
		for i := range batches {
			g.held += len(batches[i].Messages)
		}
	}
	g.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			// The writer gave up waiting: nothing reached the store.
			return fmt.Errorf("sim gate: %w: %w", sequencer.ErrStoreUnavailable, ctx.Err())
		}
	}
	return g.ConvStore.Commit(ctx, batches)
}

func (g *simGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.wait == nil {
		g.wait, g.held = make(chan struct{}), 0
	}
}

func (g *simGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.wait != nil {
		close(g.wait)
		g.wait = nil
	}
}

func (g *simGate) heldMessages() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// checkNotStored asserts that none of in's sends that got an error answer
// is stored (an error answer is final).
func (s *sim) checkNotStored(in *inflight) {
	s.t.Helper()
	for _, a := range in.errs {
		if m, err := s.db.FindByClientKey(context.Background(), a.Key()); err == nil {
			s.t.Fatalf("send %v was answered with an error but is stored at seq %d", a.Key(), m.Seq)
		}
	}
}

// simIDs hands out msg_ids unique across the simulated nodes (the worker-id
// leases of real nodes do that).
type simIDs struct{ last *atomic.Uint64 }

func (i simIDs) NextID() (uint64, error) { return i.last.Add(1), nil }

// simLocal is one node's writer: the real actor.Conversations, counting the
// node's StopConversations calls.
type simLocal struct {
	*actor.Conversations
	stops atomic.Int32
}

func (l *simLocal) StopConversations(ctx context.Context, match func(string) bool) error {
	l.stops.Add(1)
	return l.Conversations.StopConversations(ctx, match)
}

// simAnswer is one send's answer.
type simAnswer struct {
	req sequencer.SendRequest
	res sequencer.SendResult
	err error
}

// inflight is a node's sends whose commits its closed gate holds: a batch
// in flight while the node is frozen.
type inflight struct {
	sn      *simNode
	answers chan simAnswer
	n       int
	errs    []sequencer.SendRequest // the sends answered with an error (land)
}

// startInflight closes sn's gate and sends one message to each of convs
// through sn (its own conversations: the sends reach its writer), each in
// its own goroutine; it returns once every send is held at the gate or
// answered (refused before any commit).
func (s *sim) startInflight(sn *simNode, convs []string) *inflight {
	s.t.Helper()
	sn.gate.close()
	in := &inflight{sn: sn, answers: make(chan simAnswer, len(convs)), n: len(convs)}
	for _, c := range convs {
		s.seq++
		req := sequencer.SendRequest{ConvID: c, FromUID: 9, ClientMsgID: fmt.Sprintf("f%d", s.seq), MsgType: 1}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := sn.node.Send(ctx, req)
			in.answers <- simAnswer{req, res, err}
		}()
	}
	// Each send is either held (its message waits at the gate, in a
	// commit of its own or shared with others) or answered.
	deadline := time.Now().Add(30 * time.Second)
	var early []simAnswer
	for {
		select {
		case a := <-in.answers:
			early = append(early, a)
			continue
		default:
		}
		if sn.gate.heldMessages()+len(early) == len(convs) {
			break
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("sends to %s neither held at its store nor answered within 30s", sn.id)
		}
		time.Sleep(time.Millisecond)
	}
	for _, a := range early {
		in.answers <- a
	}
	return in
}

// land opens the gate and waits for every answer: the acked ones are
// recorded (s.acked), the errors returned.
func (s *sim) land(in *inflight) (landed int, errs []error) {
	s.t.Helper()
	in.sn.gate.open()
	for range in.n {
		select {
		case a := <-in.answers:
			if a.err != nil {
				if !sequencer.ErrorCode(a.err).Retryable() {
					s.t.Fatalf("send %v in flight on %s: non-retryable error %v", a.req.Key(), in.sn.id, a.err)
				}
				errs = append(errs, a.err)
				in.errs = append(in.errs, a.req)
				continue
			}
			s.acked[a.req.Key()] = a.res
			landed++
		case <-time.After(time.Minute):
			s.t.Fatalf("a send in flight on %s was not answered within a minute after its commit was let through", in.sn.id)
		}
	}
	s.inLanded += landed
	s.inRefused += len(errs)
	s.check()
	return landed, errs
}

// sim is a cluster under test.
type sim struct {
	t           testing.TB
	handoffWait time.Duration // nodes' HandoffWait; 0 means 1ms
	clk         *clock.Fake
	db          *simStore       // messages and the membership table
	mem         *membership.Mem // db's membership table (Fail injects outages)
	audit       *auditStore     // the membership table as the nodes see it
	ids         *atomic.Uint64  // the last msg_id handed out
	net         *MemNetwork
	nodes       map[string]*simNode
	order       []string // creation order
	seq         int
	acked       map[sequencer.ClientKey]sequencer.SendResult
	inLanded    int                                     // sends in flight at a freeze that landed after it
	inRefused   int                                     // ... that were refused (stale fence, or not writable)
	wrap        func(id string, tr Transport) Transport // optional: wraps each node's transport
	issuers     map[string]IDIssuer                     // optional: a node's Config.IDs
}

type simNode struct {
	id     string
	node   *Node
	local  *simLocal
	gate   *simGate
	frozen bool
	dead   bool // crashed or left: never stepped again
	// superseded: a newer process took this node id; it may still hand out
	// fences until it notices (the store refuses them), so the one-writer
	// check counts only the store's answer for it.
	superseded bool
}

func newSim(t testing.TB) *sim {
	clk := clock.NewFake(time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC))
	db := &simStore{Store: memstore.NewWithClock(clk), commits: map[uint32][]persist.Fence{}}
	s := &sim{t: t, clk: clk, db: db, mem: db.Mem, ids: new(atomic.Uint64),
		net:   &MemNetwork{IgnoreWakes: true, handlers: map[string]Handler{}, down: map[string]bool{}},
		nodes: map[string]*simNode{}, acked: map[sequencer.ClientKey]sequencer.SendResult{}}
	s.audit = &auditStore{Store: db.Mem, t: t}
	return s
}

func (s *sim) cfg(id string) Config {
	return Config{
		NodeID:      id,
		Store:       s.audit,
		Transport:   s.transport(id, s.net.Transport("sim://"+id+fmt.Sprintf("/%d", s.seq))),
		APIAddr:     "api://" + id,
		Ring:        simRing,
		MemberTTL:   5 * time.Second,
		Heartbeat:   time.Second,
		HandoffWait: max(s.handoffWait, time.Millisecond),
		StopTimeout: time.Second,
		IDs:         s.issuers[id],
		Clock:       s.clk,
		Logger:      simLogger(),
	}
}

// transport is node id's transport: tr, or wrapped by s.wrap.
func (s *sim) transport(id string, tr Transport) Transport {
	if s.wrap != nil {
		return s.wrap(id, tr)
	}
	return tr
}

func simLogger() *slog.Logger {
	if os.Getenv("SIM_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// start starts a node named id (a new process: a fresh incarnation that
// takes over a predecessor with the same id), with its own conversation
// actors and group-commit writer on the shared store.
func (s *sim) start(id string) *simNode {
	s.t.Helper()
	s.seq++
	n, err := New(s.cfg(id))
	if err != nil {
		s.t.Fatal(err)
	}
	gate := &simGate{ConvStore: s.db}
	convs, err := actor.NewConversations(actor.Config{Store: gate, IDs: simIDs{s.ids}, Clock: s.clk, Ownership: n, Logger: simLogger()})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		gate.open()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := convs.Close(ctx); err != nil {
			s.t.Errorf("close %s's conversations: %v", id, err)
		}
	})
	l := &simLocal{Conversations: convs}
	if err := n.start(context.Background(), l); err != nil {
		s.t.Fatalf("start %s: %v", id, err)
	}
	sn := &simNode{id: id, node: n, local: l, gate: gate}
	if _, ok := s.nodes[id]; !ok {
		s.order = append(s.order, id)
	}
	s.nodes[id] = sn
	s.check()
	return sn
}

// step runs one heartbeat and one reconcile round on node id.
func (s *sim) step(id string) {
	s.t.Helper()
	sn := s.nodes[id]
	if sn.frozen || sn.dead {
		return
	}
	ctx := context.Background()
	sn.node.beat(ctx)
	s.check()
	sn.node.reconcile(ctx)
	s.check()
}

// round lets a heartbeat interval pass and steps every running node.
func (s *sim) round() {
	s.t.Helper()
	s.clk.Advance(time.Second)
	for _, id := range s.order {
		s.step(id)
	}
}

func (s *sim) freeze(id string, frozen bool) {
	sn := s.nodes[id]
	if os.Getenv("SIM_LOG") != "" {
		fmt.Fprintf(os.Stderr, "FREEZE %s %v\n", id, frozen)
	}
	sn.frozen = frozen
	s.net.SetDown(sn.node.self().ClusterAddr, frozen)
}

// settle runs rounds until every running node holds exactly what the ring
// gives it, failing after max rounds.
func (s *sim) settle(max int) {
	s.t.Helper()
	for i := 0; i < max; i++ {
		if s.settled() {
			return
		}
		s.round()
	}
	if !s.settled() {
		s.t.Fatalf("not settled after %d rounds:\n%s", max, s.dump())
	}
}

func (s *sim) running() []*simNode {
	var ns []*simNode
	for _, id := range s.order {
		if sn := s.nodes[id]; !sn.dead && !sn.frozen {
			ns = append(ns, sn)
		}
	}
	return ns
}

func (s *sim) settled() bool {
	v, err := s.mem.View(context.Background())
	if err != nil {
		return false
	}
	r, err := ring.New(v.RingNodes(), simRing)
	if err != nil {
		return false
	}
	run := s.running()
	for _, m := range v.Members {
		if !slices.ContainsFunc(run, func(sn *simNode) bool {
			return sn.id == m.NodeID && read(sn.node.member, (*ownership.Core).Self).Incarnation == m.Incarnation
		}) {
			return false // a crashed or frozen member has not expired yet
		}
	}
	for _, sn := range run {
		sn.node.mu.RLock()
		c := sn.node.core
		ok := c.Phase() == ownership.PhaseActive && c.View().Version == v.Version
		owned := r.OwnedBy(sn.id)
		for p := range c.Partitions() {
			st := c.Part(uint32(p))
			want := slices.Contains(owned, uint32(p))
			if st.Held != want || st.HandingOff {
				ok = false
			}
		}
		sn.node.mu.RUnlock()
		if !ok {
			return false
		}
	}
	return true
}

func (s *sim) dump() string {
	var b []byte
	v, _ := s.mem.View(context.Background())
	b = fmt.Appendf(b, "store version %d, members:", v.Version)
	for _, m := range v.Members {
		b = fmt.Appendf(b, " %s(%s leaving=%v)", m.NodeID, m.Incarnation, m.Leaving)
	}
	b = fmt.Appendf(b, "\n")
	for _, id := range s.order {
		sn := s.nodes[id]
		n := sn.node
		n.mu.RLock()
		c := n.core
		b = fmt.Appendf(b, "%s: phase=%s frozen=%v dead=%v version=%d held=%d trouble=%s\n", id, c.Phase(), sn.frozen, sn.dead, c.View().Version, c.Held(), c.Trouble())
		n.mu.RUnlock()
	}
	return string(b)
}

// convIn returns a conversation id in partition p.
func convIn(p uint32) string {
	for i := 0; ; i++ {
		c := fmt.Sprintf("c%d", i)
		if ring.PartitionOf(c, simPartitions) == p {
			return fmt.Sprintf("c%d", i)
		}
	}
}

var simConvs = func() []string {
	cs := make([]string, simPartitions)
	for p := range cs {
		cs[p] = convIn(uint32(p))
	}
	return cs
}()

// check asserts the invariants that hold after every step:
//   - at most one node can get a fence for a partition (one writer);
//   - the commits of each partition carry non-decreasing epochs, and one
//     epoch belongs to one owner (the store fenced every stale writer);
//   - lease epochs never go down (auditStore also checks that nothing is
//     taken from a live owner that did not release it).
func (s *sim) check() {
	s.t.Helper()
	for p := range simPartitions {
		var holders []string
		for _, id := range s.order {
			if s.nodes[id].superseded {
				continue
			}
			if f, err := s.nodes[id].node.Fence(simConvs[p]); err == nil {
				holders = append(holders, fmt.Sprintf("%s(%s@%d)", id, f.Owner, f.Epoch))
			}
		}
		if len(holders) > 1 {
			s.t.Fatalf("partition %d: %d nodes can write it: %v\n%s", p, len(holders), holders, s.dump())
		}
	}
	s.db.mu.Lock()
	for p, fs := range s.db.commits {
		owners := map[uint64]string{}
		for i, f := range fs {
			if i > 0 && f.Epoch < fs[i-1].Epoch {
				s.t.Fatalf("partition %d: commit at epoch %d after one at %d", p, f.Epoch, fs[i-1].Epoch)
			}
			if o, ok := owners[f.Epoch]; ok && o != f.Owner {
				s.t.Fatalf("partition %d epoch %d written by %s and %s", p, f.Epoch, o, f.Owner)
			}
			owners[f.Epoch] = f.Owner
		}
	}
	mismatches := s.db.mismatches
	s.db.mu.Unlock()
	if mismatches > 0 {
		s.t.Fatalf("%d commits carried a stale cached head (a writer kept a head across a handoff)\n%s", mismatches, s.dump())
	}
	for _, conv := range simConvs {
		rows := s.rows(conv)
		for i, m := range rows {
			if m.Seq != uint64(i+1) {
				s.t.Fatalf("conv %s: row %d has seq %d (not contiguous)", conv, i, m.Seq)
			}
		}
		if h := s.head(conv); h != uint64(len(rows)) {
			s.t.Fatalf("conv %s: head %d with %d rows", conv, h, len(rows))
		}
	}
}

// rows returns the stored rows of conv, ascending by seq.
func (s *sim) rows(conv string) []sequencer.Message {
	s.t.Helper()
	ms, err := s.db.ReadRange(context.Background(), conv, 0, 1<<20)
	if err != nil {
		s.t.Fatalf("read %s: %v", conv, err)
	}
	return ms
}

// head returns the stored head of conv.
func (s *sim) head(conv string) uint64 {
	s.t.Helper()
	h, err := s.db.LoadHead(context.Background(), conv)
	if err != nil {
		s.t.Fatalf("head of %s: %v", conv, err)
	}
	return h
}

// send sends one new message through node via; it returns the error. A
// send whose owner is frozen or crashed gets no answer (a forward is retried
// until the context ends, which is not an answer either), so it gets a short
// deadline; every other send gets a generous one, since the race detector
// and a loaded machine can slow the writer's goroutines a lot.
func (s *sim) send(via string, conv string) error {
	s.t.Helper()
	timeout := 10 * time.Second
	if loc, err := s.nodes[via].node.locate(conv); err != nil || s.away(loc.NodeID) {
		timeout = 20 * time.Millisecond
	}
	return s.sendWithin(via, conv, timeout)
}

// away reports whether node id is frozen, crashed or unknown.
func (s *sim) away(id string) bool {
	sn, ok := s.nodes[id]
	return !ok || sn.frozen || sn.dead
}

// sendWithin is send with a given timeout.
func (s *sim) sendWithin(via string, conv string, timeout time.Duration) error {
	s.t.Helper()
	s.seq++
	req := sequencer.SendRequest{ConvID: conv, FromUID: 7, ClientMsgID: fmt.Sprintf("m%d", s.seq), MsgType: 1}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := s.nodes[via].node.Send(ctx, req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if !sequencer.ErrorCode(err).Retryable() {
			s.t.Fatalf("send via %s to %s: non-retryable error %v (code %v)", via, conv, err, sequencer.ErrorCode(err))
		}
		s.check()
		return err
	}
	s.acked[req.Key()] = res
	s.check()
	return nil
}

// checkAcked asserts every acked send is stored at its seq with its msg_id,
// and that no msg_id is stored twice.
func (s *sim) checkAcked() {
	s.t.Helper()
	ctx := context.Background()
	ids := map[uint64]bool{}
	for _, conv := range simConvs {
		for _, m := range s.rows(conv) {
			if ids[m.MsgID] {
				s.t.Fatalf("msg_id %d stored twice", m.MsgID)
			}
			ids[m.MsgID] = true
		}
	}
	for k, res := range s.acked {
		m, err := s.db.FindByClientKey(ctx, k)
		if err != nil || m.Seq != res.Seq || m.MsgID != res.MsgID {
			s.t.Fatalf("acked %v as seq %d msg_id %d, stored %+v (%v)", k, res.Seq, res.MsgID, m, err)
		}
	}
}

// auditStore checks, from outside the store, that Acquire never takes a
// lease from a live owner other than the caller, and that epochs only grow.
type auditStore struct {
	membership.Store
	t      testing.TB
	mu     sync.Mutex
	epochs map[uint32]uint64
	takes  int
}

func (a *auditStore) Acquire(ctx context.Context, inc string, version uint64, ps []uint32) ([]membership.PartitionLease, error) {
	before, err := a.Store.View(ctx)
	if err != nil {
		return nil, err
	}
	taken, err := a.Store.Acquire(ctx, inc, version, ps)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.epochs == nil {
		a.epochs = map[uint32]uint64{}
	}
	for _, l := range taken {
		prev, _ := before.Lease(l.Partition)
		if prev.Owner != "" && prev.Owner != inc && before.Live(prev.Owner) {
			a.t.Errorf("partition %d taken by %s from live owner %s that did not release it", l.Partition, inc, prev.Owner)
		}
		if l.Epoch <= prev.Epoch || l.Epoch <= a.epochs[l.Partition] {
			a.t.Errorf("partition %d: epoch %d after %d", l.Partition, l.Epoch, max(prev.Epoch, a.epochs[l.Partition]))
		}
		a.epochs[l.Partition] = l.Epoch
		a.takes++
	}
	return taken, err
}

func TestSimJoinSpreadsPartitions(t *testing.T) {
	s := newSim(t)
	s.start("a")
	s.settle(3)
	if got := s.nodes["a"].node.held(); got != simPartitions {
		t.Fatalf("a alone holds %d partitions, want %d", got, simPartitions)
	}
	for p := range simPartitions {
		if err := s.send("a", simConvs[p]); err != nil {
			t.Fatalf("send to partition %d on a single node: %v", p, err)
		}
	}
	s.start("b")
	s.start("c")
	s.settle(6)
	total := 0
	for _, id := range []string{"a", "b", "c"} {
		h := s.nodes[id].node.held()
		if h == 0 {
			t.Fatalf("%s holds no partition after joining\n%s", id, s.dump())
		}
		total += h
	}
	if total != simPartitions {
		t.Fatalf("%d partitions held in total, want %d", total, simPartitions)
	}
	// Sends through any node reach the owner and continue each conversation.
	for i, p := range []int{0, 5, 11, 30} {
		via := []string{"a", "b", "c"}[i%3]
		if err := s.send(via, simConvs[p]); err != nil {
			t.Fatalf("send via %s to partition %d: %v", via, p, err)
		}
		if h := s.head(simConvs[p]); h != 2 {
			t.Fatalf("partition %d conversation head %d, want 2", p, h)
		}
	}
	s.checkAcked()
}

func TestSimLiveOwnerKeepsPartitionUntilItReleases(t *testing.T) {
	s := newSim(t)
	s.start("a")
	s.settle(3)
	s.start("b")
	// b knows the ring gives it partitions, but a has not released them: b
	// must take nothing from a live owner.
	s.step("b")
	if got := s.nodes["b"].node.held(); got != 0 {
		t.Fatalf("b took %d partitions before a released any", got)
	}
	s.step("a") // a hands off
	s.step("b") // b takes them
	s.settle(3)
	if s.nodes["b"].node.held() == 0 {
		t.Fatal("b holds nothing after a handed off")
	}
}

func TestSimGracefulLeave(t *testing.T) {
	s := newSim(t)
	for _, id := range []string{"a", "b", "c"} {
		s.start(id)
	}
	s.settle(6)
	for p := range simPartitions {
		if err := s.send("a", simConvs[p]); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	b := s.nodes["b"]
	heldB := b.node.held()
	if err := b.node.Leave(context.Background()); err != nil {
		t.Fatalf("leave: %v", err)
	}
	b.dead = true
	s.check()
	if got := b.node.held(); got != 0 {
		t.Fatalf("b holds %d partitions after leaving", got)
	}
	if b.local.stops.Load() == 0 {
		t.Fatal("b stopped no conversations while handing off")
	}
	if _, err := b.node.Send(context.Background(), sequencer.SendRequest{ConvID: "x", FromUID: 1, ClientMsgID: "y", MsgType: 1}); !errors.Is(err, sequencer.ErrShuttingDown) {
		t.Fatalf("send on a left node: %v, want ErrShuttingDown", err)
	}
	if b.node.Serving() == nil {
		t.Fatal("a left node reports ready")
	}
	v, _ := s.mem.View(context.Background())
	if _, ok := v.Member("b"); ok {
		t.Fatal("b's member row is still there after Leave")
	}
	// The others take b's partitions in one round, without waiting for any
	// lease to expire.
	s.round()
	s.settle(2)
	if s.audit.takes == 0 || heldB == 0 {
		t.Fatal("nothing was handed over")
	}
	for p := range simPartitions {
		if err := s.send("c", simConvs[p]); err != nil {
			t.Fatalf("send to partition %d after b left: %v", p, err)
		}
		if h := s.head(simConvs[p]); h != 2 {
			t.Fatalf("partition %d head %d, want 2", p, h)
		}
	}
	s.checkAcked()
}

func TestSimCrashTakenOverAfterTTL(t *testing.T) {
	s := newSim(t)
	for _, id := range []string{"a", "b", "c"} {
		s.start(id)
	}
	s.settle(6)
	for p := range simPartitions {
		if err := s.send("a", simConvs[p]); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	c := s.nodes["c"]
	owned := c.node.held()
	c.dead = true // crashed: never heartbeats again
	s.net.SetDown(c.node.self().ClusterAddr, true)
	// Before the TTL runs out, nobody takes c's partitions.
	for range 4 {
		s.round()
		for _, id := range []string{"a", "b"} {
			for p, st := range s.nodes[id].node.parts() {
				if st.Held && c.node.parts()[p].Held {
					t.Fatalf("%s took partition %d while c's lease was live", id, p)
				}
			}
		}
	}
	// A send to one of c's conversations fails retryably meanwhile.
	var cp uint32
	for p, st := range c.node.parts() {
		if st.Held {
			cp = uint32(p)
			break
		}
	}
	if err := s.send("a", simConvs[cp]); err == nil {
		t.Fatal("a send to a crashed owner's partition succeeded before takeover")
	}
	s.settle(4)
	if owned == 0 {
		t.Fatal("c held nothing")
	}
	for p := range simPartitions {
		if err := s.send("b", simConvs[p]); err != nil {
			t.Fatalf("send to partition %d after takeover: %v", p, err)
		}
		if h := s.head(simConvs[p]); h != 2 {
			t.Fatalf("partition %d head %d, want 2 (continues after failover)", p, h)
		}
	}
	s.checkAcked()
}

func TestSimZombieIsFencedAndStepsDown(t *testing.T) {
	s := newSim(t)
	for _, id := range []string{"a", "b"} {
		s.start(id)
	}
	s.settle(6)
	b := s.nodes["b"]
	bp := heldParts(b)
	oldInc := b.node.self().Incarnation
	// b has a batch in flight (fence taken, commit not yet in the store)
	// when it freezes.
	zombie := s.startInflight(b, []string{simConvs[bp[0]], simConvs[bp[1]]})
	s.freezePastTTL("b")
	a := s.nodes["a"]
	if got := a.node.held(); got != simPartitions {
		t.Fatalf("a holds %d partitions after b expired, want all %d\n%s", got, simPartitions, s.dump())
	}
	for _, p := range bp[:2] {
		if err := s.send("a", simConvs[p]); err != nil {
			t.Fatalf("send on the new owner: %v", err)
		}
	}
	// b resumes: its lease view is stale, so it hands out no fence; its
	// in-flight batch is refused by the store.
	s.freeze("b", false)
	if _, err := b.node.Fence(simConvs[bp[0]]); !errors.Is(err, sequencer.ErrNotOwner) {
		t.Fatalf("resumed zombie's Fence: %v, want ErrNotOwner", err)
	}
	stale, _ := s.db.refusals()
	// Each is refused by the store for its stale fence; the zombie, which
	// can write nothing, then answers it or sends it on to the
	// partition's next owner (a), which stores it (s.land checks every
	// ack against the store).
	landed, errs := s.land(zombie)
	if landed+len(errs) != 2 {
		t.Fatalf("zombie's in-flight batch: %d landed, errors %v", landed, errs)
	}
	for _, err := range errs {
		if sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
			t.Fatalf("zombie's send answered %v (code %v), want unavailable (not stored)", err, sequencer.ErrorCode(err))
		}
	}
	if now, _ := s.db.refusals(); now == stale {
		t.Fatal("the zombie's in-flight commit was not refused by the store for its stale fence")
	}
	s.checkNotStored(zombie)
	stopsBefore := b.local.stops.Load()
	s.step("b") // notices: steps down, rejoins as a new incarnation
	if b.node.self().Incarnation == oldInc {
		t.Fatal("zombie kept its incarnation after stepping down")
	}
	if b.local.stops.Load() == stopsBefore {
		t.Fatal("zombie did not stop its conversations when stepping down")
	}
	s.settle(6)
	if b.node.held() == 0 {
		t.Fatal("rejoined node got no partitions back")
	}
	for _, p := range bp[:2] {
		before := s.head(simConvs[p]) // 1 (a's send) + the zombie's in-flight send if a stored it for it
		if err := s.send("b", simConvs[p]); err != nil {
			t.Fatalf("send after the zombie rejoined: %v", err)
		}
		if h := s.head(simConvs[p]); h != before+1 || before > 2 {
			t.Fatalf("partition %d head %d after %d, want one more (zombie's own write refused, the new owner's kept)", p, h, before)
		}
	}
	s.checkAcked()
}

// heldParts is the partitions sn holds, ascending.
func heldParts(sn *simNode) []uint32 {
	var ps []uint32
	for p, st := range sn.node.parts() {
		if st.Held {
			ps = append(ps, uint32(p))
		}
	}
	return ps
}

// freezePastTTL freezes node id and runs rounds past its 5 s member TTL.
func (s *sim) freezePastTTL(id string) {
	s.freeze(id, true)
	for range 7 {
		s.round()
	}
}

// simIssuer is a node's msg_id issuer (Config.IDs) that a test blocks.
type simIssuer struct {
	blocked atomic.Bool
	kicks   atomic.Int32
}

func (i *simIssuer) Issuable() error {
	if i.blocked.Load() {
		return sequencer.ErrWorkerLeaseLost
	}
	return nil
}

func (i *simIssuer) Kick() { i.kicks.Add(1) }

// A node presumed dead that cannot issue msg_ids yet (its worker-id
// reservation ran out during the cut and is not renewed yet) steps down
// but does not rejoin: its peer keeps serving its partitions, and its
// sends go there, until it can issue ids. It kicks the issuer meanwhile.
func TestSimRejoinWaitsForMsgIDs(t *testing.T) {
	s := newSim(t)
	ids := &simIssuer{}
	s.issuers = map[string]IDIssuer{"b": ids}
	for _, id := range []string{"a", "b"} {
		s.start(id)
	}
	s.settle(6)
	b := s.nodes["b"]
	bp := heldParts(b)
	oldInc := b.node.self().Incarnation
	s.freezePastTTL("b")
	a := s.nodes["a"]
	if got := a.node.held(); got != simPartitions {
		t.Fatalf("a holds %d partitions after b expired, want all %d\n%s", got, simPartitions, s.dump())
	}
	ids.blocked.Store(true)
	s.freeze("b", false)
	for range 4 {
		s.round()
		if inc := b.node.self().Incarnation; inc != oldInc {
			t.Fatalf("b rejoined as %s while it could not issue msg_ids", inc)
		}
		if b.node.held() != 0 || a.node.held() != simPartitions {
			t.Fatalf("partitions moved while b could not issue msg_ids:\n%s", s.dump())
		}
	}
	if ids.kicks.Load() == 0 {
		t.Fatal("b never kicked its issuer while its rejoin waited for it")
	}
	// Its conversations are served by a meanwhile, through b too.
	for _, p := range bp[:2] {
		if err := s.send("b", simConvs[p]); err != nil {
			t.Fatalf("send through b while it waits to rejoin: %v", err)
		}
	}
	ids.blocked.Store(false)
	s.settle(6)
	if b.node.self().Incarnation == oldInc || b.node.held() == 0 {
		t.Fatalf("b did not rejoin and take its partitions back once it could issue msg_ids:\n%s", s.dump())
	}
	for _, p := range bp[:2] {
		if err := s.send("b", simConvs[p]); err != nil {
			t.Fatalf("send after b rejoined: %v", err)
		}
	}
	s.checkAcked()
}

func TestSimRestartWithSameNodeIDSupersedesOldProcess(t *testing.T) {
	s := newSim(t)
	s.start("a")
	s.start("b")
	s.settle(6)
	old := s.nodes["b"]
	for p := range simPartitions {
		if err := s.send("a", simConvs[p]); err != nil {
			t.Fatal(err)
		}
	}
	var bp uint32
	for p, st := range old.node.parts() {
		if st.Held {
			bp = uint32(p)
			break
		}
	}
	inflight := s.startInflight(old, []string{simConvs[bp]})
	// A new process starts with node id b while the old one still runs
	// (e.g. it was SIGSTOPped and a supervisor started another).
	oldNode := old.node
	s.net.SetDown(oldNode.self().ClusterAddr, true)
	old.id, old.dead, old.superseded = "b-old", true, true
	delete(s.nodes, "b")
	s.nodes["b-old"] = old
	s.order = slices.DeleteFunc(s.order, func(id string) bool { return id == "b" })
	s.order = append(s.order, "b-old")
	nb := s.start("b")
	s.settle(4)
	stale, _ := s.db.refusals()
	if landed, errs := s.land(inflight); landed != 0 || len(errs) != 1 || sequencer.ErrorCode(errs[0]) != sequencer.CodeUnavailable {
		t.Fatalf("old process's in-flight commit: landed %d errs %v", landed, errs)
	}
	if now, _ := s.db.refusals(); now == stale {
		t.Fatal("the old process's in-flight commit was not refused by the store for its stale fence")
	}
	s.checkNotStored(inflight)
	// The old process notices it was superseded and stays out for good.
	s.nodes["b-old"].dead = false
	s.step("b-old")
	s.step("b-old")
	if err := oldNode.Serving(); err == nil {
		t.Fatal("superseded process reports ready")
	}
	if oldNode.held() != 0 {
		t.Fatal("superseded process still holds partitions")
	}
	select {
	case <-oldNode.Superseded():
	default:
		t.Fatal("Superseded() not closed: the process would not exit")
	}
	if _, err := oldNode.Send(context.Background(), sequencer.SendRequest{ConvID: simConvs[bp], FromUID: 3, ClientMsgID: "x", MsgType: 1}); err == nil {
		t.Fatal("superseded process accepted a send")
	}
	s.nodes["b-old"].dead = true
	v, _ := s.mem.View(context.Background())
	if m, ok := v.Member("b"); !ok || m.Incarnation != nb.node.self().Incarnation {
		t.Fatalf("member row b is %+v, want the new process's", m)
	}
	if err := s.send("a", simConvs[bp]); err != nil {
		t.Fatal(err)
	}
	if h := s.head(simConvs[bp]); h != 2 {
		t.Fatalf("head %d, want 2", h)
	}
	s.checkAcked()
}

// A node presumed dead steps down and rejoins; if another process took its
// node id in between, the rejoin is refused and the node is out for good:
// Superseded() is closed so the process exits.
func TestSimRejoinRefusedSupersedes(t *testing.T) {
	s := newSim(t)
	s.start("a")
	s.start("b")
	s.settle(6)
	old := s.nodes["b"]
	oldNode := old.node
	s.freeze("b", true)
	for range 7 { // past the 5 s TTL: b's row expires, a takes its partitions
		s.round()
	}
	s.freeze("b", false)
	ctx := context.Background()
	oldNode.beat(ctx) // presumed dead: trouble, not yet acted on
	// Before it rejoins, a supervisor starts another process as b.
	old.id, old.superseded = "b-old", true
	delete(s.nodes, "b")
	s.nodes["b-old"] = old
	s.order = slices.DeleteFunc(s.order, func(id string) bool { return id == "b" })
	s.order = append(s.order, "b-old")
	nb := s.start("b")
	oldNode.reconcile(ctx) // step down, rejoin refused
	s.check()
	oldNode.reconcile(ctx) // out for good
	s.check()
	select {
	case <-oldNode.Superseded():
	default:
		t.Fatalf("Superseded() not closed after the rejoin was refused:\n%s", s.dump())
	}
	if err := oldNode.Serving(); err == nil {
		t.Fatal("superseded process reports ready")
	}
	old.dead = true
	s.settle(6)
	v, _ := s.mem.View(ctx)
	if m, ok := v.Member("b"); !ok || m.Incarnation != nb.node.self().Incarnation {
		t.Fatalf("member row b is %+v, want the new process's", m)
	}
	s.checkAcked()
}

func TestSimStoreOutageKeepsSafety(t *testing.T) {
	s := newSim(t)
	s.start("a")
	s.start("b")
	s.settle(6)
	// The table is unreachable for longer than the TTL: every node stops
	// handing out fences (it cannot prove its lease), then recovers.
	var down bool
	s.mem.Fail = func(op string) error {
		if down {
			return errors.New("sim: store unreachable")
		}
		return nil
	}
	down = true
	for range 7 {
		s.round()
	}
	for _, id := range []string{"a", "b"} {
		if _, err := s.nodes[id].node.Fence(simConvs[0]); err == nil {
			t.Fatalf("%s hands out fences after its lease could not be renewed for longer than the TTL", id)
		}
		if s.nodes[id].node.Serving() == nil {
			t.Fatalf("%s is ready without renewing its lease", id)
		}
	}
	down = false
	s.settle(8)
	for p := range simPartitions {
		if err := s.send("b", simConvs[p]); err != nil {
			t.Fatalf("send after the outage: %v", err)
		}
	}
	s.checkAcked()
}

// TestSimCutOffNodeAnswersAtOnce: a node that cannot renew its membership
// lease (the store is unreachable for longer than the TTL) answers a send for
// a partition it holds with unavailable (not stored) at once, instead of
// holding it for the handoff wait (here an hour: the caller's 5 s deadline
// would end it first, an answer that says nothing).
func TestSimCutOffNodeAnswersAtOnce(t *testing.T) {
	s := newSim(t)
	s.handoffWait = time.Hour
	s.start("a")
	s.start("b")
	s.settle(6)
	conv := ""
	for p := range simPartitions {
		if loc, err := s.nodes["b"].node.locate(simConvs[p]); err == nil && loc.NodeID == "b" {
			conv = simConvs[p]
			break
		}
	}
	if conv == "" {
		t.Fatal("b owns no conversation")
	}
	var down bool
	s.mem.Fail = func(op string) error {
		if down {
			return errors.New("sim: store unreachable")
		}
		return nil
	}
	down = true
	for range 7 {
		s.round()
	}
	if s.nodes["b"].node.Serving() == nil {
		t.Fatal("b is ready without renewing its lease")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.nodes["b"].node.Send(ctx, sequencer.SendRequest{ConvID: conv, FromUID: 7, ClientMsgID: "cut-off", MsgType: 1})
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, sequencer.ErrNotOwner) || sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
		t.Fatalf("send to a node cut off from the store: %v (want unavailable, not owner, answered before the deadline)", err)
	}
	down = false
	s.settle(8)
	if err := s.sendWithin("b", conv, 5*time.Second); err != nil {
		t.Fatalf("send after the outage: %v", err)
	}
	s.checkAcked()
}

// TestSimRandomSchedules runs seeded random schedules of joins, leaves,
// crashes, freezes (zombies), restarts, in-flight batches and sends through
// random nodes, checking the invariants after every step.
func TestSimRandomSchedules(t *testing.T) {
	for seed := uint64(1); seed <= simSeeds(); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			s := newSim(t)
			rng := rand.New(rand.NewPCG(seed, 42))
			s.start("n0")
			next := 1
			frozenFor := map[string]int{}
			inflights := map[string]*inflight{}
			for round := 0; round < 120; round++ {
				s.clk.Advance(time.Duration(500+rng.IntN(700)) * time.Millisecond)
				for id, k := range frozenFor {
					if k--; k <= 0 {
						delete(frozenFor, id)
						s.freeze(id, false)
						// A batch in flight before the freeze may land only
						// if the node's lease never lapsed; check() verifies
						// the epochs of every commit, land() records the acks.
						s.land(inflights[id])
						s.checkNotStored(inflights[id])
						delete(inflights, id)
					} else {
						frozenFor[id] = k
					}
				}
				for _, id := range s.order {
					if rng.IntN(10) < 9 {
						s.step(id)
					}
				}
				run := s.running()
				switch x := rng.IntN(100); {
				case x < 8 && len(run) < 5:
					s.start(fmt.Sprintf("n%d", next))
					next++
				case x < 12 && len(run) > 1:
					sn := run[rng.IntN(len(run))]
					if err := sn.node.Leave(context.Background()); err != nil {
						t.Fatalf("leave %s: %v", sn.id, err)
					}
					sn.dead = true
					s.check()
				case x < 15 && len(run) > 1:
					sn := run[rng.IntN(len(run))]
					sn.dead = true
					s.net.SetDown(sn.node.self().ClusterAddr, true)
				case x < 22 && len(run) > 1:
					sn := run[rng.IntN(len(run))]
					var own []string // two of its own conversations, if it holds any
					for _, k := range rng.Perm(simPartitions) {
						if loc, err := sn.node.locate(simConvs[k]); err == nil && loc.NodeID == sn.id && len(own) < 2 {
							own = append(own, simConvs[k])
						}
					}
					inflights[sn.id] = s.startInflight(sn, own)
					s.freeze(sn.id, true)
					frozenFor[sn.id] = 1 + rng.IntN(9)
				}
				if len(run) == 0 {
					s.start(fmt.Sprintf("n%d", next))
					next++
					run = s.running()
				}
				for range 3 {
					run = s.running()
					if len(run) == 0 {
						break
					}
					via := run[rng.IntN(len(run))].id
					_ = s.send(via, simConvs[rng.IntN(simPartitions)])
				}
			}
			for id := range frozenFor {
				s.freeze(id, false)
				s.land(inflights[id])
				s.checkNotStored(inflights[id])
			}
			s.settle(12)
			for p := range simPartitions {
				run := s.running()
				if err := s.sendWithin(run[p%len(run)].id, simConvs[p], 10*time.Second); err != nil {
					t.Fatalf("after settling, send to partition %d: %v\n%s", p, err, s.dump())
				}
			}
			s.checkAcked()
			if os.Getenv("SIM_STATS") != "" {
				stale, _ := s.db.refusals()
				t.Logf("acked %d, lease takes %d, nodes started %d; in flight at a freeze: %d landed, %d refused; stale commits refused by the store %d",
					len(s.acked), s.audit.takes, next, s.inLanded, s.inRefused, stale)
			}
		})
	}
}

// simSeeds is the number of random schedules: 12, or $SIM_SEEDS for a
// longer hunt.
func simSeeds() uint64 {
	if v, err := strconv.ParseUint(os.Getenv("SIM_SEEDS"), 10, 64); err == nil && v > 0 {
		return v
	}
	return 12
}

// TestSimOperatorDrain: an operator marks b leaving in the table
// (RequestDrain, `sequencer admin drain b`). b's next heartbeat sees it and
// signals DrainRequested (only b's); b's partitions move while b leaves
// like on SIGTERM; nothing acked is lost.
func TestSimOperatorDrain(t *testing.T) {
	s := newSim(t)
	for _, id := range []string{"a", "b", "c"} {
		s.start(id)
	}
	s.settle(6)
	for p := range simPartitions {
		if err := s.send("a", simConvs[p]); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	b := s.nodes["b"]
	if b.node.held() == 0 {
		t.Fatal("b holds nothing before the drain")
	}
	if _, err := s.mem.RequestDrain(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.node.DrainRequested():
		t.Fatal("drain signalled before b read the table")
	default:
	}
	s.round()
	select {
	case <-b.node.DrainRequested():
	default:
		t.Fatalf("b did not notice the drain request:\n%s", s.dump())
	}
	for _, id := range []string{"a", "c"} {
		select {
		case <-s.nodes[id].node.DrainRequested():
			t.Fatalf("%s signalled a drain meant for b", id)
		default:
		}
	}
	if err := b.node.Leave(context.Background()); err != nil {
		t.Fatalf("leave after the drain request: %v", err)
	}
	b.dead = true
	s.check()
	s.settle(4)
	if got := b.node.held(); got != 0 {
		t.Fatalf("b holds %d partitions after the drain", got)
	}
	v, _ := s.mem.View(context.Background())
	if _, ok := v.Member("b"); ok {
		t.Fatal("b's member row is still there after the drain")
	}
	for p := range simPartitions {
		if err := s.send("c", simConvs[p]); err != nil {
			t.Fatalf("send to partition %d after b was drained: %v", p, err)
		}
		if h := s.head(simConvs[p]); h != 2 {
			t.Fatalf("partition %d head %d, want 2", p, h)
		}
	}
	s.checkAcked()
}
