// Package testwait is the one way the tests wait: for a condition, with a
// deadline, polling. No test sleeps to let things settle.
package testwait

import (
	"testing"
	"time"
)

// For polls cond every poll until it holds, or fails the test after d
// naming what it waited for.
func For(t testing.TB, d, poll time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(poll)
	}
}

// Until polls cond every poll until it returns nil, or fails the test after
// d naming what it waited for and the last reason cond gave, so that a
// failure says what was still wrong, not only that time ran out.
func Until(t testing.TB, d, poll time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; still: %v", d, what, err)
		}
		time.Sleep(poll)
	}
}
