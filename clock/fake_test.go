package clock

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// recv returns what ch holds now (the fake sends before Advance returns).
func recv(t *testing.T, ch <-chan time.Time) (time.Time, bool) {
	t.Helper()
	select {
	case v := <-ch:
		return v, true
	default:
		return time.Time{}, false
	}
}

func wantTick(t *testing.T, ch <-chan time.Time, want time.Time, what string) {
	t.Helper()
	got, ok := recv(t, ch)
	if !ok {
		t.Fatalf("%s: nothing received, want %v", what, want.Sub(t0))
	}
	if !got.Equal(want) {
		t.Fatalf("%s: received %v, want %v", what, got.Sub(t0), want.Sub(t0))
	}
}

func wantNone(t *testing.T, ch <-chan time.Time, what string) {
	t.Helper()
	if got, ok := recv(t, ch); ok {
		t.Fatalf("%s: received %v, want nothing", what, got.Sub(t0))
	}
}

// One Advance past several deadlines fires them in deadline order, ties in
// the order they were armed, each channel receiving its own deadline (not
// the end of the Advance); an AfterFunc call among them runs too.
func TestFakeFiresInDeadlineOrder(t *testing.T) {
	f := NewFake(t0)
	fired := make(chan string, 1)
	_, c3 := f.NewTimer(3 * time.Second)
	_, c1 := f.NewTimer(time.Second)
	_, c2a := f.NewTimer(2 * time.Second)
	_, c2b := f.NewTimer(2 * time.Second)
	f.AfterFunc(2*time.Second, func() { fired <- "func@2s" })
	f.Advance(5 * time.Second)
	wantTick(t, c1, t0.Add(time.Second), "1s timer")
	wantTick(t, c2a, t0.Add(2*time.Second), "first 2s timer")
	wantTick(t, c2b, t0.Add(2*time.Second), "second 2s timer")
	wantTick(t, c3, t0.Add(3*time.Second), "3s timer")
	if s := <-fired; s != "func@2s" {
		t.Fatalf("fired %q", s)
	}
	if !f.Now().Equal(t0.Add(5 * time.Second)) {
		t.Fatalf("after Advance(5s) now is %v", f.Now().Sub(t0))
	}
}

func TestFakeTimerStopAndReset(t *testing.T) {
	f := NewFake(t0)
	tm, c := f.NewTimer(time.Second)
	f.Advance(999 * time.Millisecond)
	wantNone(t, c, "before the deadline")
	if !tm.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	if tm.Stop() {
		t.Fatal("second Stop reported true")
	}
	f.Advance(time.Hour)
	wantNone(t, c, "stopped timer")

	// Reset of a stopped timer re-arms it from now and reports false.
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a stopped timer reported true")
	}
	now := f.Now()
	f.Advance(time.Second)
	wantTick(t, c, now.Add(time.Second), "reset timer")
	if tm.Stop() {
		t.Fatal("Stop of a fired timer reported true")
	}

	// Reset of a pending timer moves its deadline and reports true.
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a fired timer reported true")
	}
	if !tm.Reset(3 * time.Second) {
		t.Fatal("Reset of a pending timer reported false")
	}
	now = f.Now()
	f.Advance(2 * time.Second)
	wantNone(t, c, "pending timer reset further out")
	f.Advance(time.Second)
	wantTick(t, c, now.Add(3*time.Second), "timer reset to 3s")

	// After Stop or Reset, no stale time is left in the channel.
	tm.Reset(time.Second)
	f.Advance(time.Second)
	if tm.Stop() {
		t.Fatal("Stop after the fire reported true")
	}
	wantNone(t, c, "unread fire after Stop")
	tm.Reset(time.Second)
	f.Advance(time.Second)
	tm.Reset(time.Second)
	wantNone(t, c, "unread fire after Reset")

	// A timer of zero (or negative) duration fires at once.
	_, c0 := f.NewTimer(0)
	wantTick(t, c0, f.Now(), "zero timer")
	if f.Pending() != 1 {
		t.Fatalf("%d timers pending, want the one reset", f.Pending())
	}
}

