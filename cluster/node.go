// Package cluster runs one node of a sequencer cluster: its membership (a
// leased row in the shared table, renewed by heartbeats), the partitions it
// holds (fenced leases taken and released by the rules of package
// membership), the handoff of partitions when the ring moves them, and the
// routing of sends to the owner (forwarded in batches over a connect-go
// service between the nodes, mutual TLS or loopback h2c).
//
// Safety never rests on nodes agreeing: a node writes a conversation only
// with a persist.Fence (partition, its incarnation, epoch) that every store
// commit checks, and a partition is taken from another incarnation only when
// that incarnation released it or is no longer a live member, which bumps the
// epoch and fences out the old writer. A node that finds itself presumed dead
// (its member row gone) or fenced steps down: it drops every partition, stops
// their conversations and rejoins as a new incarnation.
//
// This package never assigns seqs or msg_ids, never writes messages and never
// decides ownership from anything but the shared table and the ring.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/buildinfo"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
	"github.com/sequencer-im/sequencer/ring"
)

// Local is this node's conversation writer (*actor.Node satisfies it).
type Local interface {
	// Send sequences and stores one message of a conversation this node
	// owns (the writer asks Node.Fence for the fence of every commit).
	Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error)
	// SendBatch sends every item of reqs and answers each in out (same
	// length): items of one conversation enter it once, in item order.
	SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome)
	// StopConversations lets the in-flight batches of the matching
	// conversations finish, then stops them (their next send reloads the
	// head from the store).
	StopConversations(ctx context.Context, match func(convID string) bool) error
}

type phase int

const (
	phaseNew          phase = iota // not started
	phaseActive                    // a member: reconciling partitions
	phaseSteppingDown              // presumed dead or fenced: partitions dropped, rejoining
	phaseSuperseded                // another process took the node id: out for good
	phaseLeaving                   // graceful leave in progress
	phaseLeft                      // left; serves nothing
)

func (p phase) String() string {
	return [...]string{"new", "active", "stepping-down", "superseded", "leaving", "left"}[p]
}

// Node is one member of the cluster. It implements the writer's ownership
// check (Fence), the API's Sender (Send, routing to the owner) and Router
// (Route), and readiness (Ready). Create it with New, then Start it with the
// local writer; stop it with Leave, then Close once the API stopped.
type Node struct {
	cfg        Config
	log        *slog.Logger
	clk        clock.Clock
	store      membership.Store
	tr         Transport
	partitions int
	met        *clusterMetrics
	local      Local // set by Start

	mu         sync.RWMutex
	phase      phase
	self       membership.Member // NodeID, Incarnation, addresses
	view       membership.View
	ring       *ring.Ring
	parts      []partState   // indexed by partition
	changed    chan struct{} // closed and replaced on every change of view, phase or parts
	lastBeat   time.Time     // local clock: when the last successful heartbeat (or join) was sent
	beatErr    error         // the last heartbeat failure, nil after a success
	gone       bool          // the current incarnation's row expired or was removed
	superseded bool          // the node id belongs to another live incarnation
	fenced     bool          // a commit of the current incarnation was refused for a stale fence

	fwdMu     sync.Mutex            // guards peers
	peers     map[string]*peerQueue // forwarded items waiting, by owner address
	fwdCtx    context.Context       // batches in flight; canceled by Close
	fwdCancel context.CancelFunc
	viewReads *rate.Limiter // membership re-reads asked by forwarded batches
	wakeMu    sync.Mutex
	wakes     map[string]*rate.Limiter // wake-ups accepted, by sender
	drainOnce sync.Once
	drain     chan struct{} // closed when an operator marked this member leaving (DrainRequested)

	// suspectUntil (unix nanos): a peer stopped answering at the transport
	// level; until then the membership is read every suspectPoll, so its
	// row's expiry (if it crashed) is seen at once.
	suspectUntil atomic.Int64

	supersededOnce sync.Once
	supersededCh   chan struct{} // closed when another live process took this node id (Superseded)

	reconcileMu sync.Mutex // serializes reconcile, step-down and leave
	wakeBeat    chan struct{}
	wakeRecon   chan struct{}
	stopRecon   context.CancelFunc
	stopBeat    context.CancelFunc
	reconDone   chan struct{}
	beatDone    chan struct{}
}

