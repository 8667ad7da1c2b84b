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
