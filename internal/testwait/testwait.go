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
