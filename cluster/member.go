package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ownership"
	"github.com/sequencer-im/sequencer/persist"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
	"github.com/sequencer-im/sequencer/ring"
)

// member is the membership job of a node: the member and its rounds. It
// holds the ownership core, joins and rejoins, renews the membership lease
// (beat), carries out the core's rounds (reconcile: take, hand off, step
// down), leaves, and answers the writer's ownership check (Fence, Refused).
// It tells the router when this node can write nothing (cut, writerCtx).
type member struct {
	cfg        Config
	log        *slog.Logger
	clk        clock.Clock
	store      membership.Store
	tr         Transport
	partitions int
	met        *clusterMetrics
	local      Local   // set by Start
	handler    Handler // what the transport serves (the node's peerServer)

	// mu guards core, the pure state of this node's ownership: every event
	// is fed to it and every answer read from it under mu. changed is closed
	// and replaced whenever the core changed (seen: the core's change count
	// then).
	mu      sync.RWMutex
	core    *ownership.Core
	changed chan struct{}
	seen    uint64

	drainOnce sync.Once
	drain     chan struct{} // closed when an operator marked this member leaving (DrainRequested)

	// suspectUntil (unix nanos, n.clk): a peer stopped answering at the transport
	// level; until then the membership is read every suspectPoll, so its
	// row's expiry (if it crashed) is seen at once.
	suspectUntil atomic.Int64
	viewLogged   atomic.Uint64 // the newest view version logged
	beatFailed   atomic.Bool   // the last heartbeat failed
	logMu        sync.Mutex
	logged       membership.View // the view viewed logged last (who left or died)

	refusedMu sync.Mutex
	refusing  map[string]bool // peers' cluster addresses being confirmed dead (peerRefused)

	// cut is canceled while this node can write nothing (NodeWritable
	// fails; watchCut): the sends in its local writer then give up their
	// attempt there and go on by the route (writerCtx).
	cut atomic.Pointer[cutSignal]

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

// newMember builds the member of a node not started yet.
func newMember(cfg Config, core *ownership.Core, tr Transport) *member {
	m := &member{
		cfg:          cfg,
		log:          cfg.Logger.With("node", cfg.NodeID),
		clk:          cfg.Clock,
		store:        cfg.Store,
		tr:           tr,
		partitions:   core.Partitions(),
		met:          newClusterMetrics(cfg.Metrics),
		core:         core,
		changed:      make(chan struct{}),
		wakeBeat:     make(chan struct{}, 1),
		wakeRecon:    make(chan struct{}, 1),
		drain:        make(chan struct{}),
		supersededCh: make(chan struct{}),
		refusing:     map[string]bool{},
	}
	m.cut.Store(newCutSignal())
	return m
}

// isMember reports whether nodeID is in the current view, and the channel
// closed at the core's next change (the forwarder's member question).
func (n *member) isMember(nodeID string) (bool, <-chan struct{}) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	_, ok := n.core.View().Member(nodeID)
	return ok, n.changed
}

// whoami is this node's id, incarnation and view version (the forwarder
// names them on every batch).
func (n *member) whoami() (nodeID, incarnation string, version uint64) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.core.Self().NodeID, n.core.Self().Incarnation, n.core.View().Version
}

// cutSignal is one stretch of time in which this node could write: its
// context is canceled when the node can write nothing any more.
type cutSignal struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newCutSignal() *cutSignal {
	ctx, cancel := context.WithCancel(context.Background())
	return &cutSignal{ctx: ctx, cancel: cancel}
}

// writerCtx is ctx for an attempt in the local writer, also canceled when
// this node can write nothing any more (its membership lease ran out
// unrenewed, it is in trouble or stepping down): a send waiting there for a
// store this node cannot reach gives up its attempt (outcome unknown) and
// goes on by the route, to the partition's next owner once it took over
// (whose resend check finds the message if that attempt stored it). Call it
// when Dispatch said local (the node can write now).
func (n *member) writerCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	c := n.cut.Load()
	if c.ctx.Err() != nil {
		// Writable again before watchCut saw it.
		fresh := newCutSignal()
		if n.cut.CompareAndSwap(c, fresh) {
			c = fresh
		} else {
			fresh.cancel()
			c = n.cut.Load()
		}
	}
	return mergeCancel(ctx, c.ctx)
}

