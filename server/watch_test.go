package server

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A 17 s store outage that also costs the worker-id lease, probed once per
// second: one WARN for the store, one ERROR for the lease (the repeats fall
// within the rate limit), and INFO lines when each comes back, with how long
// it lasted.
func TestWatchLogsAnOutageAFewTimes(t *testing.T) {
	var out syncBuf
	storeUp, leaseHeld := true, true
	w := newWatch(
		func(context.Context) error {
			if storeUp {
				return nil
			}
			return errors.New("dial tcp 127.0.0.1:5432: connection refused")
		},
		func() bool { return leaseHeld },
		func() bool { return false },
		time.Second, slog.New(slog.NewTextHandler(&out, nil)))
	t0 := time.Unix(1_000_000, 0)
	ctx := context.Background()
	w.probeAt(ctx, t0)
	storeUp = false
	for i := 1; i <= 17; i++ {
		if i == 11 {
			leaseHeld = false // the lease ran out 10 s into the outage
		}
		w.probeAt(ctx, t0.Add(time.Duration(i)*time.Second))
	}
	storeUp = true
	w.probeAt(ctx, t0.Add(18*time.Second))
	leaseHeld = true
	w.probeAt(ctx, t0.Add(19*time.Second))

	log := out.String()
	if n := strings.Count(log, "level=WARN"); n != 1 || !strings.Contains(log, "store unreachable") {
		t.Errorf("%d WARN lines, want 1 about the store:\n%s", n, log)
	}
	if n := strings.Count(log, "level=ERROR"); n != 1 || !strings.Contains(log, "worker-id lease not held") {
		t.Errorf("%d ERROR lines, want 1 about the lease:\n%s", n, log)
	}
	if !strings.Contains(log, "store reachable again") || !strings.Contains(log, "was_down_for=17s") {
		t.Errorf("the store's return is not logged with the outage's length:\n%s", log)
	}
	if !strings.Contains(log, "worker-id lease held again") || !strings.Contains(log, "was_lost_for=8s") {
		t.Errorf("the lease's return is not logged:\n%s", log)
	}
}
