package idgen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/internal/conf"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
)

// IssuerConfig configures an Issuer. DefaultIssuerConfig holds the defaults;
// zero fields take them, and the intervals left zero follow TTL.
type IssuerConfig struct {
	// Holder names this process in the lease table (the node id). Required.
	Holder string
	// TTL is how long a lease lives without a renew (at least 10ms).
	TTL time.Duration
	// RenewEvery is the background renew interval. Default (zero) TTL/5.
	RenewEvery time.Duration
	// ReserveAhead is how far past "now" each renew reserves milliseconds
	// in the store (LastMs = now + ReserveAhead); the generator issues
	// nothing beyond the reservation until the next renew records a new
	// one. Must satisfy RenewEvery < ReserveAhead <= TTL, so that regular
	// renews keep the generator running and a successor that takes the id
	// over after expiry never finds LastMs ahead of a correct clock.
	// Default (zero) TTL/2.
	ReserveAhead time.Duration
	// RetryEvery is the background retry interval after a failed renew or
	// acquire, and the shortest interval between two store attempts that
	// Next makes itself when the reservation runs out. Default (zero)
	// RenewEvery/4.
	RetryEvery time.Duration
	// StoreTimeout bounds each store call. Default (zero) RenewEvery.
	StoreTimeout time.Duration
	// MaxStoreSkew is how far this clock may be behind the store's clock
	// (persist.WorkerLease.StoreMs, beyond the call's round trip) before the
	// generator treats it as a clock that moved back: ids are then refused
	// (retryably, counted in sequencer_clock_rollbacks_total) until the
	// clock catches up. NTP keeps servers well within the default, and a
	// clock an hour behind is caught. Negative: no check (tests that drive
	// a real store with a fake clock).
	MaxStoreSkew time.Duration
	// Clock is the time source of the lease and its generator; nil means
	// the real clock. Every store call takes `now` from it.
	Clock clock.Clock
	// Metrics is optional; nil records nothing.
	Metrics *metrics.Set
}

// minLeaseTTL is the shortest IssuerConfig.TTL.
const minLeaseTTL = 10 * time.Millisecond

// DefaultIssuerConfig returns the defaults (Holder is still required). The
// intervals it leaves zero follow TTL: RenewEvery TTL/5, ReserveAhead
// TTL/2, RetryEvery RenewEvery/4, StoreTimeout RenewEvery (docs/IDGEN.md).
func DefaultIssuerConfig() IssuerConfig {
	return IssuerConfig{
		TTL:          10 * time.Second,
		MaxStoreSkew: 100 * time.Millisecond,
	}
}

// withDerived returns c with the zero intervals set from TTL.
func (c IssuerConfig) withDerived() IssuerConfig {
	if c.RenewEvery == 0 {
		c.RenewEvery = c.TTL / 5
	}
	if c.ReserveAhead == 0 {
		c.ReserveAhead = c.TTL / 2
	}
	if c.RetryEvery == 0 {
		c.RetryEvery = c.RenewEvery / 4
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = c.RenewEvery
	}
	return c
}

// Validate reports every field that makes no sense: TTL as given (zero
// too), the intervals after the ones left zero follow TTL. Holder is
// checked by NewIssuer.
func (c IssuerConfig) Validate() error {
	ch := conf.Checker{Pkg: "idgen"}
	if c.TTL < minLeaseTTL {
		ch.Bad("TTL", c.TTL, fmt.Sprintf("must be at least %v", minLeaseTTL))
		return ch.Err()
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"RenewEvery", c.RenewEvery}, {"ReserveAhead", c.ReserveAhead}, {"RetryEvery", c.RetryEvery}, {"StoreTimeout", c.StoreTimeout}} {
		if f.v < 0 {
			ch.Bad(f.name, f.v, "must be > 0 (or 0: derived from TTL)")
		}
	}
	if err := ch.Err(); err != nil {
		return err
	}
	d := c.withDerived()
	conf.PositiveDuration(&ch, "RetryEvery", d.RetryEvery) // RenewEvery/4 of a RenewEvery of a few ns
	if !(d.RenewEvery < d.ReserveAhead && d.ReserveAhead <= d.TTL) {
		ch.Bad("ReserveAhead", d.ReserveAhead, fmt.Sprintf("need RenewEvery (%s) < ReserveAhead (%s) <= TTL (%s)",
			d.RenewEvery, d.ReserveAhead, d.TTL))
	}
	return ch.Err()
}