// writerCut reports whether an attempt in the local writer ended because this
// node could write nothing any more (writerCtx), not because of its caller.
func writerCut(ctx, wctx context.Context) bool { return ctx.Err() == nil && wctx.Err() != nil }

// watchCut cancels the current cutSignal when this node can write nothing
// (NodeWritable fails: checked at every change of the core and when the
// membership lease would run out unrenewed) and starts a new one when it can
// again.
func (n *member) watchCut(ctx context.Context) {
	for {
		now := n.clk.Now()
		n.mu.RLock()
		err := n.core.NodeWritable(now)
		until := n.core.RenewedAt().Add(n.cfg.MemberTTL)
		changed := n.changed
		n.mu.RUnlock()
		wait := time.Hour
		if c := n.cut.Load(); err != nil {
			c.cancel()
		} else {
			if c.ctx.Err() != nil {
				n.cut.CompareAndSwap(c, newCutSignal())
			}
			wait = until.Sub(now) + time.Millisecond
		}
		t, fired := clock.After(n.clk, wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-changed:
		case <-fired:
		}
		t.Stop()
	}
}

// opCtx bounds one store operation of the membership machinery.
func (n *member) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, n.cfg.MemberTTL)
}

// newIncarnation names one process start of nodeID: unique, so a restarted
// node never inherits the fences of its predecessor.
func newIncarnation(nodeID string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return nodeID + "/" + hex.EncodeToString(b[:])
}

// update feeds one event to the core under n.mu and wakes the waiters if the
// core changed.
func (n *member) update(event func(c *ownership.Core)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	event(n.core)
	n.syncLocked()
	n.met.held(n.heldGaugeLocked())
}

// syncLocked wakes everything waiting for a change if the core changed
// since the last wake-up (n.mu held).
func (n *member) syncLocked() {
	if c := n.core.Changes(); c != n.seen {
		n.seen = c
		close(n.changed)
		n.changed = make(chan struct{})
	}
}

// heldGaugeLocked is sequencer_cluster_partitions_held: the partitions
// held, or 0 while the node could not write any (not an active member, in
// trouble, or its membership lease not renewed within MemberTTL), so a node
// cut from the store does not go on showing the partitions that the others
// take meanwhile. Every event refreshes it, failed heartbeats included (n.mu
// held).
func (n *member) heldGaugeLocked() int {
	if n.core.NodeWritable(n.clk.Now()) != nil {
		return 0
	}
	return n.core.Held()
}

// read answers a question of the core under n.mu (read-locked).
func read[T any](n *member, q func(c *ownership.Core) T) T {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return q(n.core)
}

// start serves the transport and joins, without the background loops
// (simulations drive beat and reconcile by hand).
func (n *member) start(ctx context.Context, local Local) error {
	if local == nil {
		return errors.New("cluster: Start needs the local writer")
	}
	n.mu.Lock()
	if n.local != nil || n.core.Phase() != ownership.PhaseNew {
		n.mu.Unlock()
		return errors.New("cluster: node already started")
	}
	n.local = local
	n.mu.Unlock()

	addr, err := n.tr.Start(n.handler)
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
		err := n.join(ctx, addr)
		if err == nil {
			return nil
		}
		if errors.Is(err, sequencer.ErrStoreUnavailable) && ctx.Err() == nil {
			// A store that answered the open but not the join in time (a
			// store under load, a link just back): try again until the
			// start's context ends. The join may have landed: its row is
			// then a live member with this node id, waited out as above,
			// from now.
			n.log.Warn("cluster join failed; retrying", "err", err)
			deadline = n.clk.Now().Add(n.cfg.MemberTTL + n.cfg.Heartbeat)
			n.clk.Sleep(n.cfg.Heartbeat)
			continue
		}
		if !errors.Is(err, membership.ErrSuperseded) || !n.clk.Now().Before(deadline) || ctx.Err() != nil {
			_ = n.tr.Close()
			if errors.Is(err, membership.ErrSuperseded) {
				return fmt.Errorf("%w: node id %q is held by a live member (another process runs with this --node-id)", err, n.cfg.NodeID)
			}
			return err
		}
		n.clk.Sleep(n.cfg.Heartbeat)
	}
}

