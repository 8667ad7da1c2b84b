package idgen

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
)

func newTestLease(t *testing.T, store persist.WorkerLeases, holder string, clk clock.Clock, m *metrics.Set) *Issuer {
	t.Helper()
	l, err := NewIssuer(store, IssuerConfig{Holder: holder, Clock: clk, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// newFakeClockLease is a lease on a real store driven by a fake clock: the
// store's own clock check is off (the fake clock is not the store's time).
func newFakeClockLease(t *testing.T, store persist.WorkerLeases, holder string, clk clock.Clock, m *metrics.Set) *Issuer {
	t.Helper()
	l, err := NewIssuer(store, IssuerConfig{Holder: holder, Clock: clk, Metrics: m, MaxStoreSkew: -1})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustRenew(t *testing.T, l *Issuer) {
	t.Helper()
	if err := l.RenewOnce(context.Background()); err != nil {
		t.Fatalf("RenewOnce: %v", err)
	}
}

// issueChecked issues an id and checks the store's reservation covers it:
// the invariant that makes ids unique across crashes.
func issueChecked(t *testing.T, l *Issuer, store *leaseStore) uint64 {
	t.Helper()
	id, err := l.Next()
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	ts, w, _ := Decode(id)
	if got := store.Worker(w).LastMs; ts.UnixMilli() > got {
		t.Fatalf("id %d for ms %d issued beyond the store's reservation %d", id, ts.UnixMilli(), got)
	}
	return id
}

func wantLeaseLost(t *testing.T, l *Issuer) {
	t.Helper()
	id, err := l.Next()
	if !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("Next = %d, %v; want ErrWorkerLeaseLost", id, err)
	}
	if c := sequencer.ErrorCode(err); c != sequencer.CodeUnavailable {
		t.Fatalf("code %s, want unavailable", c)
	}
	if err := l.Issuable(); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("Issuable() with no usable lease = %v, want ErrWorkerLeaseLost", err)
	}
}

func TestIssuerConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  IssuerConfig
		ok   bool
		want IssuerConfig // checked when ok (durations only)
	}{
		{"defaults", IssuerConfig{Holder: "n1"}, true,
			IssuerConfig{TTL: 10 * time.Second, RenewEvery: 2 * time.Second, ReserveAhead: 5 * time.Second,
				RetryEvery: 500 * time.Millisecond, StoreTimeout: 2 * time.Second}},
		{"scaled from TTL", IssuerConfig{Holder: "n1", TTL: time.Second}, true,
			IssuerConfig{TTL: time.Second, RenewEvery: 200 * time.Millisecond, ReserveAhead: 500 * time.Millisecond,
				RetryEvery: 50 * time.Millisecond, StoreTimeout: 200 * time.Millisecond}},
		{"no holder", IssuerConfig{}, false, IssuerConfig{}},
		{"reserve beyond TTL", IssuerConfig{Holder: "n1", ReserveAhead: 11 * time.Second}, false, IssuerConfig{}},
		{"reserve not above renew", IssuerConfig{Holder: "n1", RenewEvery: 5 * time.Second}, false, IssuerConfig{}},
		{"negative retry", IssuerConfig{Holder: "n1", RetryEvery: -1}, false, IssuerConfig{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := NewIssuer(newLeaseStore(), tc.cfg)
			if !tc.ok {
				if err == nil {
					t.Fatalf("NewIssuer(%+v) succeeded, want an error", tc.cfg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := l.Config()
			if got.TTL != tc.want.TTL || got.RenewEvery != tc.want.RenewEvery || got.ReserveAhead != tc.want.ReserveAhead ||
				got.RetryEvery != tc.want.RetryEvery || got.StoreTimeout != tc.want.StoreTimeout {
				t.Fatalf("config %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestLeaseNoLeaseNoIDs(t *testing.T) {
	store := newLeaseStore()
	l := newTestLease(t, store, "n1", clock.NewFake(t0), nil)
	wantLeaseLost(t, l)
	if _, held := l.WorkerID(); held {
		t.Fatal("WorkerID reports a lease before any acquire")
	}
	store.setDown(true)
	if err := l.RenewOnce(context.Background()); !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("RenewOnce with the store down: %v", err)
	}
	wantLeaseLost(t, l)
}

func TestLeaseAcquireReservesBeforeIssuing(t *testing.T) {
	store := newLeaseStore()
	clk := clock.NewFake(t0)
	m := metrics.New()
	l := newTestLease(t, store, "n1", clk, m)
	mustRenew(t, l)
	w, held := l.WorkerID()
	if !held || w != 0 || !l.CanIssue() {
		t.Fatalf("after acquire: worker %d held %v ready %v", w, held, l.CanIssue())
	}
	if g := gaugeValue(t, m.WorkerLease); g != 1 {
		t.Fatalf("worker lease gauge %v, want 1", g)
	}
	if got, want := store.Worker(0).LastMs, t0.Add(5*time.Second).UnixMilli(); got != want {
		t.Fatalf("store reservation %d, want now+ReserveAhead = %d", got, want)
	}
	var prev uint64
	for i := 0; i < 10; i++ {
		id := issueChecked(t, l, store)
		if id <= prev {
			t.Fatalf("id %d after %d", id, prev)
		}
		prev = id
		clk.Advance(300 * time.Millisecond)
	}
	// A regular renew moves the reservation with the clock.
	mustRenew(t, l)
	if got, want := store.Worker(0).LastMs, clk.Now().Add(5*time.Second).UnixMilli(); got != want {
		t.Fatalf("store reservation after renew %d, want %d", got, want)
	}
	if store.count("acquire") != 1 {
		t.Fatalf("%d acquires, want 1", store.count("acquire"))
	}
}

// TestLeaseLostAndRegained walks a lease through a store outage: ids keep
// flowing inside the reservation, stop at its end (retryably), stop with
// ErrWorkerLeaseLost once the lease expired by its own clock, and resume
// under a new lease (here a different worker id) with ids still increasing.
func TestLeaseLostAndRegained(t *testing.T) {
	store := newLeaseStore()
	clk := clock.NewFake(t0)
	m := metrics.New()
	l := newTestLease(t, store, "n1", clk, m)
	mustRenew(t, l) // worker 0, expires t0+10s, reserved through t0+5s
	last := issueChecked(t, l, store)

	store.setDown(true)
	clk.Advance(2 * time.Second)
	if err := l.RenewOnce(context.Background()); err == nil {
		t.Fatal("renew succeeded with the store down")
	}
	if _, held := l.WorkerID(); !held || !l.CanIssue() {
		t.Fatal("lease dropped although it has not expired and the reservation holds")
	}
	last = issueChecked(t, l, store) // still inside the reservation

	// Past the reservation: Next must renew first, and cannot.
	clk.Set(t0.Add(5*time.Second + time.Millisecond))
	renews := store.count("renew")
	id, err := l.Next()
	if err == nil || errors.Is(err, sequencer.ErrWorkerLeaseLost) || !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("Next past the reservation with the store down = %d, %v; want a store-unavailable error", id, err)
	}
	if sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
		t.Fatalf("code %s, want unavailable", sequencer.ErrorCode(err))
	}
	if store.count("renew") != renews+1 {
		t.Fatalf("Next made %d renew attempts, want 1", store.count("renew")-renews)
	}
	// A burst of Next calls does not hammer the failing store.
	for i := 0; i < 5; i++ {
		if _, err := l.Next(); err == nil {
			t.Fatal("Next succeeded past the reservation")
		}
	}
	if store.count("renew") != renews+1 {
		t.Fatalf("Next retried the store %d times within RetryEvery", store.count("renew")-renews)
	}
	if l.CanIssue() {
		t.Fatal("CanIssue() past the reservation")
	}

	// Past the lease end by our clock: a failed renew drops the lease.
	clk.Set(t0.Add(10 * time.Second))
	if err := l.RenewOnce(context.Background()); err == nil {
		t.Fatal("RenewOnce succeeded with the store down")
	}
	wantLeaseLost(t, l)
	if g := gaugeValue(t, m.WorkerLease); g != 0 {
		t.Fatalf("worker lease gauge %v after loss, want 0", g)
	}

	// The store is back. Worker 0 is still live in the store until its
	// expiry, so the re-acquire gets worker 1: the generator switches.
	store.setDown(false)
	mustRenew(t, l)
	w, held := l.WorkerID()
	if !held || w != 1 {
		t.Fatalf("after re-acquire: worker %d held %v, want 1 true", w, held)
	}
	for i := 0; i < 3; i++ {
		id := issueChecked(t, l, store)
		if _, w, _ := Decode(id); w != 1 || id <= last {
			t.Fatalf("id %d (worker %d) after %d", id, w, last)
		}
		last = id
	}
	if g := gaugeValue(t, m.WorkerLease); g != 1 {
		t.Fatalf("worker lease gauge %v after re-acquire, want 1", g)
	}
}

func TestLeaseTakenOverSwitchesWorker(t *testing.T) {
	store := newLeaseStore()
	clk := clock.NewFake(t0)
	l := newTestLease(t, store, "n1", clk, nil)
	mustRenew(t, l)
	before := issueChecked(t, l, store)
	// Someone else holds worker 0 now (e.g. our clock ran slow and the
	// store saw the lease expire). The next renew learns it at once, and
	// the same RenewOnce acquires another id.
	store.steal(0, clk.Now(), time.Minute)
	mustRenew(t, l)
	if w, held := l.WorkerID(); !held || w != 1 {
		t.Fatalf("worker %d held %v, want 1 true", w, held)
	}
	after := issueChecked(t, l, store)
	if after <= before {
		t.Fatalf("id %d after switching is not above %d", after, before)
	}
	if _, w, _ := Decode(after); w != 1 {
		t.Fatalf("id issued under worker %d, want 1", w)
	}

	// With every other id live, a lost lease cannot be replaced.
	store.onlyIDs(2)
	store.steal(1, clk.Now(), time.Minute)
	if err := l.RenewOnce(context.Background()); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("RenewOnce: %v", err)
	}
	wantLeaseLost(t, l)
}

func TestLeaseInheritedLastMs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ahead   time.Duration // previous holder's LastMs minus our clock
		wantErr bool
	}{
		{"behind the clock", -time.Minute, false},
		{"this very ms", 0, false},
		{"4ms ahead waits", 4 * time.Millisecond, false},
		{"10ms ahead refused", 10 * time.Millisecond, true},
		{"1min ahead refused", time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newLeaseStore()
			store.onlyIDs(1) // only the seeded id exists
			prevLast := t0.Add(tc.ahead).UnixMilli()
			store.seed(0, prevLast)
			clk := clock.NewFake(t0)
			m := metrics.New()
			l := newTestLease(t, store, "n1", clk, m)
			mustRenew(t, l)
			id, err := l.Next()
			if tc.wantErr {
				if !errors.Is(err, sequencer.ErrClockMovedBackwards) {
					t.Fatalf("Next = %d, %v; want ErrClockMovedBackwards", id, err)
				}
				if v := counterValue(t, m.ClockRollbacks.WithLabelValues("refused")); v != 1 {
					t.Fatalf("refused rollbacks %v, want 1", v)
				}
				// Once the clock passes the previous holder's LastMs
				// (and a renew extends the reservation), ids flow.
				clk.Set(time.UnixMilli(prevLast + 1))
				mustRenew(t, l)
				id = issueChecked(t, l, store)
			} else if err != nil {
				t.Fatal(err)
			}
			if ts, _, _ := Decode(id); ts.UnixMilli() <= prevLast {
				t.Fatalf("id for ms %d, at or below the previous holder's LastMs %d", ts.UnixMilli(), prevLast)
			}
		})
	}
}

func TestLeaseReservationForcesRenew(t *testing.T) {
	store := newLeaseStore()
	clk := clock.NewFake(t0)
	l := newTestLease(t, store, "n1", clk, nil)
	mustRenew(t, l)
	issueChecked(t, l, store)
	renews := store.count("renew")
	// No background renew ran; the clock reaches the end of the reservation.
	clk.Set(t0.Add(5*time.Second + 10*time.Millisecond))
	id := issueChecked(t, l, store) // renews first, then issues
	if store.count("renew") != renews+1 {
		t.Fatalf("%d renews, want 1", store.count("renew")-renews)
	}
	if ts, _, _ := Decode(id); ts.UnixMilli() != clk.Now().UnixMilli() {
		t.Fatalf("id for %s, clock at %s", ts, clk.Now())
	}
	// Within the new reservation no further store call is needed.
	clk.Advance(4 * time.Second)
	issueChecked(t, l, store)
	if store.count("renew") != renews+1 {
		t.Fatal("Next renewed inside a valid reservation")
	}
}

// A clock stepped back past the last issued id makes every Next fail until
// it catches up; CanIssue (/readyz) says so meanwhile, and a step within
// MaxClockRollback (waited out) does not count.
func TestCanIssueWhileTheClockIsBehindTheLastID(t *testing.T) {
	store := newLeaseStore()
	clk := clock.NewFake(t0)
	l := newTestLease(t, store, "n1", clk, nil)
	mustRenew(t, l)
	clk.Advance(2 * time.Second)
	issueChecked(t, l, store)
	clk.Advance(-MaxClockRollback)
	if !l.CanIssue() {
		t.Fatalf("CanIssue false with the clock %v behind the last id (waited out by Next)", MaxClockRollback)
	}
	clk.Advance(-time.Second)
	if _, err := l.Next(); !errors.Is(err, sequencer.ErrClockMovedBackwards) {
		t.Fatalf("Next 1s behind the last id: %v, want ErrClockMovedBackwards", err)
	}
	if l.CanIssue() {
		t.Fatal("CanIssue true while every Next fails: the clock is 1s behind the last issued id")
	}
	if err := l.Issuable(); !errors.Is(err, sequencer.ErrClockMovedBackwards) {
		t.Fatalf("Issuable with the clock 1s behind the last id: %v, want ErrClockMovedBackwards", err)
	}
	clk.Advance(time.Second + MaxClockRollback + time.Millisecond)
	if !l.CanIssue() {
		t.Fatal("CanIssue false once the clock is past the last id again")
	}
	issueChecked(t, l, store)
}

func TestLeaseTwoHoldersDifferentIDs(t *testing.T) {
	store := newLeaseStore()
	clk := clock.NewFake(t0)
	a := newTestLease(t, store, "a", clk, nil)
	b := newTestLease(t, store, "b", clk, nil)
	mustRenew(t, a)
	mustRenew(t, b)
	wa, _ := a.WorkerID()
	wb, _ := b.WorkerID()
	if wa == wb {
		t.Fatalf("both holders leased worker id %d", wa)
	}
	seen := map[uint64]string{}
	for i := 0; i < 5000; i++ { // crosses a millisecond for each
		for _, x := range []struct {
			name string
			l    *Issuer
		}{{"a", a}, {"b", b}} {
			id := issueChecked(t, x.l, store)
			if other, dup := seen[id]; dup {
				t.Fatalf("id %d issued by %s and %s", id, other, x.name)
			}
			seen[id] = x.name
		}
	}
}

func TestLeaseCloseReleasesLastIssued(t *testing.T) {
	store := newLeaseStore()
	store.onlyIDs(1) // a restart must get the same worker id back
	clk := clock.NewFake(t0)
	m := metrics.New()
	a := newTestLease(t, store, "a", clk, m)
	mustRenew(t, a)
	var lastA uint64
	for i := 0; i < 3; i++ {
		lastA = issueChecked(t, a, store)
		clk.Advance(100 * time.Millisecond)
	}
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantLeaseLost(t, a)
	if err := a.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := a.RenewOnce(context.Background()); !errors.Is(err, sequencer.ErrShuttingDown) {
		t.Fatalf("RenewOnce after Close: %v", err)
	}
	tsA, _, _ := Decode(lastA)
	if len(store.released) != 1 || store.released[0] != tsA.UnixMilli() {
		t.Fatalf("released with lastMs %v, want the last issued ms [%d]", store.released, tsA.UnixMilli())
	}
	if r := store.Worker(0); !r.Expires.IsZero() {
		t.Fatalf("worker 0 still leased until %s after Close", r.Expires)
	}
	if g := gaugeValue(t, m.WorkerLease); g != 0 {
		t.Fatalf("worker lease gauge %v after Close, want 0", g)
	}

	// A restart whose clock moved back by a minute gets worker 0 again and
	// refuses to issue: it would reuse a's ids.
	back := clock.NewFake(clk.Now().Add(-time.Minute))
	b := newTestLease(t, store, "b", back, nil)
	mustRenew(t, b)
	if id, err := b.Next(); !errors.Is(err, sequencer.ErrClockMovedBackwards) {
		t.Fatalf("restart with the clock a minute back: Next = %d, %v", id, err)
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A restart with a correct clock continues above a's ids at once: the
	// clean release gave a's unused reservation back (no false "clock moved
	// backwards" for up to ReserveAhead).
	c := newTestLease(t, store, "c", clk, nil)
	mustRenew(t, c)
	if c.inherited != tsA.UnixMilli() {
		t.Fatalf("successor inherited LastMs %d, want a's last issued ms %d (not its reservation)", c.inherited, tsA.UnixMilli())
	}
	if id := issueChecked(t, c, store); id <= lastA {
		t.Fatalf("restart issued %d, not above %d", id, lastA)
	}
}

// TestLeaseCrashBoundedByReservation: a holder that dies without Close
// leaves a reservation that bounds every id it issued; the successor that
// takes the id after expiry issues above all of them.
func TestLeaseCrashBoundedByReservation(t *testing.T) {
	store := newLeaseStore()
	store.onlyIDs(1) // one worker id: the successor must take over the same one
	clk := clock.NewFake(t0)
	a := newTestLease(t, store, "a", clk, nil)
	mustRenew(t, a)
	var maxA uint64
	for i := 0; i < 40; i++ {
		if i%10 == 9 {
			mustRenew(t, a)
		}
		maxA = max(maxA, issueChecked(t, a, store))
		clk.Advance(200 * time.Millisecond)
	}
	// a crashes here: no Close.
	b := newTestLease(t, store, "b", clk, nil)
	if err := b.RenewOnce(context.Background()); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("b acquired a live lease: %v", err)
	}
	held, _ := a.Held()
	clk.Set(held.Expires.Add(time.Millisecond))
	mustRenew(t, b)
	if r, _ := b.Held(); r.WorkerID != 0 {
		t.Fatalf("b got worker %d", r.WorkerID)
	}
	tsA, _, _ := Decode(maxA)
	if b.inherited < tsA.UnixMilli() {
		t.Fatalf("inherited LastMs %d below a's last id ms %d", b.inherited, tsA.UnixMilli())
	}
	if id := issueChecked(t, b, store); id <= maxA {
		t.Fatalf("b issued %d, not above a's %d", id, maxA)
	}
	// a wakes up (a zombie): its renew fails and it stops issuing.
	if err := a.RenewOnce(context.Background()); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("zombie renew: %v", err)
	}
	wantLeaseLost(t, a)
}