func (c *IssuerConfig) setDefaults() error {
	if c.Holder == "" {
		return errors.New("idgen: lease config: Holder is required")
	}
	conf.FillZero(c, DefaultIssuerConfig())
	if err := c.Validate(); err != nil {
		return err
	}
	*c = c.withDerived()
	return nil
}

// Issuer is the node's msg_id source: a Generator on a worker id it
// leases from the store. It keeps that worker-id lease for the Generator: it acquires
// a worker id, renews it, records reservations, and releases it on Close.
//
// Ordering rule (what makes ids unique across crashes): a renew writes the
// reservation LastMs = now + ReserveAhead to the store BEFORE the generator
// may issue ids for any millisecond up to it, so the store's LastMs is always
// at or above every id's millisecond. A successor (or this process after a
// restart, with a clock that moved back) never issues at or below it.
//
// When a renew fails and the lease has expired by the lease's own clock (or
// the store says it was taken over), the generator stops issuing (Next fails
// with sequencer.ErrWorkerLeaseLost) until a later RenewOnce acquires a new
// lease, possibly for another worker id; ids stay strictly increasing across
// the switch.
//
// Background renewals run in Start's loop; tests call RenewOnce directly with
// a clock.Fake instead.
type Issuer struct {
	store persist.WorkerLeases
	cfg   IssuerConfig
	clk   clock.Clock
	gen   *Generator
	gauge prometheus.Gauge // nil without metrics

	mu        sync.Mutex // serializes store calls and view changes
	held      bool
	closed    bool
	cur       persist.WorkerLease // the held lease as last returned by the store
	inherited int64               // LastMs of the lease when acquired: floor
	capMs     int64               // reservation recorded in the store (unix ms)
	viewGen   uint64
	failAtMs  int64 // clock ms of the last failed store call
	failErr   error // its error; nil after a success

	stop     context.CancelFunc // background loop, if started
	loopDone chan struct{}

	kick   chan struct{} // Kick's wake-up of the loop (buffered 1)
	callMu sync.Mutex    // guards call (l.mu is held through store calls)
	call   *storeCall    // the store call in flight, nil when none
}

// storeCall is a store call in flight, for Kick.
type storeCall struct {
	started time.Time
	cancel  context.CancelFunc
	kicked  bool // made for a Kick: a later Kick leaves it alone
}

