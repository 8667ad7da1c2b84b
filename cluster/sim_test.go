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
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ownership"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/ring"
)

// The simulation runs whole cluster nodes in one goroutine: a fake clock
// plays both the database clock and the nodes' clocks, membership.Mem plays
// the shared table, simNet the network, and simLocal each node's writer
// (one store of messages, fenced by the same table). Nothing runs in the
// background: the test decides when each node heartbeats and reconciles
// (a "step"), when time passes, and who is frozen.

const simPartitions = 31

var simRing = ring.Config{Partitions: simPartitions}

// simDB is the message store: heads, rows and resend keys, with every
// commit fenced through the membership table (membership.Mem.Fenced).
type simDB struct {
	mem *membership.Mem

	mu      sync.Mutex
	nextID  uint64
	heads   map[string]uint64
	rows    map[string][]sequencer.Message // rows[conv][seq-1]
	byKey   map[sequencer.ClientKey]sequencer.Message
	commits map[uint32][]persist.Fence // per partition, the fences of successful commits in order
}

func newSimDB(mem *membership.Mem) *simDB {
	return &simDB{mem: mem, heads: map[string]uint64{}, rows: map[string][]sequencer.Message{},
		byKey: map[sequencer.ClientKey]sequencer.Message{}, commits: map[uint32][]persist.Fence{}}
}

var errSimHeadMismatch = errors.New("sim: head mismatch (stale cached head)")

// commit stores msg as seq prevHead+1 of its conversation, under fence.
func (db *simDB) commit(f persist.Fence, prevHead uint64, msg sequencer.Message) (sequencer.Message, error) {
	var out sequencer.Message
	var cerr error
	err := db.mem.Fenced([]persist.Fence{f}, func() {
		db.mu.Lock()
		defer db.mu.Unlock()
		if db.heads[msg.ConvID] != prevHead {
			cerr = errSimHeadMismatch
			return
		}
		if first, ok := db.byKey[msg.Key()]; ok {
			out = first
			return
		}
		db.nextID++
		msg.MsgID = db.nextID
		msg.Seq = prevHead + 1
		db.heads[msg.ConvID] = msg.Seq
		db.rows[msg.ConvID] = append(db.rows[msg.ConvID], msg)
		db.byKey[msg.Key()] = msg
		db.commits[f.Partition] = append(db.commits[f.Partition], f)
		out = msg
	})
	if os.Getenv("SIM_LOG") != "" && msg.ConvID == os.Getenv("SIM_CONV") {
		fmt.Fprintf(os.Stderr, "COMMIT %s fence=%v prev=%d -> out seq=%d err=%v cerr=%v\n", msg.ConvID, f, prevHead, out.Seq, err, cerr)
	}
	if err != nil {
		return sequencer.Message{}, err
	}
	return out, cerr
}

func (db *simDB) head(conv string) uint64 {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.heads[conv]
}

// simLocal is one node's writer: it caches heads like the real conversation
// actors (dropped by StopConversations) and asks the node for a fence per
// commit. prepared commits model a batch in flight while the node freezes.
type simLocal struct {
	db    *simDB
	node  *Node
	mu    sync.Mutex
	heads map[string]uint64 // cached heads of live "actors"
	stops int
	// prepared: fence and head taken, commit not yet sent
	prepared []prepared
}

type prepared struct {
	fence persist.Fence
	head  uint64
	msg   sequencer.Message
}

func (l *simLocal) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	f, err := l.node.Fence(req.ConvID)
	if err != nil {
		return sequencer.SendResult{}, err
	}
	l.mu.Lock()
	head, ok := l.heads[req.ConvID]
	if !ok {
		head = l.db.head(req.ConvID)
		l.heads[req.ConvID] = head
	}
	l.mu.Unlock()
	m, err := l.db.commit(f, head, sequencer.Message{ConvID: req.ConvID, FromUID: req.FromUID, ClientMsgID: req.ClientMsgID, MsgType: req.MsgType, Body: req.Body})
	if err != nil {
		l.mu.Lock()
		delete(l.heads, req.ConvID) // like the actor: re-read the head before the next batch
		l.mu.Unlock()
		var sf *persist.StaleFenceError
		if errors.As(err, &sf) {
			l.node.Refused(sf.Fences)
		}
		return sequencer.SendResult{}, err
	}
	l.mu.Lock()
	if m.Seq > l.heads[req.ConvID] {
		l.heads[req.ConvID] = m.Seq
	}
	l.mu.Unlock()
	return sequencer.SendResult{MsgID: m.MsgID, Seq: m.Seq, Duplicate: m.ClientMsgID == req.ClientMsgID && m.Seq <= head}, nil
}

// SendBatch sends the items one by one, in order.
func (l *simLocal) SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome) {
	for i := range reqs {
		res, err := l.Send(ctx, reqs[i])
		out[i] = sequencer.SendOutcome{Result: res, Err: err}
	}
}