// TestLeaseConcurrentSwitches issues ids from several goroutines while the
// lease is renewed, lost and re-acquired under them. No id may repeat, and
// each goroutine's ids must increase.
func TestLeaseConcurrentSwitches(t *testing.T) {
	store := newLeaseStore()
	clk := clock.NewFake(t0)
	l := newTestLease(t, store, "n1", clk, nil)
	mustRenew(t, l)
	const goroutines = 3
	out := make([][]uint64, goroutines)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var issued atomic.Int64
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				id, err := l.Next()
				if err != nil {
					if !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
						t.Error(err)
						return
					}
					continue
				}
				out[g] = append(out[g], id)
				issued.Add(1)
			}
		}()
	}
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < 100; i++ {
		// Let the issuers make progress under the current view.
		for target := issued.Load() + 20; issued.Load() < target && time.Now().Before(deadline); {
			runtime.Gosched()
		}
		if i%10 == 5 {
			w, _ := l.WorkerID()
			store.steal(w, clk.Now(), time.Hour)
		}
		_ = l.RenewOnce(context.Background())
	}
	mustRenew(t, l)
	close(stop)
	wg.Wait()
	seen := map[uint64]bool{}
	workers := map[int]bool{}
	for g, ids := range out {
		for i, id := range ids {
			_, w, _ := Decode(id)
			workers[w] = true
			if seen[id] {
				t.Fatalf("id %d issued twice", id)
			}
			seen[id] = true
			if i > 0 && id <= ids[i-1] {
				t.Fatalf("goroutine %d: id %d after %d", g, id, ids[i-1])
			}
		}
	}
	t.Logf("%d ids under %d worker ids", len(seen), len(workers))
	if len(workers) < 2 {
		t.Fatalf("ids from %d worker ids: the lease never switched under load", len(workers))
	}
}

