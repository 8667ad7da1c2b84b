package testwait

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fatalTB records Fatalf and stops the goroutine as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	Until(t, time.Minute, time.Millisecond, "three calls", func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3", calls)
	}
}

func TestUntilFailsWithTheLastReason(t *testing.T) {
	f := &fatalTB{}
	done := make(chan struct{})
	calls := 0
	go func() {
		defer close(done)
		Until(f, 20*time.Millisecond, time.Millisecond, "the impossible", func() error {
			calls++
			return fmt.Errorf("reason %d", calls)
		})
	}()
	<-done
	want := fmt.Sprintf("waiting for the impossible; still: reason %d", calls)
	if !strings.Contains(f.msg, want) {
		t.Fatalf("Fatalf said %q, want it to contain %q", f.msg, want)
	}
}

func TestForFailsNamingWhatItWaitedFor(t *testing.T) {
	f := &fatalTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		For(f, 20*time.Millisecond, time.Millisecond, "the impossible", func() bool { return false })
	}()
	<-done
	if want := "timed out after 20ms waiting for the impossible"; f.msg != want {
		t.Fatalf("Fatalf said %q, want %q", f.msg, want)
	}
}