// New checks cfg and builds a node; nothing runs and nothing listens until
// Start.
func New(cfg Config) (*Node, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cluster config: %w", err)
	}
	empty, err := ring.New(nil, cfg.Ring)
	if err != nil {
		return nil, fmt.Errorf("cluster config: %w", err)
	}
	tr := cfg.Transport
	if tr == nil {
		var peerTLS *PeerTLS
		if cfg.TLSCertFile != "" {
			if peerTLS, err = LoadPeerTLS(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSCAFile); err != nil {
				return nil, fmt.Errorf("cluster config: %w", err)
			}
		}
		maxReq := DefaultMaxRequestBytes
		if m := cfg.MaxBody + 1<<20; m > maxReq {
			maxReq = m
		}
		if tr, err = NewConnectTransport(ConnectConfig{Listen: cfg.ClusterListen, TLS: peerTLS, Insecure: cfg.Insecure,
			MaxRequestBytes: maxReq, Logger: cfg.Logger, TracerProvider: cfg.TracerProvider}); err != nil {
			return nil, fmt.Errorf("cluster config: %w", err)
		}
	}
	n := &Node{
		cfg:          cfg,
		log:          cfg.Logger.With("node", cfg.NodeID),
		clk:          cfg.Clock,
		store:        cfg.Store,
		tr:           tr,
		partitions:   empty.Partitions(),
		met:          newClusterMetrics(cfg.Metrics),
		ring:         empty,
		changed:      make(chan struct{}),
		wakeBeat:     make(chan struct{}, 1),
		wakeRecon:    make(chan struct{}, 1),
		peers:        map[string]*peerQueue{},
		viewReads:    rate.NewLimiter(rate.Limit(10), 10),
		wakes:        map[string]*rate.Limiter{},
		drain:        make(chan struct{}),
		supersededCh: make(chan struct{}),
	}
	n.fwdCtx, n.fwdCancel = context.WithCancel(context.Background())
	n.parts = make([]partState, n.partitions)
	n.self = membership.Member{NodeID: cfg.NodeID, APIAddr: cfg.APIAddr, Partitions: empty.Partitions(), Protocol: ProtocolVersion,
		Version: buildinfo.Get().Version}
	return n, nil
}

// opCtx bounds one store operation of the membership machinery.
func (n *Node) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, n.cfg.MemberTTL)
}

// newIncarnation names one process start of nodeID: unique, so a restarted
// node never inherits the fences of its predecessor.
func newIncarnation(nodeID string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return nodeID + "/" + hex.EncodeToString(b[:])
}

// Start serves the transport, joins the cluster (declaring a predecessor with
// the same node id dead) and starts the heartbeat and the partition
// reconciliation in the background. It returns once this node is a member;
// partitions are taken within a heartbeat or two. local is the writer of the
// conversations this node owns.
func (n *Node) Start(ctx context.Context, local Local) error {
	if err := n.start(ctx, local); err != nil {
		return err
	}
	n.startLoops()
	return nil
}