func TestLeaseStartClose(t *testing.T) {
	store := newLeaseStore()
	clk := clock.NewFake(t0)
	l := newTestLease(t, store, "n1", clk, nil)
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !l.CanIssue() {
		t.Fatal("not Ready after Start acquired a lease")
	}
	issueChecked(t, l, store)
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := store.Worker(0); !r.Expires.IsZero() {
		t.Fatal("Close did not release the lease")
	}
	wantLeaseLost(t, l)

	// Start with the store down still runs the loop (it retries) and
	// reports the first error.
	store.setDown(true)
	l2 := newTestLease(t, store, "n2", clk, nil)
	if err := l2.Start(context.Background()); !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("Start with the store down: %v", err)
	}
	if l2.CanIssue() {
		t.Fatal("Ready without a lease")
	}
	if err := l2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// startHangLease starts an issuer renewing every 100 ms (reserving 300 ms
// ahead, retrying every 50 ms) whose store calls time out after a minute.
func startHangLease(t *testing.T) (*leaseStore, *Issuer) {
	t.Helper()
	store := newLeaseStore()
	l, err := NewIssuer(store, IssuerConfig{Holder: "n1", TTL: 2 * time.Second, RenewEvery: 100 * time.Millisecond,
		ReserveAhead: 300 * time.Millisecond, RetryEvery: 50 * time.Millisecond, StoreTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.setHang(false); _ = l.Close(context.Background()) })
	return store, l
}

