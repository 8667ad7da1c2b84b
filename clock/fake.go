package clock

import (
	"sync"
	"time"
)

// Fake is a Clock that moves only when told to (Advance, Set, Sleep), and
// fires its timers as it passes their deadlines: in deadline order (ties in
// the order they were armed), with Now reading each deadline as it fires.
// A NewTimer or NewTicker channel receives the deadline; an AfterFunc call
// starts in its own goroutine, as with time.AfterFunc. Sleep advances the
// clock by d at once (and records the sleep), so code that waits out a short
// clock rollback runs without real time passing. Safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	slept  time.Duration
	armed  uint64                      // timers armed so far: orders equal deadlines
	timers []*fakeTimer                // pending timers and tickers
	OnNow  func(t time.Time) time.Time // optional: rewrite each reading (e.g. jumps)
}

// NewFake returns a fake clock at t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.OnNow != nil {
		f.now = f.OnNow(f.now)
	}
	return f.now
}

func (f *Fake) Since(t time.Time) time.Duration { return f.Now().Sub(t) }

func (f *Fake) Sleep(d time.Duration) {
	f.mu.Lock()
	if d > 0 {
		f.slept += d
	}
	f.moveLocked(f.now.Add(max(d, 0)))
}

// Advance moves the clock by d (negative d moves it back) and fires the
// timers it passes.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.moveLocked(f.now.Add(d))
}

// Set puts the clock at t and fires the timers due by then.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	f.moveLocked(t)
}

// Slept returns the total duration passed to Sleep.
func (f *Fake) Slept() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slept
}

// Pending returns how many timers and tickers are armed.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

func (f *Fake) NewTimer(d time.Duration) (Timer, <-chan time.Time) {
	t := &fakeTimer{f: f, ch: make(chan time.Time, 1)}
	f.arm(t, d)
	return t, t.ch
}

func (f *Fake) NewTicker(d time.Duration) (Ticker, <-chan time.Time) {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	t := &fakeTimer{f: f, ch: make(chan time.Time, 1), period: d}
	f.arm(t, d)
	return fakeTicker{t}, t.ch
}

func (f *Fake) AfterFunc(d time.Duration, call func()) Timer {
	t := &fakeTimer{f: f, call: call}
	f.arm(t, d)
	return t
}

// arm schedules t d from now and fires what is due (d <= 0: at once).
func (f *Fake) arm(t *fakeTimer, d time.Duration) {
	f.mu.Lock()
	f.scheduleLocked(t, f.now.Add(d))
	f.moveLocked(f.now)
}

func (f *Fake) scheduleLocked(t *fakeTimer, at time.Time) {
	f.armed++
	t.at, t.order = at, f.armed
	f.timers = append(f.timers, t)
}

// removeLocked unschedules t; it reports whether t was pending.
func (f *Fake) removeLocked(t *fakeTimer) bool {
	for i, p := range f.timers {
		if p == t {
			f.timers = append(f.timers[:i], f.timers[i+1:]...)
			return true
		}
	}
	return false
}

// nextLocked returns the pending timer due first, by to at the latest.
func (f *Fake) nextLocked(to time.Time) (int, *fakeTimer) {
	best := -1
	for i, t := range f.timers {
		if t.at.After(to) {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		if b := f.timers[best]; t.at.Before(b.at) || (t.at.Equal(b.at) && t.order < b.order) {
			best = i
		}
	}
	if best < 0 {
		return -1, nil
	}
	return best, f.timers[best]
}

// moveLocked moves the clock to `to`, firing the timers due on the way in
// deadline order, and unlocks f.mu. A clock moved back fires nothing.
func (f *Fake) moveLocked(to time.Time) {
	var calls []func()
	for {
		i, t := f.nextLocked(to)
		if t == nil {
			break
		}
		if t.at.After(f.now) {
			f.now = t.at
		}
		f.timers = append(f.timers[:i], f.timers[i+1:]...)
		switch {
		case t.call != nil:
			calls = append(calls, t.call)
		case t.period > 0:
			t.send(t.at)
			// Ticks the reader is not ready for are dropped: skip to the
			// last tick due by `to` while the channel is full.
			next := t.at.Add(t.period)
			if len(t.ch) == cap(t.ch) && !next.After(to) {
				next = next.Add(to.Sub(next) / t.period * t.period)
			}
			f.scheduleLocked(t, next)
		default:
			t.send(t.at)
		}
	}
	f.now = to
	f.mu.Unlock()
	for _, c := range calls {
		go c()
	}
}

// fakeTimer is a timer (call or channel) or, with a period, a ticker.
type fakeTimer struct {
	f      *Fake
	at     time.Time
	order  uint64
	ch     chan time.Time // buffered 1; nil for AfterFunc
	call   func()
	period time.Duration
}

// send delivers a tick unless one is still unread (f.mu held).
func (t *fakeTimer) send(at time.Time) {
	select {
	case t.ch <- at:
	default:
	}
}

// drain drops an unread time, so that none is stale after Stop or Reset.
func (t *fakeTimer) drain() {
	if t.ch == nil {
		return
	}
	select {
	case <-t.ch:
	default:
	}
}

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.drain()
	return t.f.removeLocked(t)
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	f := t.f
	f.mu.Lock()
	was := f.removeLocked(t)
	t.drain()
	if t.period > 0 {
		if d <= 0 {
			f.mu.Unlock()
			panic("clock: non-positive interval for Ticker.Reset")
		}
		t.period = d
	}
	f.scheduleLocked(t, f.now.Add(d))
	f.moveLocked(f.now)
	return was
}

// fakeTicker is a ticker's view of its fakeTimer.
type fakeTicker struct{ t *fakeTimer }

func (k fakeTicker) Stop()                 { k.t.Stop() }
func (k fakeTicker) Reset(d time.Duration) { k.t.Reset(d) }
