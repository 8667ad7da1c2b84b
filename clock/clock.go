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
	mu    sync.Mutex
	now   time.Time
	slept time.Duration
	OnNow func(t time.Time) time.Time // optional: rewrite each reading (e.g. jumps)
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
	defer f.mu.Unlock()
	if d > 0 {
		f.now = f.now.Add(d)
		f.slept += d
	}
}

// Advance moves the clock by d (negative d moves it back).
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

// Set puts the clock at t.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
}

// Slept returns the total duration passed to Sleep.
func (f *Fake) Slept() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slept
}