// start serves the transport and joins, without the background loops
// (simulations drive beat and reconcile by hand).
func (n *Node) start(ctx context.Context, local Local) error {
	if local == nil {
		return errors.New("cluster: Start needs the local writer")
	}
	n.mu.Lock()
	if n.phase != phaseNew {
		n.mu.Unlock()
		return errors.New("cluster: node already started")
	}
	n.local = local
	n.mu.Unlock()

	addr, err := n.tr.Start(n)
	if err != nil {
		return fmt.Errorf("cluster transport: %w", err)
	}
	if n.cfg.ClusterAdvertise != "" {
		addr = n.cfg.ClusterAdvertise
	}
	// A live member row with this node id is either a crashed predecessor
	// (its lease runs out within MemberTTL) or another live process with the
	// same --node-id: wait out one TTL, then refuse to start.
	deadline := n.clk.Now().Add(n.cfg.MemberTTL + n.cfg.Heartbeat)
	for {
		err := n.join(ctx, addr, false)
		if err == nil {
			return nil
		}
		retry := errors.Is(err, membership.ErrSuperseded) && n.clk.Now().Before(deadline) && ctx.Err() == nil
		n.mu.Lock()
		n.phase, n.superseded = phaseNew, false
		n.mu.Unlock()
		if !retry {
			_ = n.tr.Close()
			if errors.Is(err, membership.ErrSuperseded) {
				return fmt.Errorf("%w: node id %q is held by a live member (another process runs with this --node-id)", err, n.cfg.NodeID)
			}
			return err
		}
		n.clk.Sleep(n.cfg.Heartbeat)
	}
}

// join enters the membership table as a new incarnation.
func (n *Node) join(ctx context.Context, clusterAddr string, takeOver bool) error {
	n.mu.RLock()
	m := n.self
	n.mu.RUnlock()
	if clusterAddr != "" {
		m.ClusterAddr = clusterAddr
	}
	m.Incarnation = newIncarnation(m.NodeID)
	sent := n.clk.Now()
	jctx, cancel := n.opCtx(ctx)
	v, err := n.store.Join(jctx, m, n.cfg.MemberTTL, takeOver)
	cancel()
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		if errors.Is(err, membership.ErrSuperseded) {
			n.superseded = true
			n.phase = phaseSuperseded
			n.notifyLocked()
			n.log.Error("node id is held by another live process: staying out of the cluster", "err", err)
		}
		return fmt.Errorf("cluster join as %s: %w", m.NodeID, err)
	}
	n.self = m
	n.gone, n.fenced, n.superseded, n.beatErr = false, false, false, nil
	n.phase = phaseActive
	n.applyViewLocked(v, sent)
	n.notifyLocked()
	n.log.Info("joined the cluster", "incarnation", m.Incarnation, "cluster_addr", m.ClusterAddr, "version", v.Version, "members", len(v.Members))
	go n.wakeMembers(v, nil)
	return nil
}

// rejoin joins as a new incarnation after a step-down. The previous
// incarnation's row may still be live (a step-down for a fenced commit, with
// heartbeats still succeeding): it is removed first, so the node is not
// refused as its own duplicate. Removing it releases nothing that the
// step-down did not already drop; its partitions become takeable.
func (n *Node) rejoin(ctx context.Context, old membership.Member) {
	if old.Incarnation != "" {
		rctx, cancel := n.opCtx(ctx)
		err := n.store.Remove(rctx, old.NodeID, old.Incarnation)
		cancel()
		if err != nil {
			n.log.Warn("rejoin: could not remove the previous incarnation's row; retrying", "incarnation", old.Incarnation, "err", err)
			return
		}
	}
	if err := n.join(ctx, "", false); err != nil {
		n.log.Warn("rejoin failed; retrying", "err", err)
	}
}

func (n *Node) startLoops() {
	bctx, bcancel := context.WithCancel(context.Background())
	rctx, rcancel := context.WithCancel(context.Background())
	n.stopBeat, n.stopRecon = bcancel, rcancel
	n.beatDone, n.reconDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(n.beatDone)
		for {
			d := n.cfg.Heartbeat
			if time.Now().UnixNano() < n.suspectUntil.Load() {
				d = min(d, suspectPoll)
			}
			t := time.NewTimer(d)
			select {
			case <-bctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-n.wakeBeat:
				t.Stop()
			}
			n.beat(bctx)
		}
	}()
	go func() {
		defer close(n.reconDone)
		t := time.NewTicker(n.cfg.Heartbeat)
		defer t.Stop()
		for {
			n.reconcile(rctx)
			select {
			case <-rctx.Done():
				return
			case <-t.C:
			case <-n.wakeRecon:
			}
		}
	}()
}

