package clock

import (
	"testing"
	"time"
)

func TestFakeAfterFunc(t *testing.T) {
	f := NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	fired := make(chan string, 4)
	AfterFunc(f, 20*time.Millisecond, func() { fired <- "a" })
	stopped := AfterFunc(f, 20*time.Millisecond, func() { fired <- "stopped" })
	AfterFunc(f, time.Second, func() { fired <- "late" })
	if !stopped.Stop() {
		t.Fatal("Stop of a pending call reported false")
	}
	f.Advance(19 * time.Millisecond)
	select {
	case s := <-fired:
		t.Fatalf("%q fired before its time", s)
	default:
	}
	f.Advance(time.Millisecond)
	if s := <-fired; s != "a" {
		t.Fatalf("fired %q, want a", s)
	}
	f.Sleep(time.Second)
	if s := <-fired; s != "late" {
		t.Fatalf("fired %q, want late", s)
	}
	if stopped.Stop() {
		t.Fatal("Stop of a stopped call reported true")
	}
	AfterFunc(f, 0, func() { fired <- "now" })
	if s := <-fired; s != "now" {
		t.Fatalf("fired %q, want now", s)
	}
}

// After's channel closes when the fake clock reaches its time; a stopped
// one is no longer pending, so nothing can fire it. (No real time is waited
// to see that nothing fires: the fake fires only pending timers.)
func TestFakeAfter(t *testing.T) {
	f := NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	_, fired := After(f, time.Second)
	stop, stopped := After(f, time.Second)
	if !stop.Stop() || f.Pending() != 1 {
		t.Fatalf("after one Stop: %d pending, want 1", f.Pending())
	}
	f.Advance(999 * time.Millisecond)
	if f.Pending() != 1 {
		t.Fatal("After fired before its time on the fake clock")
	}
	f.Advance(time.Millisecond)
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("After did not fire once the fake clock reached its time")
	}
	if f.Pending() != 0 {
		t.Fatalf("%d timers pending after the fire", f.Pending())
	}
	select {
	case <-stopped:
		t.Fatal("a stopped After fired")
	default:
	}
}

// A step moves what a reading says (wall) but not the time between two
// readings (monotonic), as on a host whose clock NTP stepped.
func TestSteppedKeepsMonotonic(t *testing.T) {
	if !layoutKnown {
		t.Fatal("time.Time's layout is not the one shiftWall knows: a step would move the monotonic reading too")
	}
	s := &Stepped{}
	a := s.Now()
	if from := s.Step(-30 * time.Second); from != 0 {
		t.Fatalf("first Step returned %v, want 0", from)
	}
	b := s.Now()
	if d := b.Sub(a); d < 0 || d > 5*time.Second {
		t.Fatalf("Sub across a -30s step = %v, want the real time between the readings", d)
	}
	if b.Before(a) {
		t.Fatal("a reading after a -30s step is Before the one taken earlier")
	}
	if d := time.Duration(b.UnixNano() - a.UnixNano()); d > -25*time.Second || d < -30*time.Second {
		t.Fatalf("wall readings moved by %v, want about -30s", d)
	}
	if !b.Round(0).Before(a.Round(0)) {
		t.Fatal("without the monotonic reading (as sent to a database) the later reading is not 30s earlier")
	}
	if since := time.Since(b); since < 0 || since > 5*time.Second {
		t.Fatalf("time.Since(a stepped reading) = %v", since)
	}
	s.Step(5 * time.Second)
	if d := time.Duration(s.Now().UnixNano() - time.Now().UnixNano()); d < 4*time.Second || d > 6*time.Second {
		t.Fatalf("offset +5s reads %v ahead of time.Now", d)
	}
}

func TestSteppedFollowsFile(t *testing.T) {
	path := t.TempDir() + "/offset"
	s := &Stepped{}
	type step struct {
		from, to time.Duration
		err      bool
	}
	steps := make(chan step, 16)
	stop := s.Follow(path, time.Millisecond, func(from, to time.Duration, err error) { steps <- step{from, to, err != nil} })
	defer stop()
	if s.Offset() != 0 {
		t.Fatalf("missing file: offset %v, want 0", s.Offset())
	}
	next := func() step {
		t.Helper()
		select {
		case st := <-steps:
			return st
		case <-time.After(10 * time.Second):
			t.Fatal("no step reported within 10s")
			return step{}
		}
	}
	for _, c := range []struct {
		content string
		want    step
	}{
		{"5s\n", step{0, 5 * time.Second, false}},
		{"-30s", step{5 * time.Second, -30 * time.Second, false}},
		{"soon", step{-30 * time.Second, -30 * time.Second, true}},
		{"", step{-30 * time.Second, 0, false}},
	} {
		if err := WriteOffset(path, c.content); err != nil {
			t.Fatal(err)
		}
		if got := next(); got != c.want {
			t.Fatalf("after writing %q: step %+v, want %+v", c.content, got, c.want)
		}
		if s.Offset() != c.want.to {
			t.Fatalf("after writing %q: offset %v, want %v", c.content, s.Offset(), c.want.to)
		}
	}
}
