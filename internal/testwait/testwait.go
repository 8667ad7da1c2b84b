// Package testwait is the one way the tests wait: for a condition, with a
// deadline, polling. No test sleeps to let things settle.
package testwait

import (
	"errors"
	"testing"
	"time"
)

// For polls cond every poll until it holds, or fails the test after d
// naming what it waited for.
func For(t testing.TB, d, poll time.Duration, what string, cond func() bool) {
	t.Helper()
	err := wait(d, poll, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
	if err != nil {
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// Until polls cond every poll until it returns nil, or fails the test after
// d naming what it waited for and the last reason cond gave, so that a
// failure says what was still wrong, not only that time ran out.
func Until(t testing.TB, d, poll time.Duration, what string, cond func() error) {
	t.Helper()
	if err := wait(d, poll, cond); err != nil {
		t.Fatalf("timed out after %v waiting for %s; still: %v", d, what, err)
	}
}

var errNotYet = errors.New("not yet")

// wait calls cond every poll until it returns nil, or until d has passed:
// then it returns cond's last error.
func wait(d, poll time.Duration, cond func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(poll)
	}
}