func TestFakeAfterFuncStopAndReset(t *testing.T) {
	f := NewFake(t0)
	fired := make(chan string, 4)
	tm := f.AfterFunc(time.Second, func() { fired <- "a" })
	if !tm.Reset(2 * time.Second) {
		t.Fatal("Reset of a pending call reported false")
	}
	f.Advance(time.Second)
	select {
	case s := <-fired:
		t.Fatalf("%q fired at its old deadline", s)
	default:
	}
	f.Advance(time.Second)
	if s := <-fired; s != "a" {
		t.Fatalf("fired %q, want a", s)
	}
	// Reset after the call ran arms it again.
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a fired call reported true")
	}
	f.Advance(time.Second)
	if s := <-fired; s != "a" {
		t.Fatalf("fired %q, want a again", s)
	}
	if f.Pending() != 0 {
		t.Fatalf("%d timers pending after the fires", f.Pending())
	}
}

func TestFakeTicker(t *testing.T) {
	f := NewFake(t0)
	tk, c := f.NewTicker(time.Second)
	f.Advance(999 * time.Millisecond)
	wantNone(t, c, "before the first tick")
	f.Advance(time.Millisecond)
	wantTick(t, c, t0.Add(time.Second), "first tick")
	f.Advance(time.Second)
	wantTick(t, c, t0.Add(2*time.Second), "second tick")

	// A reader that is not ready gets the first tick it missed; the rest
	// are dropped, and the ticker keeps its phase.
	f.Advance(3500 * time.Millisecond)
	wantTick(t, c, t0.Add(3*time.Second), "first missed tick")
	wantNone(t, c, "dropped ticks")
	f.Advance(500 * time.Millisecond)
	wantTick(t, c, t0.Add(6*time.Second), "tick after the drops")

	// Reset: the next tick d from now, then every d.
	f.Advance(250 * time.Millisecond)
	tk.Reset(2 * time.Second)
	f.Advance(time.Second)
	wantNone(t, c, "old period after Reset")
	f.Advance(time.Second)
	wantTick(t, c, t0.Add(8250*time.Millisecond), "first tick after Reset")
	f.Advance(2 * time.Second)
	wantTick(t, c, t0.Add(10250*time.Millisecond), "second tick after Reset")

	// Stop: no more ticks, and none left unread.
	f.Advance(2 * time.Second)
	tk.Stop()
	wantNone(t, c, "unread tick after Stop")
	f.Advance(time.Minute)
	wantNone(t, c, "tick after Stop")
	if f.Pending() != 0 {
		t.Fatalf("%d timers pending after Stop", f.Pending())
	}
}

// Sleep moves the fake clock (recording the sleep) and fires what it passes.
func TestFakeSleepFiresTimers(t *testing.T) {
	f := NewFake(t0)
	_, c := f.NewTimer(time.Second)
	f.Sleep(2 * time.Second)
	wantTick(t, c, t0.Add(time.Second), "timer passed by Sleep")
	if f.Slept() != 2*time.Second || f.Since(t0) != 2*time.Second {
		t.Fatalf("slept %v, since %v", f.Slept(), f.Since(t0))
	}
	// Moving back fires nothing and leaves deadlines where they were.
	_, c = f.NewTimer(time.Second)
	f.Advance(-time.Minute)
	wantNone(t, c, "clock moved back")
	f.Set(t0.Add(3 * time.Second))
	wantTick(t, c, t0.Add(3*time.Second), "timer after Set")
}

// The real clock's timers are time's (one short check each: they fire).
func TestRealTimers(t *testing.T) {
	var c Clock = Real{}
	_, tc := c.NewTimer(time.Millisecond)
	<-tc
	tk, kc := c.NewTicker(time.Millisecond)
	<-kc
	tk.Stop()
	done := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(done) })
	<-done
	if c.Since(c.Now()) > time.Hour {
		t.Fatal("Since of Now is an hour")
	}
}