func (n *Node) poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// notifyLocked wakes everything waiting for a change (n.mu held).
func (n *Node) notifyLocked() {
	close(n.changed)
	n.changed = make(chan struct{})
}

// applyViewLocked adopts v unless it is older than the current view, and
// rebuilds the ring when the version changed. sent is the local time the
// read started: a view of our own live row proves the lease until
// sent+MemberTTL (n.mu held).
func (n *Node) applyViewLocked(v membership.View, sent time.Time) {
	if sent.After(n.lastBeat) {
		n.lastBeat = sent
	}
	if v.Version < n.view.Version {
		return
	}
	if v.Version != n.view.Version || n.view.Members == nil {
		r, err := ring.New(v.RingMembers(), n.cfg.Ring)
		if err != nil {
			n.log.Error("cannot build the ring for this membership view: keeping the previous one", "version", v.Version, "err", err)
			return
		}
		if n.view.Version != v.Version {
			n.log.Info("membership view", "version", v.Version, "members", len(v.Members), "ring", len(r.Members()))
		}
		n.ring = r
		n.notifyLocked()
	}
	n.view = v
	n.met.view(v)
}

// beat renews the membership lease once.
func (n *Node) beat(ctx context.Context) {
	n.mu.RLock()
	ph, self := n.phase, n.self
	n.mu.RUnlock()
	if ph != phaseActive && ph != phaseLeaving {
		return
	}
	sent := n.clk.Now()
	bctx, cancel := context.WithTimeout(ctx, n.cfg.MemberTTL/2)
	v, err := n.store.Heartbeat(bctx, self.NodeID, self.Incarnation, n.cfg.MemberTTL)
	cancel()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.self.Incarnation != self.Incarnation {
		return // rejoined meanwhile
	}
	switch {
	case err == nil:
		n.beatErr = nil
		n.applyViewLocked(v, sent)
		if m, ok := v.Member(self.NodeID); ok && m.Leaving && m.Incarnation == self.Incarnation && n.phase == phaseActive {
			n.drainOnce.Do(func() {
				n.log.Info("drain requested: the member row was marked leaving by an operator; leaving gracefully")
				close(n.drain)
			})
		}
		return
	case errors.Is(err, membership.ErrSuperseded):
		if !n.superseded {
			n.log.Error("node id taken by another process", "incarnation", self.Incarnation, "err", err)
		}
		n.superseded = true
	case errors.Is(err, membership.ErrMemberGone):
		if !n.gone {
			n.log.Warn("member row expired or removed: presumed dead, stepping down", "incarnation", self.Incarnation)
		}
		n.gone = true
	default:
		if n.beatErr == nil {
			n.log.Warn("heartbeat failed", "err", err)
		}
		n.beatErr = err
		return
	}
	n.notifyLocked()
	n.poke(n.wakeRecon)
}

// reconcile makes the held partitions follow the ring once: hand off what
// moved away, take what is ours and takeable, or step down and rejoin.
func (n *Node) reconcile(ctx context.Context) {
	n.reconcileMu.Lock()
	defer n.reconcileMu.Unlock()
	n.mu.RLock()
	ph, self, r, view := n.phase, n.self, n.ring, n.view
	gone, superseded, fenced := n.gone, n.superseded, n.fenced
	parts := append([]partState(nil), n.parts...)
	n.mu.RUnlock()
	switch {
	case ph != phaseActive && ph != phaseSteppingDown:
		return
	case superseded:
		n.stepDown(ctx, "node id taken by another process")
		n.mu.Lock()
		n.phase = phaseSuperseded
		n.notifyLocked()
		n.mu.Unlock()
		n.supersededOnce.Do(func() { close(n.supersededCh) })
		return
	case ph == phaseSteppingDown || gone || fenced:
		if ph == phaseActive {
			reason := "member row expired (presumed dead)"
			if fenced {
				reason = "a commit was fenced (partition taken over)"
			}
			n.stepDown(ctx, reason)
		}
		n.rejoin(ctx, self)
		return
	}
	pl := decide(r, &view, self.NodeID, self.Incarnation, parts)
	if len(pl.lost) > 0 {
		n.mu.Lock()
		n.fenced = true
		n.mu.Unlock()
		n.log.Warn("partitions taken over by another node", "partitions", pl.lost)
		n.stepDown(ctx, "partitions taken over")
		n.rejoin(ctx, self)
		return
	}
	if len(pl.release) > 0 {
		n.handoff(ctx, pl.release)
	}
	if len(pl.acquire) > 0 {
		n.acquire(ctx, self.Incarnation, view.Version, pl.acquire)
	}
}

