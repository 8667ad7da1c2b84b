// Package clock is the time source of the sequencer. Code that reads time takes
// a Clock so tests can move it by hand (Fake) instead of sleeping.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time and sleeps.
type Clock interface {
	Now() time.Time
	Sleep(d time.Duration)
}

// Real is the wall clock.
type Real struct{}

func (Real) Now() time.Time        { return time.Now() }
func (Real) Sleep(d time.Duration) { time.Sleep(d) }

// Timer is a pending call of AfterFunc.
type Timer interface {
	// Stop prevents the call if it has not run yet; it reports whether it
	// did.
	Stop() bool
}

// AfterFunc calls f in its own goroutine once d has passed on c: the fake
// time for a Fake (fired by Advance, Set and Sleep), real time for every
// other clock.
func AfterFunc(c Clock, d time.Duration, f func()) Timer {
	if fk, ok := c.(*Fake); ok {
		return fk.afterFunc(d, f)
	}
	return time.AfterFunc(d, f)
}

// After returns a Timer on c and a channel closed when it fires: the
// channel form of AfterFunc, for a select.
func After(c Clock, d time.Duration) (Timer, <-chan struct{}) {
	fired := make(chan struct{})
	return AfterFunc(c, d, func() { close(fired) }), fired
}

// Or returns c, or the real clock when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// Fake is a Clock that moves only when told to. Sleep advances it by d at
// once (and records the sleep), so code that waits out a short clock
// rollback runs without real time passing. Safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	slept  time.Duration
	timers []*fakeTimer                // pending AfterFunc calls
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

func (f *Fake) Sleep(d time.Duration) {
	f.mu.Lock()
	if d > 0 {
		f.now = f.now.Add(d)
		f.slept += d
	}
	f.fireLocked()
}

// Advance moves the clock by d (negative d moves it back) and runs the
// AfterFunc calls that are due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.fireLocked()
}

// Set puts the clock at t and runs the AfterFunc calls that are due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	f.now = t
	f.fireLocked()
}

type fakeTimer struct {
	f    *Fake
	at   time.Time
	call func()
}

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	for i, p := range t.f.timers {
		if p == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			return true
		}
	}
	return false
}

func (f *Fake) afterFunc(d time.Duration, call func()) Timer {
	f.mu.Lock()
	t := &fakeTimer{f: f, at: f.now.Add(d), call: call}
	f.timers = append(f.timers, t)
	f.fireLocked()
	return t
}

// fireLocked starts the due calls and unlocks f.mu.
func (f *Fake) fireLocked() {
	var due []*fakeTimer
	kept := f.timers[:0]
	for _, t := range f.timers {
		if t.at.After(f.now) {
			kept = append(kept, t)
		} else {
			due = append(due, t)
		}
	}
	f.timers = kept
	f.mu.Unlock()
	for _, t := range due {
		go t.call()
	}
}

// Slept returns the total duration passed to Sleep.
func (f *Fake) Slept() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slept
}