// NewIssuer returns an Issuer on store with its Generator. It acquires nothing
// yet: call Start (or RenewOnce). Until then Next fails with
// sequencer.ErrWorkerLeaseLost.
func NewIssuer(store persist.WorkerLeases, cfg IssuerConfig) (*Issuer, error) {
	if store == nil {
		return nil, errors.New("idgen: NewIssuer: nil store")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	l := &Issuer{store: store, cfg: cfg, clk: clock.Or(cfg.Clock), kick: make(chan struct{}, 1)}
	if cfg.Metrics != nil {
		l.gauge = cfg.Metrics.WorkerLease
		l.gauge.Set(0)
	}
	l.gen = newGenerator(l.clk, cfg.Metrics, l)
	l.gen.view.Store(&view{err: errNoLease})
	return l, nil
}

// Config returns the configuration with defaults applied.
func (l *Issuer) Config() IssuerConfig { return l.cfg }

// Generator returns the generator this lease gates.
func (l *Issuer) Generator() *Generator { return l.gen }

// Next is l.Generator().Next().
func (l *Issuer) Next() (uint64, error) { return l.gen.Next() }

// WorkerID returns the leased worker id and whether a lease is held.
func (l *Issuer) WorkerID() (int, bool) { return l.gen.WorkerID() }

// Held returns the lease as last returned by the store, and whether it is
// held.
func (l *Issuer) Held() (persist.WorkerLease, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur, l.held
}

// CanIssue reports whether the generator can issue ids now without a store
// round trip (Issuable returns nil).
func (l *Issuer) CanIssue() bool { return l.Issuable() == nil }

// Issuable returns nil when the generator can issue ids now without a store
// round trip: a lease is held, unexpired by the lease's clock, the current
// millisecond is within the recorded reservation and not below the lease's
// floor, and the clock is not more than MaxClockRollback behind the last id
// issued (after a step back, Next refuses until the clock catches up).
// Otherwise it says why, wrapping sequencer.ErrClockMovedBackwards (the
// clock) or sequencer.ErrWorkerLeaseLost (the lease). For /readyz.
func (l *Issuer) Issuable() error {
	v := l.gen.view.Load()
	if !v.held {
		return fmt.Errorf("idgen: no worker id lease held: %w", sequencer.ErrWorkerLeaseLost)
	}
	now := l.clk.Now().UnixMilli()
	behind := func(ms int64) time.Duration { return time.Duration(ms-now) * time.Millisecond }
	switch last := l.gen.LastMs(); {
	case last-now > MaxClockRollback.Milliseconds():
		return fmt.Errorf("idgen: clock is %v behind the last issued id: %w", behind(last), sequencer.ErrClockMovedBackwards)
	case now < v.floorMs:
		return fmt.Errorf("idgen: clock is %v behind the lease's floor (an earlier holder, an earlier run of this node, or the store's clock): %w",
			behind(v.floorMs), sequencer.ErrClockMovedBackwards)
	case now >= v.expiresMs:
		return fmt.Errorf("idgen: worker id %d lease expired by this clock (not renewed): %w", v.worker, sequencer.ErrWorkerLeaseLost)
	case now > v.capMs:
		return fmt.Errorf("idgen: worker id %d msg_id reservation used up (not renewed): %w", v.worker, sequencer.ErrWorkerLeaseLost)
	}
	return nil
}

// Start makes one RenewOnce attempt (acquiring a worker id) bounded by ctx,
// then keeps renewing in a background goroutine until Close: every
// RenewEvery while the lease is held, every RetryEvery after a failure
// (re-acquiring when the lease was lost). It returns the first attempt's
// error; the loop runs either way, so a node may start while the store is
// down and become Ready later. Call Start at most once.
func (l *Issuer) Start(ctx context.Context) error {
	first := l.RenewOnce(ctx)
	loopCtx, cancel := context.WithCancel(context.Background())
	l.mu.Lock()
	if l.closed || l.stop != nil {
		l.mu.Unlock()
		cancel()
		if l.closed {
			return sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrShuttingDown, "idgen: lease closed")
		}
		return errors.New("idgen: lease already started")
	}
	l.stop, l.loopDone = cancel, make(chan struct{})
	l.mu.Unlock()
	go func() {
		defer close(l.loopDone)
		l.loop(loopCtx, first)
	}()
	return first
}

// Run renews until ctx ends or the lease is closed: like Start's loop, for
// callers that manage their own goroutines. It makes the first attempt at
// once.
func (l *Issuer) Run(ctx context.Context) {
	l.loop(ctx, l.RenewOnce(ctx))
}

func (l *Issuer) loop(ctx context.Context, last error) {
	for {
		d := l.cfg.RenewEvery
		if last != nil {
			d = l.cfg.RetryEvery
		}
		t, wait := l.clk.NewTimer(d)
		kicked := false
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wait:
		case <-l.kick:
			t.Stop()
			kicked = true
		}
		l.mu.Lock()
		closed := l.closed
		l.mu.Unlock()
		if closed {
			return
		}
		last = l.renewOnce(ctx, kicked)
	}
}

// Kick asks for a renewal now, when msg_ids cannot be issued: told that the
// store answers again (the cluster's heartbeat reached it, a ping did), the
// loop does not wait out RetryEvery, and a store call that has waited longer
// than RetryEvery is given up and made again at once. Such a call was
// likely sent on a connection the outage broke (a blackholed link drops the
// request or its answer; the call would wait out its whole StoreTimeout).
// A call made for a Kick is never given up for a later one, so kicks cannot
// starve a slow store's renewal. No-op while ids can be issued.
func (l *Issuer) Kick() {
	if l.Issuable() == nil {
		return
	}
	l.callMu.Lock()
	if c := l.call; c != nil && !c.kicked && l.clk.Since(c.started) >= l.cfg.RetryEvery {
		c.cancel()
	}
	l.callMu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// storeCtx bounds one store call (l.mu held) by StoreTimeout and registers
// it for Kick; done ends it.
func (l *Issuer) storeCtx(parent context.Context, kicked bool) (ctx context.Context, done func()) {
	ctx, cancel := context.WithTimeout(parent, l.cfg.StoreTimeout)
	c := &storeCall{started: l.clk.Now(), cancel: cancel, kicked: kicked}
	l.callMu.Lock()
	l.call = c
	l.callMu.Unlock()
	return ctx, func() {
		l.callMu.Lock()
		if l.call == c {
			l.call = nil
		}
		l.callMu.Unlock()
		cancel()
	}
}

// RenewOnce is one step of the lease's life, taken at the clock's current
// time: renew the held lease (recording a new reservation), or acquire one
// when none is held (also right after a renew found the lease lost). The
// background loop calls it; tests call it directly.
func (l *Issuer) RenewOnce(ctx context.Context) error { return l.renewOnce(ctx, false) }

func (l *Issuer) renewOnce(ctx context.Context, kicked bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, done := l.storeCtx(ctx, kicked)
	defer done()
	if l.closed {
		return sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrShuttingDown, "idgen: lease closed")
	}
	var renewErr error
	if l.held {
		renewErr = l.renewLocked(ctx)
		if l.held {
			return renewErr
		}
	}
	if err := l.acquireLocked(ctx); err != nil {
		if renewErr != nil {
			return fmt.Errorf("%w; re-acquire: %w", renewErr, err)
		}
		return err
	}
	return nil
}