// prepare takes a fence and a head now for a commit sent later (flush).
func (l *simLocal) prepare(req sequencer.SendRequest) error {
	f, err := l.node.Fence(req.ConvID)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.prepared {
		if p.msg.ConvID == req.ConvID {
			return errors.New("sim: one batch in flight per conversation")
		}
	}
	head, ok := l.heads[req.ConvID]
	if !ok {
		head = l.db.head(req.ConvID)
	}
	l.heads[req.ConvID] = head + 1 // assigned optimistically, as the actor does
	if os.Getenv("SIM_LOG") != "" && req.ConvID == os.Getenv("SIM_CONV") {
		fmt.Fprintf(os.Stderr, "PREPARE %s on %s head=%d fence=%v\n", req.ConvID, l.node.cfg.NodeID, head, f)
	}
	l.prepared = append(l.prepared, prepared{f, head, sequencer.Message{ConvID: req.ConvID, FromUID: req.FromUID, ClientMsgID: req.ClientMsgID, MsgType: req.MsgType}})
	return nil
}

// flush sends the prepared commits; it returns how many landed and the
// errors of the others.
func (l *simLocal) flush() (landed int, errs []error) {
	l.mu.Lock()
	ps := l.prepared
	l.prepared = nil
	l.mu.Unlock()
	for _, p := range ps {
		_, err := l.db.commit(p.fence, p.head, p.msg)
		if err != nil {
			l.mu.Lock()
			delete(l.heads, p.msg.ConvID) // roll back: re-read before the next batch
			l.mu.Unlock()
			var sf *persist.StaleFenceError
			if errors.As(err, &sf) {
				l.node.Refused(sf.Fences)
			}
			errs = append(errs, err)
			continue
		}
		landed++
	}
	return landed, errs
}

func (l *simLocal) StopConversations(ctx context.Context, match func(string) bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stops++
	for c := range l.heads {
		if os.Getenv("SIM_LOG") != "" && c == os.Getenv("SIM_CONV") {
			fmt.Fprintf(os.Stderr, "STOP %s on %s match=%v\n", c, l.node.cfg.NodeID, match(c))
		}
		if match(c) {
			delete(l.heads, c)
		}
	}
	return nil
}

// sim is a cluster under test.
type sim struct {
	t           testing.TB
	handoffWait time.Duration // nodes' HandoffWait; 0 means 1ms
	clk         *clock.Fake
	mem         *membership.Mem
	audit       *auditStore
	net         *MemNetwork
	db          *simDB
	nodes       map[string]*simNode
	order       []string // creation order
	seq         int
	acked       map[sequencer.ClientKey]sequencer.SendResult
	wrap        func(id string, tr Transport) Transport // optional: wraps each node's transport
}

type simNode struct {
	id     string
	node   *Node
	local  *simLocal
	frozen bool
	dead   bool // crashed or left: never stepped again
	// superseded: a newer process took this node id; it may still hand out
	// fences until it notices (the store refuses them), so the one-writer
	// check counts only the store's answer for it.
	superseded bool
}