// heldLeases returns the leases this incarnation holds (n.mu held).
func (n *Node) heldLeasesLocked(only func(p uint32) bool) []membership.Lease {
	var ls []membership.Lease
	for i, st := range n.parts {
		if st.held && (only == nil || only(uint32(i))) {
			ls = append(ls, membership.Lease{Partition: uint32(i), Owner: n.self.Incarnation, Epoch: st.epoch})
		}
	}
	return ls
}

// stopConvs stops the local conversations of the partitions in set (nil:
// all), bounded by StopTimeout.
func (n *Node) stopConvs(ctx context.Context, set map[uint32]bool) {
	sctx, cancel := context.WithTimeout(ctx, n.cfg.StopTimeout)
	defer cancel()
	match := func(string) bool { return true }
	if set != nil {
		match = func(convID string) bool { return set[ring.PartitionOf(convID, n.partitions)] }
	}
	if err := n.local.StopConversations(sctx, match); err != nil {
		n.log.Warn("stopping conversations did not finish; their late commits are fenced", "err", err)
	}
}

// stepDown drops every partition at once (Fence refuses from now on), stops
// all conversations (in-flight batches finish or are fenced) and frees the
// leases still held (best effort).
func (n *Node) stepDown(ctx context.Context, reason string) {
	n.mu.Lock()
	held := n.heldLeasesLocked(nil)
	clear(n.parts)
	n.phase = phaseSteppingDown
	n.notifyLocked()
	n.mu.Unlock()
	n.log.Warn("stepping down: all partitions dropped", "reason", reason, "held", len(held))
	n.met.stepDown()
	n.met.held(0)
	n.stopConvs(ctx, nil)
	if len(held) > 0 {
		rctx, cancel := n.opCtx(ctx)
		defer cancel()
		if err := n.store.Release(rctx, held); err != nil {
			n.log.Debug("release after step-down failed (the leases expire with the member row)", "err", err)
		}
	}
}

// handoff gives up partitions ps: no new fences, in-flight batches finish,
// then the leases are released. On a failed release they stay moving and the
// next round retries.
func (n *Node) handoff(ctx context.Context, ps []uint32) {
	set := make(map[uint32]bool, len(ps))
	for _, p := range ps {
		set[p] = true
	}
	n.mu.Lock()
	leases := n.heldLeasesLocked(func(p uint32) bool { return set[p] })
	for _, l := range leases {
		n.parts[l.Partition].moving = true
	}
	n.notifyLocked()
	n.mu.Unlock()
	if len(leases) == 0 {
		return
	}
	n.stopConvs(ctx, set)
	rctx, cancel := n.opCtx(ctx)
	err := n.store.Release(rctx, leases)
	cancel()
	if err != nil {
		n.log.Warn("releasing partitions failed; retrying", "partitions", len(leases), "err", err)
		return
	}
	n.mu.Lock()
	for _, l := range leases {
		if st := n.parts[l.Partition]; st.held && st.epoch == l.Epoch {
			n.parts[l.Partition] = partState{}
		}
	}
	r, view, heldNow := n.ring, n.view, n.countHeldLocked()
	n.notifyLocked()
	n.mu.Unlock()
	n.met.released(len(leases))
	n.met.held(heldNow)
	n.log.Info("partitions handed off", "count", len(leases), "held", heldNow)
	released := make([]uint32, len(leases))
	for i, l := range leases {
		released[i] = l.Partition
	}
	n.wakeMembers(view, func(m membership.Member) bool {
		for _, p := range released {
			if o, ok := r.Owner(p); ok && o.NodeID == m.NodeID {
				return true
			}
		}
		return false
	}, released...)
}