// acquireLocked takes a worker id and records a first reservation.
func (l *Issuer) acquireLocked(ctx context.Context) error {
	now := l.clk.Now()
	wl, err := l.store.AcquireWorker(ctx, l.cfg.Holder, now, l.cfg.TTL)
	end := l.clk.Now()
	if err != nil {
		l.failedLocked(err)
		return fmt.Errorf("idgen: acquire worker id for %q: %w", l.cfg.Holder, err)
	}
	if wl.WorkerID < 0 || wl.WorkerID > MaxWorkerID {
		// A store bug; refuse to issue anything under it.
		return sequencer.Errorf(sequencer.CodeInternal, "idgen: store leased worker id %d outside 0..%d", wl.WorkerID, MaxWorkerID)
	}
	// The floor: the id's previous holder's reservation; this node's own
	// history under any id (a clock far below what an earlier run of it
	// reserved moved back, whichever id it gets now); the store's clock.
	floor := max(wl.LastMs, wl.HighWaterMs-l.cfg.ReserveAhead.Milliseconds(), l.storeFloor(wl.StoreMs, now, end))
	l.held, l.cur, l.inherited, l.capMs = true, wl, floor, floor
	// Nothing is issuable (cap == floor) until the reservation below lands.
	rerr := l.reserveLocked(ctx)
	l.publishLocked(true)
	if l.gauge != nil {
		l.gauge.Set(1)
	}
	if rerr != nil {
		if l.loseIfGoneLocked(rerr) {
			return fmt.Errorf("idgen: acquired worker id %d, then lost it: %w", wl.WorkerID, rerr)
		}
		return fmt.Errorf("idgen: acquired worker id %d, first reservation failed: %w", wl.WorkerID, rerr)
	}
	return nil
}

// renewLocked renews the held lease with a new reservation; on failure it
// drops the lease if the store says it is gone or it expired by our clock.
func (l *Issuer) renewLocked(ctx context.Context) error {
	if err := l.reserveLocked(ctx); err != nil {
		l.loseIfGoneLocked(err)
		return fmt.Errorf("idgen: renew worker id %d lease: %w", l.cur.WorkerID, err)
	}
	l.publishLocked(false)
	return nil
}

// reserveLocked records LastMs = now + ReserveAhead in the store (the store
// never lowers it) and, on success, raises capMs to it.
func (l *Issuer) reserveLocked(ctx context.Context) error {
	now := l.clk.Now()
	reserve := now.UnixMilli() + l.cfg.ReserveAhead.Milliseconds()
	if reserve < l.capMs {
		reserve = l.capMs
	}
	wl, err := l.store.RenewWorker(ctx, l.cur, reserve, now, l.cfg.TTL)
	end := l.clk.Now()
	if err != nil {
		l.failedLocked(err)
		return err
	}
	l.inherited = max(l.inherited, l.storeFloor(wl.StoreMs, now, end))
	if wl.WorkerID != l.cur.WorkerID {
		return sequencer.Errorf(sequencer.CodeInternal, "idgen: store renewed worker id %d as %d", l.cur.WorkerID, wl.WorkerID)
	}
	l.cur, l.capMs, l.failErr = wl, reserve, nil
	return nil
}