// join enters the membership table as a new incarnation (clusterAddr "":
// the address of the previous one).
func (n *member) join(ctx context.Context, clusterAddr string) error {
	m := read(n, (*ownership.Core).Self)
	if clusterAddr != "" {
		m.ClusterAddr = clusterAddr
	}
	m.Incarnation = newIncarnation(m.NodeID)
	sent := n.clk.Now()
	jctx, cancel := n.opCtx(ctx)
	v, err := n.store.Join(jctx, m, n.cfg.MemberTTL, false)
	cancel()
	if err != nil {
		return fmt.Errorf("cluster join as %s: %w", m.NodeID, err)
	}
	n.update(func(c *ownership.Core) { c.Joined(m, v, sent) })
	n.log.Info("joined the cluster", "incarnation", m.Incarnation, "cluster_addr", m.ClusterAddr, "version", v.Version, "members", len(v.Members))
	n.viewed(v)
	go n.wakeMembers(v, nil)
	return nil
}

// rejoin joins as a new incarnation after a step-down. The previous
// incarnation's row may still be live (a step-down for a fenced commit, with
// heartbeats still succeeding): it is removed first, so the node is not
// refused as its own duplicate. Removing it releases nothing that the
// step-down did not already drop; its partitions become takeable.
func (n *member) rejoin(ctx context.Context, old membership.Member) {
	if old.Incarnation != "" {
		rctx, cancel := n.opCtx(ctx)
		err := n.store.Remove(rctx, old.NodeID, old.Incarnation)
		cancel()
		if err != nil {
			n.log.Warn("rejoin: could not remove the previous incarnation's row; retrying", "incarnation", old.Incarnation, "err", err)
			return
		}
	}
	err := n.join(ctx, "")
	switch {
	case errors.Is(err, membership.ErrSuperseded):
		n.log.Error("node id is held by another live process: staying out of the cluster", "err", err)
		n.update((*ownership.Core).JoinSuperseded)
		n.poke(n.wakeRecon)
	case err != nil:
		n.log.Warn("rejoin failed; retrying", "err", err)
	}
}

func (n *member) startLoops() {
	bctx, bcancel := context.WithCancel(context.Background())
	rctx, rcancel := context.WithCancel(context.Background())
	n.stopBeat, n.stopRecon = bcancel, rcancel
	n.beatDone, n.reconDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(n.beatDone)
		for {
			d := n.cfg.Heartbeat
			if n.clk.Now().UnixNano() < n.suspectUntil.Load() {
				d = min(d, suspectPoll)
			}
			t, fired := clock.After(n.clk, d)
			select {
			case <-bctx.Done():
				t.Stop()
				return
			case <-fired:
			case <-n.wakeBeat:
				t.Stop()
			}
			n.beat(bctx)
		}
	}()
	go n.watchCut(bctx)
	go func() {
		defer close(n.reconDone)
		for {
			n.reconcile(rctx)
			t, fired := clock.After(n.clk, n.cfg.Heartbeat)
			select {
			case <-rctx.Done():
				t.Stop()
				return
			case <-fired:
			case <-n.wakeRecon:
				t.Stop()
			}
		}
	}()
}

func (n *member) poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// observe adopts a view read outside a renewal.
func (n *member) observe(v membership.View) {
	n.update(func(c *ownership.Core) { c.Observed(v) })
	n.viewed(v)
}

// viewed reports a membership view read from the table: metrics, and a log
// line when its version is newer than any logged before.
func (n *member) viewed(v membership.View) {
	n.met.view(v)
	n.logDepartures(v)
	for {
		last := n.viewLogged.Load()
		if v.Version <= last {
			return
		}
		if n.viewLogged.CompareAndSwap(last, v.Version) {
			n.log.Info("membership view", "version", v.Version, "members", len(v.Members))
			return
		}
	}
}

// logDepartures names, in this node's log, every member of the view logged
// before that is gone from v: left (it was leaving: a drain or SIGTERM) or
// presumed dead (its lease ran out, or its row was removed: peerRefused),
// with the partitions it held then.
func (n *member) logDepartures(v membership.View) {
	n.logMu.Lock()
	defer n.logMu.Unlock()
	prev := n.logged
	if v.Version < prev.Version {
		return
	}
	n.logged = v // the newest renewals too: LeaseUntil below is the last one seen
	if v.Version == prev.Version {
		return
	}
	for _, m := range prev.Members {
		if m.NodeID == n.cfg.NodeID {
			continue
		}
		if now, ok := v.Member(m.NodeID); ok && now.Incarnation == m.Incarnation {
			continue
		}
		held := 0
		for _, l := range prev.Leases {
			if l.Owner == m.Incarnation {
				held++
			}
		}
		if m.Leaving {
			n.log.Info("member left", "member", m.NodeID, "incarnation", m.Incarnation, "partitions_held", held, "version", v.Version)
			continue
		}
		// Its last renewal was at LeaseUntil - MemberTTL (store clock).
		silent := v.Now.Sub(m.LeaseUntil.Add(-n.cfg.MemberTTL)).Round(100 * time.Millisecond)
		n.log.Info("member presumed dead", "member", m.NodeID, "incarnation", m.Incarnation,
			"silent_for", silent, "partitions_held", held, "version", v.Version)
	}
}