// acquire takes the leases of ps (decided on the view of version).
func (n *Node) acquire(ctx context.Context, incarnation string, version uint64, ps []uint32) {
	actx, cancel := n.opCtx(ctx)
	leases, err := n.store.Acquire(actx, incarnation, version, ps)
	cancel()
	if err != nil {
		n.log.Warn("acquiring partitions failed; retrying", "partitions", len(ps), "err", err)
		return
	}
	if len(leases) == 0 {
		return
	}
	// Conversations of these partitions may have actors from before (created
	// while the partition was elsewhere): drop them so every head is
	// reloaded under the new epoch.
	set := make(map[uint32]bool, len(leases))
	for _, l := range leases {
		set[l.Partition] = true
	}
	n.stopConvs(ctx, set)
	n.mu.Lock()
	if n.self.Incarnation == incarnation && n.phase == phaseActive {
		for _, l := range leases {
			n.parts[l.Partition] = partState{held: true, epoch: l.Epoch}
		}
	}
	heldNow := n.countHeldLocked()
	n.notifyLocked()
	n.mu.Unlock()
	n.met.acquired(len(leases))
	n.met.held(heldNow)
	n.log.Info("partitions acquired", "count", len(leases), "held", heldNow, "version", version)
}

func (n *Node) countHeldLocked() int {
	c := 0
	for _, st := range n.parts {
		if st.held {
			c++
		}
	}
	return c
}

// wakeMembers asks the members of view accepted by only (nil: all but this
// node) to read the table now.
func (n *Node) wakeMembers(view membership.View, only func(membership.Member) bool, released ...uint32) {
	n.mu.RLock()
	selfID := n.self.NodeID
	n.mu.RUnlock()
	w := &clusterv1.WakeRequest{FromNode: selfID, MembershipVersion: view.Version, Released: released}
	for _, m := range view.Members {
		if m.NodeID == selfID || m.ClusterAddr == "" || (only != nil && !only(m)) {
			continue
		}
		n.tr.Wake(m.ClusterAddr, w)
	}
}

// Wake-ups accepted per sender: a wake makes the node read (and write) the
// membership table, so a peer cannot make it do that more often than this.
const (
	wakeRate  = rate.Limit(5)
	wakeBurst = 10
)

// HandleWake implements Handler: read the table now. Wake-ups are
// rate-limited per sender: a live member (by node id) has its own budget;
// anything else shares one budget per peer address.
func (n *Node) HandleWake(peer string, w *clusterv1.WakeRequest) {
	n.mu.RLock()
	_, member := n.view.Member(w.GetFromNode())
	n.mu.RUnlock()
	key := "addr:" + peer
	if member {
		key = "node:" + w.GetFromNode()
	}
	n.wakeMu.Lock()
	l := n.wakes[key]
	if l == nil {
		if len(n.wakes) >= 1024 {
			clear(n.wakes)
		}
		l = rate.NewLimiter(wakeRate, wakeBurst)
		n.wakes[key] = l
	}
	ok := l.Allow()
	n.wakeMu.Unlock()
	if !ok {
		n.met.wakeDropped()
		return
	}
	n.poke(n.wakeBeat)
}

