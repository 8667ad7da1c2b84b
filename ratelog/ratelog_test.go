package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestOncePerCausePerInterval(t *testing.T) {
	var buf bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), 10*time.Second)
	now := time.Unix(1000, 0)
	l.SetClock(func() time.Time { return now })

	// A 17 s outage failing 1000 sends per second, cause "store": one line
	// at t=0, one at t=10s carrying the suppressed count.
	logged := 0
	for ms := 0; ms < 17000; ms++ {
		now = time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond)
		if l.Warn("store", "store unavailable", "err", "connection refused") {
			logged++
		}
	}
	if logged != 2 {
		t.Fatalf("logged %d lines, want 2:\n%s", logged, buf.String())
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if !strings.Contains(lines[0], "level=WARN") || strings.Contains(lines[0], "suppressed") {
		t.Fatalf("first line %q", lines[0])
	}
	if !strings.Contains(lines[1], "suppressed=9999") {
		t.Fatalf("second line %q lacks suppressed=9999", lines[1])
	}

	// Another cause is not held back by the first.
	if !l.Error("lease", "worker-id lease lost") {
		t.Fatal("a new cause was suppressed")
	}
	if !strings.Contains(buf.String(), "level=ERROR") {
		t.Fatal("Error did not log at ERROR")
	}
	var nilLogger *Logger
	if nilLogger.Warn("x", "y") {
		t.Fatal("a nil Logger logged")
	}
}

func TestSharedTableAcrossLoggers(t *testing.T) {
	var a, b bytes.Buffer
	la := slog.New(slog.NewTextHandler(&a, nil))
	lb := slog.New(slog.NewTextHandler(&b, nil))
	if !Warn(la, "test: shared cause", "first") {
		t.Fatal("first line suppressed")
	}
	if Warn(lb, "test: shared cause", "second") || Error(la, "test: shared cause", "third") {
		t.Fatal("the same cause logged twice within the interval")
	}
	if b.Len() != 0 {
		t.Fatalf("suppressed line written: %q", b.String())
	}
	// A level the handler drops does not use up the cause.
	quiet := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelError}))
	if Warn(quiet, "test: other cause", "dropped") || !Warn(la, "test: other cause", "kept") {
		t.Fatal("a disabled level consumed the cause")
	}
}