// beat renews the membership lease once.
func (n *member) beat(ctx context.Context) {
	ph, self := read(n, (*ownership.Core).Phase), read(n, (*ownership.Core).Self)
	if ph != ownership.PhaseActive && ph != ownership.PhaseLeaving {
		return
	}
	sent := n.clk.Now()
	bctx, cancel := context.WithTimeout(ctx, n.cfg.MemberTTL/2)
	v, err := n.store.Heartbeat(bctx, self.NodeID, self.Incarnation, n.cfg.MemberTTL)
	cancel()
	if err == nil && n.beatFailed.Swap(false) && n.cfg.IDs != nil {
		// The store answers again: the msg_id issuer need not wait out
		// its retry (or a call the outage left hanging).
		n.cfg.IDs.Kick()
	}
	if err == nil {
		var drain bool
		var moved bool
		n.update(func(c *ownership.Core) {
			before := c.View()
			drain = c.Renewed(self.Incarnation, v, sent)
			after := c.View()
			moved = after.Version != before.Version || !slices.Equal(after.Leases, before.Leases)
		})
		if moved {
			// A new view (a member joined, left or expired), or leases
			// that changed hands (a peer released what the ring now gives
			// this node, and woke it to read them): take or hand off what
			// moved now, not at the next reconcile tick.
			n.poke(n.wakeRecon)
		}
		n.viewed(v)
		if drain {
			n.drainOnce.Do(func() {
				n.log.Info("drain requested: the member row was marked leaving by an operator; leaving gracefully")
				close(n.drain)
			})
		}
		return
	}
	n.beatFailed.Store(true)
	var trouble bool
	n.update(func(c *ownership.Core) { trouble = c.RenewFailed(self.Incarnation, err) })
	if !trouble {
		n.log.Warn("heartbeat failed", "err", err)
		return
	}
	n.log.Warn("membership lease lost: stepping down", "incarnation", self.Incarnation, "err", err)
	n.poke(n.wakeRecon)
}

// reconcile carries out one round of the core (ownership.Core.Next): step
// down and rejoin, or hand off what moved away and take what is ours.
func (n *member) reconcile(ctx context.Context) {
	n.reconcileMu.Lock()
	defer n.reconcileMu.Unlock()
	var rd ownership.Round
	n.update(func(c *ownership.Core) { rd = c.Next() })
	if rd.StepDown {
		if !rd.Final {
			// The rejoin below waits for msg_ids: let the issuer renew
			// while the conversations stop.
			_ = n.issuable()
		}
		n.stepDown(ctx, rd)
		if rd.Final {
			n.update((*ownership.Core).Superseded)
			n.supersededOnce.Do(func() { close(n.supersededCh) })
			return
		}
	}
	if rd.Rejoin {
		if err := n.issuable(); err != nil {
			// Not yet: the peers keep serving this node's partitions
			// until it can (the next round tries again).
			n.log.Debug("rejoin waits for msg_ids", "err", err)
			return
		}
		n.rejoin(ctx, rd.Old)
		return
	}
	if len(rd.Release) > 0 {
		n.release(ctx, rd.Release)
	}
	if len(rd.Acquire) > 0 {
		n.acquire(ctx, rd.Incarnation, rd.Version, rd.Acquire)
	}
}

// issuable is nil when the node can issue msg_ids (Config.IDs), else why
// not, after kicking the issuer: a rejoin is decided on an answer of the
// store, so it answers again.
func (n *member) issuable() error {
	if n.cfg.IDs == nil {
		return nil
	}
	err := n.cfg.IDs.Issuable()
	if err != nil {
		n.cfg.IDs.Kick()
	}
	return err
}