// Fence implements the writer's ownership check (actor.Ownership): the fence
// for a commit of convID, if this node holds the conversation's partition
// and it is not moving. Otherwise an error wrapping sequencer.ErrNotOwner or
// sequencer.ErrOwnershipMoving (both retryable).
func (n *Node) Fence(convID string) (persist.Fence, error) {
	p := ring.PartitionOf(convID, n.partitions)
	n.mu.RLock()
	defer n.mu.RUnlock()
	st := n.parts[p]
	switch {
	case n.phase != phaseActive && n.phase != phaseLeaving, n.gone, n.fenced, n.superseded:
		return persist.Fence{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("node %s is %s", n.self.NodeID, n.stateLocked()))
	case !st.held:
		return persist.Fence{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("partition %d is not held by node %s", p, n.self.NodeID))
	case st.moving:
		return persist.Fence{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrOwnershipMoving,
			fmt.Sprintf("partition %d is moving away from node %s", p, n.self.NodeID))
	}
	if d := n.clk.Now().Sub(n.lastBeat); d > n.cfg.MemberTTL {
		return persist.Fence{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner,
			fmt.Sprintf("node %s has not renewed its membership for %v", n.self.NodeID, d.Round(time.Millisecond)))
	}
	return persist.Fence{Partition: p, Owner: n.self.Incarnation, Epoch: st.epoch}, nil
}

func (n *Node) stateLocked() string {
	switch {
	case n.superseded:
		return "superseded by another process with its node id"
	case n.gone:
		return "presumed dead (member row expired)"
	case n.fenced:
		return "fenced (a partition was taken over)"
	}
	return n.phase.String()
}

// FenceStore wraps the store the local writer commits to: a commit refused
// for a stale fence of this incarnation makes the node step down (its
// partitions were taken over, so it was presumed dead). Every other method
// passes through.
func (n *Node) FenceStore(s persist.Store) persist.Store { return &fenceWatch{Store: s, n: n} }

type fenceWatch struct {
	persist.Store
	n *Node
}

func (f *fenceWatch) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	err := f.Store.Commit(ctx, batches)
	var sf *persist.StaleFenceError
	if errors.As(err, &sf) {
		f.n.fenceRefused(sf.Fences)
	}
	return err
}

// fenceRefused records that the store refused fences; if one is a partition
// this incarnation still believes it holds at that epoch, step down.
func (n *Node) fenceRefused(fences []persist.Fence) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, f := range fences {
		if f.Owner != n.self.Incarnation || int(f.Partition) >= len(n.parts) {
			continue
		}
		if st := n.parts[f.Partition]; st.held && st.epoch == f.Epoch && !n.fenced {
			n.log.Warn("commit fenced: partition taken over; stepping down", "partition", f.Partition, "epoch", f.Epoch)
			n.fenced = true
			n.notifyLocked()
			n.poke(n.wakeRecon)
		}
	}
}

// Ready reports whether this node can serve sends: started, a live member
// (heartbeat renewed within MemberTTL) with a known ring, not stepping down,
// superseded or leaving.
func (n *Node) Ready() error {
	n.mu.RLock()
	defer n.mu.RUnlock()
	switch {
	case n.phase == phaseNew:
		return errors.New("cluster: not started")
	case n.phase == phaseLeaving || n.phase == phaseLeft:
		return sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrShuttingDown, "cluster: node is leaving")
	case n.phase != phaseActive || n.gone || n.fenced || n.superseded:
		return fmt.Errorf("cluster: node %s", n.stateLocked())
	}
	if d := n.clk.Now().Sub(n.lastBeat); d > n.cfg.MemberTTL {
		return fmt.Errorf("cluster: membership not renewed for %v (last error: %v)", d.Round(time.Millisecond), n.beatErr)
	}
	if _, ok := n.view.Member(n.self.NodeID); !ok {
		return errors.New("cluster: this node is not in the membership view yet")
	}
	return nil
}

// DrainRequested is closed when this node's heartbeat finds its own member
// row marked leaving by someone else (`sequencer admin drain`,
// membership.Store.RequestDrain). The node is then out of the ring and hands
// its partitions off by itself; the owner of the process should stop it as
// on SIGTERM (Leave, then Close), which is what package server does.
func (n *Node) DrainRequested() <-chan struct{} { return n.drain }

// suspectPoll is the membership read interval while a peer is suspected.
const suspectPoll = 100 * time.Millisecond

