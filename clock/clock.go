// Package clock is the time source of the sequencer: the time, sleeps and
// timers. Code that waits or reads time takes a Clock, so tests move it by
// hand (Fake) instead of sleeping. The model is tailscale's tstime: the
// timers are on the interface, so no caller asks which clock it has.
//
// It must never be bypassed: actor, commit, conv, ownership, idgen and
// membership call no time.Now, Since, Sleep, NewTimer, After, AfterFunc or
// NewTicker of their own (docs/ARCHITECTURE.md has the grep).
package clock

import (
	"sync"
	"time"
)

// Clock tells the time, sleeps and makes timers.
type Clock interface {
	Now() time.Time
	// Since is Now().Sub(t).
	Since(t time.Time) time.Duration
	Sleep(d time.Duration)
	// NewTimer is time.NewTimer: the channel receives the time once d has
	// passed on the clock.
	NewTimer(d time.Duration) (Timer, <-chan time.Time)
	// NewTicker is time.NewTicker: the channel receives the time every d
	// (a tick the reader is not ready for is dropped). d must be > 0.
	NewTicker(d time.Duration) (Ticker, <-chan time.Time)
	// AfterFunc is time.AfterFunc: f runs in its own goroutine once d has
	// passed on the clock.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending timer of NewTimer or AfterFunc (*time.Timer is one).
type Timer interface {
	// Stop prevents the timer from firing; it reports whether it stopped
	// it (false: it already fired or was stopped).
	Stop() bool
	// Reset makes the timer fire d from now (again, if it fired or was
	// stopped); it reports whether it was pending. After Stop or Reset
	// the channel of a NewTimer holds no stale time.
	Reset(d time.Duration) bool
}

// Ticker is a ticker of NewTicker (*time.Ticker is one).
type Ticker interface {
	Stop()
	// Reset makes the next tick d from now, and every d after it.
	Reset(d time.Duration)
}

// Real is the wall clock (time's functions).
type Real struct{}

func (Real) Now() time.Time                  { return time.Now() }
func (Real) Since(t time.Time) time.Duration { return time.Since(t) }
func (Real) Sleep(d time.Duration)           { time.Sleep(d) }

func (Real) NewTimer(d time.Duration) (Timer, <-chan time.Time) {
	t := time.NewTimer(d)
	return t, t.C
}

func (Real) NewTicker(d time.Duration) (Ticker, <-chan time.Time) {
	t := time.NewTicker(d)
	return t, t.C
}

func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// AfterFunc is c.AfterFunc(d, f).
func AfterFunc(c Clock, d time.Duration, f func()) Timer { return c.AfterFunc(d, f) }

// After returns a Timer on c and a channel closed when it first fires: the
// closing form of AfterFunc, for a select.
func After(c Clock, d time.Duration) (Timer, <-chan struct{}) {
	fired := make(chan struct{})
	var once sync.Once
	return c.AfterFunc(d, func() { once.Do(func() { close(fired) }) }), fired
}

// Or returns c, or the real clock when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

var (
	_ Clock = Real{}
	_ Clock = (*Fake)(nil)
	_ Clock = (*Stepped)(nil)
)