// stopConvs stops the local conversations of the partitions in set (nil:
// all), bounded by StopTimeout.
func (n *member) stopConvs(ctx context.Context, set map[uint32]bool) {
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

// partitionSet is the set of the partitions of leases.
func partitionSet(leases []membership.PartitionLease) map[uint32]bool {
	set := make(map[uint32]bool, len(leases))
	for _, l := range leases {
		set[l.Partition] = true
	}
	return set
}

// stepDown carries out a step-down the core decided (every partition is
// already dropped, so Fence refuses): stop all conversations (in-flight
// batches finish or are fenced) and free the leases that were held (best
// effort).
func (n *member) stepDown(ctx context.Context, rd ownership.Round) {
	n.log.Warn("stepping down: all partitions dropped", "reason", rd.Reason.String(), "held", len(rd.Leases))
	n.met.stepDown()
	n.stopConvs(ctx, nil)
	if len(rd.Leases) > 0 {
		rctx, cancel := n.opCtx(ctx)
		defer cancel()
		if err := n.store.Release(rctx, rd.Leases); err != nil {
			n.log.Debug("release after step-down failed (the leases expire with the member row)", "err", err)
		}
	}
}

// handoff gives up partitions ps (Leave): no new fences, in-flight batches
// finish, then the leases are released.
func (n *member) handoff(ctx context.Context, ps []uint32) {
	var leases []membership.PartitionLease
	n.update(func(c *ownership.Core) { leases = c.StartHandoff(ps) })
	n.release(ctx, leases)
}

// release hands off leases already marked moving: their conversations stop
// (in-flight batches finish), then the leases are released. On a failed
// release they stay moving and the next round retries.
func (n *member) release(ctx context.Context, leases []membership.PartitionLease) {
	if len(leases) == 0 {
		return
	}
	n.stopConvs(ctx, partitionSet(leases))
	rctx, cancel := n.opCtx(ctx)
	err := n.store.Release(rctx, leases)
	cancel()
	if err != nil {
		n.log.Warn("releasing partitions failed; retrying", "partitions", len(leases), "err", err)
		return
	}
	var r *ring.Ring
	var view membership.View
	var heldNow int
	n.update(func(c *ownership.Core) {
		c.Released(leases)
		r, view, heldNow = c.Ring(), c.View(), c.Held()
	})
	n.met.released(len(leases))
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
func (n *member) acquire(ctx context.Context, incarnation string, version uint64, ps []uint32) {
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
	n.stopConvs(ctx, partitionSet(leases))
	var heldNow int
	n.update(func(c *ownership.Core) {
		c.Acquired(incarnation, leases)
		heldNow = c.Held()
	})
	n.met.acquired(len(leases))
	n.log.Info("partitions acquired", "count", len(leases), "held", heldNow, "version", version)
}

// wakeMembers asks the members of view accepted by only (nil: all but this
// node) to read the table now.
func (n *member) wakeMembers(view membership.View, only func(membership.Member) bool, released ...uint32) {
	w := &clusterv1.WakeRequest{FromNode: n.cfg.NodeID, MembershipVersion: view.Version, Released: released}
	for _, m := range view.Members {
		if m.NodeID == n.cfg.NodeID || m.ClusterAddr == "" || (only != nil && !only(m)) {
			continue
		}
		n.tr.Wake(m.ClusterAddr, w)
	}
}

// Fence implements the writer's ownership check (actor.Ownership): the fence
// for a commit of convID by the one predicate (ownership.Core.Writable), or
// an error wrapping sequencer.ErrNotOwner or sequencer.ErrOwnershipMoving
// (both retryable).
func (n *member) Fence(convID string) (persist.Fence, error) {
	p := ring.PartitionOf(convID, n.partitions)
	now := n.clk.Now()
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.core.Writable(p, now)
}

// Refused implements the writer's report of a commit refused for stale
// fences (actor.Ownership): if one is a partition this incarnation still
// believes it holds at that epoch, the partition was taken over and the node
// steps down.
func (n *member) Refused(fences []persist.Fence) {
	var trouble bool
	n.update(func(c *ownership.Core) { trouble = c.Refused(fences) })
	if trouble {
		n.log.Warn("commit fenced: partition taken over; stepping down", "fences", len(fences))
		n.poke(n.wakeRecon)
	}
}

// suspectPoll is the membership read interval while a peer is suspected.
const suspectPoll = 100 * time.Millisecond

// suspect notes that a peer failed at the transport level (connection
// refused or lost): a crash looks like this. It never removes the peer (its
// row must expire first), it only reads the membership more often until a
// crashed peer's row would have expired.
func (n *member) suspect() {
	n.suspectUntil.Store(n.clk.Now().Add(n.cfg.MemberTTL + n.cfg.Heartbeat).UnixNano())
	n.poke(n.wakeBeat)
}

// How a peer whose cluster port refuses connections is confirmed dead
// (peerRefused): deadProbes probes deadProbeGap apart, each refused.
const (
	deadProbes   = 3
	deadProbeGap = 100 * time.Millisecond
)

// peerRefused is told that the peer at addr refused a connection: no
// process listens on its cluster port, which is what a crashed (kill -9)
// node looks like, long before its membership lease runs out. Once
// deadProbes probes deadProbeGap apart are refused too, the peer's member
// row is removed (as `sequencer admin forget` does), so the survivors take
// its partitions over at once instead of after MemberTTL. Safety does not
// rest on this: a node whose row is removed while it lives finds it gone at
// its next heartbeat and steps down, and its commits are fenced by the
// takeover's epoch (the model lets any row expire at any moment). Only a
// refused connection counts: a blackhole, a reset or a slow link does not.
func (n *member) peerRefused(addr string) {
	prober, ok := n.tr.(Prober)
	if !ok || addr == "" {
		return
	}
	n.refusedMu.Lock()
	if n.refusing[addr] {
		n.refusedMu.Unlock()
		return
	}
	n.refusing[addr] = true
	n.refusedMu.Unlock()
	go func() {
		defer func() {
			n.refusedMu.Lock()
			delete(n.refusing, addr)
			n.refusedMu.Unlock()
		}()
		for i := range deadProbes {
			if i > 0 {
				n.clk.Sleep(deadProbeGap)
			}
			ctx, cancel := context.WithTimeout(context.Background(), ForwardProbeTimeout)
			err := prober.Probe(ctx, addr)
			cancel()
			if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
				return
			}
		}
		var dead membership.Member
		for _, m := range read(n, func(c *ownership.Core) membership.View { return c.View() }).Members {
			if m.ClusterAddr == addr && m.NodeID != n.cfg.NodeID {
				dead = m
			}
		}
		if dead.NodeID == "" {
			return
		}
		ctx, cancel := n.opCtx(context.Background())
		err := n.store.Remove(ctx, dead.NodeID, dead.Incarnation)
		cancel()
		if err != nil {
			n.log.Debug("removing the row of a member whose cluster port refuses connections failed", "member", dead.NodeID, "err", err)
			return
		}
		n.log.Info("member presumed dead: its cluster port refuses connections; its row is removed", "member", dead.NodeID,
			"incarnation", dead.Incarnation, "cluster_addr", addr)
		n.poke(n.wakeBeat)
	}()
}

// leave carries out Node.Leave.
func (n *member) leave(ctx context.Context) error {
	var wasMember bool
	var err error
	n.update(func(c *ownership.Core) { wasMember, err = c.Leave() })
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if read(n, (*ownership.Core).Phase) == ownership.PhaseLeft {
		return nil // never started
	}
	n.log.Info("leaving the cluster")

	if n.stopRecon != nil {
		n.stopRecon()
		<-n.reconDone
	}
	n.reconcileMu.Lock()
	defer n.reconcileMu.Unlock()

	var errs []error
	self := read(n, (*ownership.Core).Self)
	if wasMember {
		v, err := n.store.Leave(ctx, self.NodeID, self.Incarnation)
		if err != nil {
			n.log.Warn("marking the member row leaving failed; handing off anyway", "err", err)
		} else {
			n.observe(v) // Leave does not renew the lease
			n.wakeMembers(v, nil)
		}
	}
	for {
		var held []uint32
		for _, l := range read(n, (*ownership.Core).HeldLeases) {
			held = append(held, l.Partition)
		}
		if len(held) == 0 {
			break
		}
		n.handoff(ctx, held)
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("cluster leave: partitions not handed off: %w", ctx.Err()))
			break
		}
		if read(n, (*ownership.Core).Held) > 0 {
			t, fired := clock.After(n.clk, n.cfg.Heartbeat)
			select {
			case <-ctx.Done():
			case <-fired:
			}
			t.Stop()
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
	n.update((*ownership.Core).Left)
	n.log.Info("left the cluster")
	return errors.Join(errs...)
}