// suspect notes that a peer failed at the transport level (connection
// refused or lost): a crash looks like this. It never removes the peer (its
// row must expire first), it only reads the membership more often until a
// crashed peer's row would have expired.
func (n *Node) suspect() {
	n.suspectUntil.Store(time.Now().Add(n.cfg.MemberTTL + n.cfg.Heartbeat).UnixNano())
	n.poke(n.wakeBeat)
}

// Superseded is closed when another live process took this node's id: this
// process has stepped down for good and should exit (non-zero).
func (n *Node) Superseded() <-chan struct{} { return n.supersededCh }

// Leave leaves the cluster gracefully: the node leaves the ring (others
// route to the new owners), hands off every partition (in-flight batches
// finish, then the leases are released) and removes its member row. It
// returns when done or when ctx ends (partitions not released then are taken
// over when the member row expires). After Leave, Send fails with
// sequencer.ErrShuttingDown. The transport stays open for the replies of
// sends forwarded before; Close stops it.
func (n *Node) Leave(ctx context.Context) error {
	n.mu.Lock()
	switch n.phase {
	case phaseNew:
		n.phase = phaseLeft
		n.notifyLocked()
		n.mu.Unlock()
		return nil
	case phaseLeaving, phaseLeft:
		n.mu.Unlock()
		return errors.New("cluster: already leaving")
	}
	wasMember := n.phase == phaseActive
	n.phase = phaseLeaving
	n.notifyLocked()
	n.mu.Unlock()
	n.log.Info("leaving the cluster")

	if n.stopRecon != nil {
		n.stopRecon()
		<-n.reconDone
	}
	n.reconcileMu.Lock()
	defer n.reconcileMu.Unlock()

	var errs []error
	n.mu.RLock()
	self := n.self
	n.mu.RUnlock()
	if wasMember {
		v, err := n.store.Leave(ctx, self.NodeID, self.Incarnation)
		if err != nil {
			n.log.Warn("marking the member row leaving failed; handing off anyway", "err", err)
		} else {
			n.mu.Lock()
			n.applyViewLocked(v, time.Time{}) // Leave does not renew the lease
			n.mu.Unlock()
			n.wakeMembers(v, nil)
		}
	}
	for {
		n.mu.RLock()
		var held []uint32
		for _, l := range n.heldLeasesLocked(nil) {
			held = append(held, l.Partition)
		}
		n.mu.RUnlock()
		if len(held) == 0 {
			break
		}
		n.handoff(ctx, held)
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("cluster leave: partitions not handed off: %w", ctx.Err()))
			break
		}
		if n.countHeld() > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(n.cfg.Heartbeat):
			}
		}
	}
	if err := n.store.Remove(ctx, self.NodeID, self.Incarnation); err != nil {
		errs = append(errs, fmt.Errorf("cluster leave: removing the member row: %w", err))
	} else if v, err := n.store.View(ctx); err == nil {
		n.wakeMembers(v, nil)
	}
	if n.stopBeat != nil {
		n.stopBeat()
		<-n.beatDone
	}
	n.mu.Lock()
	n.phase = phaseLeft
	clear(n.parts)
	n.notifyLocked()
	n.mu.Unlock()
	n.log.Info("left the cluster")
	return errors.Join(errs...)
}

// Close stops the node-to-node transport. Call it after Leave and after the
// API stopped taking requests: sends this node forwarded before it left still
// need the transport to carry their replies back. Forwards still waiting when
// it closes fail with a retryable error.
func (n *Node) Close() error {
	n.fwdCancel()
	if err := n.tr.Close(); err != nil {
		return fmt.Errorf("cluster: closing the transport: %w", err)
	}
	return nil
}

func (n *Node) countHeld() int {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.countHeldLocked()
}

// halt stops the node as a crash would (tests): no handoff, no removal; the
// member row expires.
func (n *Node) halt() {
	n.mu.Lock()
	n.phase = phaseLeft
	clear(n.parts)
	n.notifyLocked()
	n.mu.Unlock()
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