func newSim(t testing.TB) *sim {
	clk := clock.NewFake(time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC))
	mem := membership.NewMem(clk)
	s := &sim{t: t, clk: clk, mem: mem, net: &MemNetwork{IgnoreWakes: true, handlers: map[string]Handler{}, down: map[string]bool{}}, nodes: map[string]*simNode{}, acked: map[sequencer.ClientKey]sequencer.SendResult{}}
	s.audit = &auditStore{Store: mem, t: t}
	s.db = newSimDB(mem)
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
// takes over a predecessor with the same id).
func (s *sim) start(id string) *simNode {
	s.t.Helper()
	s.seq++
	n, err := New(s.cfg(id))
	if err != nil {
		s.t.Fatal(err)
	}
	l := &simLocal{db: s.db, node: n, heads: map[string]uint64{}}
	if err := n.start(context.Background(), l); err != nil {
		s.t.Fatalf("start %s: %v", id, err)
	}
	sn := &simNode{id: id, node: n, local: l}
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
	r, err := ring.New(v.RingMembers(), simRing)
	if err != nil {
		return false
	}
	run := s.running()
	for _, m := range v.Members {
		if !slices.ContainsFunc(run, func(sn *simNode) bool {
			return sn.id == m.NodeID && read(sn.node, (*ownership.Core).Self).Incarnation == m.Incarnation
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
	defer s.db.mu.Unlock()
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
	for conv, rows := range s.db.rows {
		for i, m := range rows {
			if m.Seq != uint64(i+1) {
				s.t.Fatalf("conv %s: row %d has seq %d (not contiguous)", conv, i, m.Seq)
			}
		}
	}
}

// send sends one new message through node via; it returns the error.
func (s *sim) send(via string, conv string) error {
	s.t.Helper()
	// A forward to a frozen node gets no answer: it is retried until the
	// context ends, which is not an answer either.
	return s.sendWithin(via, conv, 20*time.Millisecond)
}

// sendWithin is send with a timeout; sends to a settled cluster (no frozen or
// dead owner) get a generous one, since the race detector and a loaded
// machine can slow a forward's goroutines well past 20 ms of real time.
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
		if errors.Is(err, errSimHeadMismatch) {
			s.t.Fatalf("send via %s to %s hit a stale cached head: %v", via, conv, err)
		}
		if !sequencer.ErrorCode(err).Retryable() {
			s.t.Fatalf("send via %s to %s: non-retryable error %v (code %v)", via, conv, err, sequencer.ErrorCode(err))
		}
		return err
	}
	s.acked[req.Key()] = res
	s.check()
	return nil
}

// checkAcked asserts every acked send is stored at its seq with its msg_id.
func (s *sim) checkAcked() {
	s.t.Helper()
	s.db.mu.Lock()
	defer s.db.mu.Unlock()
	ids := map[uint64]bool{}
	for _, rows := range s.db.rows {
		for _, m := range rows {
			if ids[m.MsgID] {
				s.t.Fatalf("msg_id %d stored twice", m.MsgID)
			}
			ids[m.MsgID] = true
		}
	}
	for k, res := range s.acked {
		m, ok := s.db.byKey[k]
		if !ok || m.Seq != res.Seq || m.MsgID != res.MsgID {
			s.t.Fatalf("acked %v as seq %d msg_id %d, stored %+v (found %v)", k, res.Seq, res.MsgID, m, ok)
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
		if h := s.db.head(simConvs[p]); h != 2 {
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
	if b.local.stops == 0 {
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
		if h := s.db.head(simConvs[p]); h != 2 {
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
		if h := s.db.head(simConvs[p]); h != 2 {
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
	var bp []uint32
	for p, st := range b.node.parts() {
		if st.Held {
			bp = append(bp, uint32(p))
		}
	}
	oldInc := b.node.self().Incarnation
	// b has a batch in flight (fence taken) when it freezes.
	for _, p := range bp[:2] {
		if err := b.local.prepare(sequencer.SendRequest{ConvID: simConvs[p], FromUID: 9, ClientMsgID: fmt.Sprintf("z%d", p), MsgType: 1}); err != nil {
			t.Fatal(err)
		}
	}
	s.freeze("b", true)
	for range 7 { // past the 5 s TTL
		s.round()
	}
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
	landed, errs := b.local.flush()
	if landed != 0 || len(errs) != 2 {
		t.Fatalf("zombie's in-flight batch: %d landed, errors %v", landed, errs)
	}
	for _, err := range errs {
		if !errors.Is(err, sequencer.ErrStaleEpoch) {
			t.Fatalf("zombie commit error %v, want ErrStaleEpoch", err)
		}
	}
	s.check()
	stopsBefore := b.local.stops
	s.step("b") // notices: steps down, rejoins as a new incarnation
	if b.node.self().Incarnation == oldInc {
		t.Fatal("zombie kept its incarnation after stepping down")
	}
	if b.local.stops == stopsBefore {
		t.Fatal("zombie did not stop its conversations when stepping down")
	}
	s.settle(6)
	if b.node.held() == 0 {
		t.Fatal("rejoined node got no partitions back")
	}
	for _, p := range bp[:2] {
		if err := s.send("b", simConvs[p]); err != nil {
			t.Fatalf("send after the zombie rejoined: %v", err)
		}
		if h := s.db.head(simConvs[p]); h != 2 {
			t.Fatalf("partition %d head %d, want 2 (zombie's write refused, new owner's kept)", p, h)
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
	if err := old.local.prepare(sequencer.SendRequest{ConvID: simConvs[bp], FromUID: 3, ClientMsgID: "old", MsgType: 1}); err != nil {
		t.Fatal(err)
	}
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
	if landed, errs := old.local.flush(); landed != 0 || len(errs) != 1 || !errors.Is(errs[0], sequencer.ErrStaleEpoch) {
		t.Fatalf("old process's in-flight commit: landed %d errs %v", landed, errs)
	}
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
	if h := s.db.head(simConvs[bp]); h != 2 {
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
		if loc, err := s.nodes["b"].node.Locate(simConvs[p]); err == nil && loc.NodeID == "b" {
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
			for round := 0; round < 120; round++ {
				s.clk.Advance(time.Duration(500+rng.IntN(700)) * time.Millisecond)
				for id, k := range frozenFor {
					if k--; k <= 0 {
						delete(frozenFor, id)
						s.freeze(id, false)
						if landed, errs := s.nodes[id].local.flush(); landed > 0 {
							// A batch prepared before the freeze may land only
							// if the node's lease never lapsed; check() already
							// verified the epochs of every commit.
							_ = errs
						}
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
					for range 2 {
						_ = sn.local.prepare(sequencer.SendRequest{ConvID: simConvs[rng.IntN(simPartitions)], FromUID: 5, ClientMsgID: fmt.Sprintf("p%d-%d", round, rng.Int()), MsgType: 1})
					}
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
				s.nodes[id].local.flush()
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
				t.Logf("acked %d, lease takes %d, nodes started %d", len(s.acked), s.audit.takes, next)
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
		if h := s.db.head(simConvs[p]); h != 2 {
			t.Fatalf("partition %d head %d, want 2", p, h)
		}
	}
	s.checkAcked()
}