// TestKickGivesUpAHungRenewal: a renewal sent while the store's link
// dropped everything waits out its StoreTimeout (here a minute) even after
// the link is back. Kick (the cluster or the watch saw the store answer
// again) gives it up and renews at once; a renewal made for a Kick is not
// given up for a later Kick, so kicks cannot starve a slow store.
func TestKickGivesUpAHungRenewal(t *testing.T) {
	store, l := startHangLease(t)
	waitFor := func(what string, d time.Duration, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(d); !ok(); {
			if time.Now().After(end) {
				t.Fatalf("%s: not within %v", what, d)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	l.Kick() // ids can be issued: nothing to hurry
	if n := store.count("renew"); n > 3 {
		t.Fatalf("renewals after a Kick while issuable: %d", n)
	}

	store.setHang(true)
	waitFor("reservation used up", 10*time.Second, func() bool { return l.Issuable() != nil })
	waitFor("a renewal in flight for RetryEvery", 10*time.Second, func() bool {
		l.callMu.Lock()
		defer l.callMu.Unlock()
		return l.call != nil && time.Since(l.call.started) > 60*time.Millisecond
	})
	// Still hung: a Kick gives the call up and makes a kicked one, which
	// hangs too; a second Kick leaves that one alone.
	before := store.count("renew") + store.count("acquire")
	l.Kick()
	waitFor("the kicked call", 10*time.Second, func() bool {
		l.callMu.Lock()
		defer l.callMu.Unlock()
		return l.call != nil && l.call.kicked
	})
	if n := store.count("renew") + store.count("acquire"); n != before+1 {
		t.Fatalf("store calls after one Kick: %d, want %d", n, before+1)
	}
	time.Sleep(100 * time.Millisecond)
	l.Kick()
	time.Sleep(100 * time.Millisecond)
	if n := store.count("renew") + store.count("acquire"); n != before+1 {
		t.Fatalf("a second Kick gave up the kicked call: %d store calls, want %d", n, before+1)
	}
	l.callMu.Lock()
	c := l.call
	l.callMu.Unlock()
	if c == nil || !c.kicked {
		t.Fatal("the kicked call is no longer in flight")
	}

	// The link is back. The kicked call waits for its minute; give it up
	// as the minute would (cancel), and the next Kick renews at once.
	store.setHang(false)
	c.cancel()
	waitFor("no call in flight", 10*time.Second, func() bool {
		l.callMu.Lock()
		defer l.callMu.Unlock()
		return l.call == nil || !l.call.kicked
	})
	l.Kick()
	waitFor("issuable after the Kick", 10*time.Second, func() bool { return l.Issuable() == nil })
}

// TestKickAfterTheLinkHealed: the plain case. The renewal in flight when
// the link comes back would wait out its minute; one Kick and ids can be
// issued again.
func TestKickAfterTheLinkHealed(t *testing.T) {
	store, l := startHangLease(t)
	store.setHang(true)
	for end := time.Now().Add(10 * time.Second); l.Issuable() == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the reservation was never used up")
		}
	}
	time.Sleep(100 * time.Millisecond) // the call in flight is older than RetryEvery
	store.setHang(false)
	time.Sleep(200 * time.Millisecond)
	if l.Issuable() == nil {
		t.Fatal("issuable again without a Kick: the hung call did not hang")
	}
	l.Kick()
	for end := time.Now().Add(20 * time.Second); l.Issuable() != nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("not issuable 20 s after the Kick (the hung call's timeout is a minute): %v", l.Issuable())
		}
	}
}