// storeFloor is the floor the store's clock sets: storeMs was read during a
// call this clock timed from start to end, so a clock at most MaxStoreSkew
// behind the store's is past storeMs - (end-start) - MaxStoreSkew by the
// time the call returns. 0 when the store has no clock of its own.
func (l *Issuer) storeFloor(storeMs int64, start, end time.Time) int64 {
	if storeMs <= 0 || l.cfg.MaxStoreSkew < 0 {
		return 0
	}
	return storeMs - end.Sub(start).Milliseconds() - l.cfg.MaxStoreSkew.Milliseconds()
}

func (l *Issuer) failedLocked(err error) {
	l.failAtMs, l.failErr = l.clk.Now().UnixMilli(), err
}

// loseIfGoneLocked drops the lease when err says it was taken over or it
// has expired by our clock. It reports whether it did.
func (l *Issuer) loseIfGoneLocked(err error) bool {
	if !l.held {
		return true
	}
	if !errors.Is(err, sequencer.ErrWorkerLeaseLost) && l.clk.Now().Before(l.cur.Expires) {
		return false
	}
	l.held = false
	l.publishLocked(true)
	if l.gauge != nil {
		l.gauge.Set(0)
	}
	return true
}

// publishLocked installs the lease's current rights as the generator's view.
// With newGen (lease acquired, lost or released) it also moves the state to
// the new generation, so a Next that loaded the previous view cannot issue
// under it any more, and marks the last ms used up, so the next id is for a
// later millisecond (ids keep increasing across a worker id switch).
func (l *Issuer) publishLocked(newGen bool) {
	if newGen {
		l.viewGen = (l.viewGen + 1) & genMask
	}
	v := &view{gen: l.viewGen, held: l.held}
	if l.held {
		v.worker = uint64(l.cur.WorkerID)
		v.floorMs, v.capMs, v.expiresMs = l.inherited, l.capMs, l.cur.Expires.UnixMilli()
	} else if l.closed {
		v.err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrWorkerLeaseLost, "idgen: worker id lease released (closed)")
	} else {
		v.err = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrWorkerLeaseLost,
			fmt.Sprintf("idgen: worker id %d lease lost", l.cur.WorkerID))
	}
	l.gen.view.Store(v)
	if !newGen {
		return
	}
	for {
		s := l.gen.state.Load()
		_, rel, _ := unpack(s)
		if l.gen.state.CompareAndSwap(s, pack(l.viewGen, rel, MaxSeq)) {
			return
		}
	}
}

// reserve is called by Next when the current millisecond is past the
// reservation or the lease end: renew now (at most once per RetryEvery).
func (l *Issuer) reserve(nowMs int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.gen.view.Load()
	if !v.held {
		return v.err
	}
	if nowMs <= v.capMs && nowMs < v.expiresMs {
		return nil // renewed meanwhile
	}
	if l.failErr != nil && nowMs >= l.failAtMs && nowMs-l.failAtMs < l.cfg.RetryEvery.Milliseconds() {
		return sequencer.Wrap(sequencer.CodeUnavailable, l.failErr,
			fmt.Sprintf("idgen: msg_id reservation (through ms %d) used up and the store failed to renew it", v.capMs))
	}
	ctx, done := l.storeCtx(context.Background(), false)
	defer done()
	if err := l.renewLocked(ctx); err != nil {
		if !l.held {
			return l.gen.view.Load().err
		}
		return sequencer.Wrap(sequencer.CodeUnavailable, err,
			fmt.Sprintf("idgen: msg_id reservation (through ms %d) used up", v.capMs))
	}
	return nil
}

// Close stops the background loop, stops the generator (Next fails with
// sequencer.ErrWorkerLeaseLost from now on) and releases the lease,
// recording the last millisecond actually issued (never below the LastMs
// inherited at acquire), so a successor need not wait out the reservation.
// Closing twice is a no-op.
func (l *Issuer) Close(ctx context.Context) error {
	l.mu.Lock()
	stop, done := l.stop, l.loopDone
	l.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	wasHeld, cur := l.held, l.cur
	l.held = false
	l.publishLocked(true) // after this no Next can issue
	if l.gauge != nil {
		l.gauge.Set(0)
	}
	if !wasHeld {
		return nil
	}
	lastMs := l.gen.LastMs()
	if lastMs < l.inherited {
		lastMs = l.inherited
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	defer cancel()
	if err := l.store.ReleaseWorker(ctx, cur, lastMs); err != nil {
		return fmt.Errorf("idgen: release worker id %d (last ms %d): %w", cur.WorkerID, lastMs, err)
	}
	return nil
}

var _ reserver = (*Issuer)(nil)
