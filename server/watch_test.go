package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/testwait"
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
		func() error {
			if leaseHeld {
				return nil
			}
			return fmt.Errorf("idgen: no worker id lease held: %w", sequencer.ErrWorkerLeaseLost)
		},
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

// A clock stepped back 5 s behind the ids already issued: the ERROR line
// names the clock, not the lease, and its end is logged with how long.
func TestWatchLogsAClockBehindTheIssuedIDs(t *testing.T) {
	var out syncBuf
	behind := false
	w := newWatch(func(context.Context) error { return nil },
		func() error {
			if behind {
				return fmt.Errorf("idgen: clock is 4.2s behind the last issued id: %w", sequencer.ErrClockMovedBackwards)
			}
			return nil
		},
		func() bool { return false },
		time.Second, slog.New(slog.NewTextHandler(&out, nil)))
	t0 := time.Unix(1_000_000, 0)
	ctx := context.Background()
	w.probeAt(ctx, t0)
	behind = true
	for i := 1; i <= 5; i++ {
		w.probeAt(ctx, t0.Add(time.Duration(i)*time.Second))
	}
	behind = false
	w.probeAt(ctx, t0.Add(6*time.Second))
	log := out.String()
	if n := strings.Count(log, "level=ERROR"); n != 1 || !strings.Contains(log, "clock behind the msg_ids already issued") || strings.Contains(log, "lease") {
		t.Errorf("%d ERROR lines, want 1 about the clock (not the lease):\n%s", n, log)
	}
	if !strings.Contains(log, "clock caught up") || !strings.Contains(log, "was_behind_for=5s") {
		t.Errorf("the clock's catching up is not logged with how long it took:\n%s", log)
	}
}

// The watch keeps each ping's answer for sequencer_ready: a ping that timed
// out (a blackholed store) is kept as a failure; one the watch's stop cut
// short is not kept.
func TestKeptPing(t *testing.T) {
	var kept []error
	blocked := keptPing(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
		func(err error) { kept = append(kept, err) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := blocked(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a ping that timed out: %v", err)
	}
	if len(kept) != 1 || !errors.Is(kept[0], context.DeadlineExceeded) {
		t.Fatalf("kept %v after a timed-out ping, want its error", kept)
	}
	stopped, stop := context.WithCancel(context.Background())
	stop()
	_ = blocked(stopped)
	if len(kept) != 1 {
		t.Fatalf("kept %v after a ping the stop cut short, want nothing more", kept)
	}
	answered := keptPing(func(context.Context) error { return nil }, func(err error) { kept = append(kept, err) })
	if err := answered(context.Background()); err != nil || len(kept) != 2 || kept[1] != nil {
		t.Fatalf("an answered ping: %v, kept %v", err, kept)
	}
}

// Pings are one at a time: while one is in flight (a store that does not
// answer), calls share it or end with their own deadline, so that /readyz
// probes hold at most one store connection; its answer reaches them all,
// and the next call pings afresh.
func TestSharedPingRunsOneAtATime(t *testing.T) {
	var (
		mu            sync.Mutex
		running, most int
		calls         int
		release       = make(chan struct{})
		answer        error
	)
	ping := sharedPing(func(ctx context.Context) error {
		mu.Lock()
		calls++
		running++
		most = max(most, running)
		mu.Unlock()
		<-release
		mu.Lock()
		running--
		mu.Unlock()
		return answer
	})
	// A caller whose deadline comes first ends with it, unavailable.
	short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	errs := make(chan error, 8)
	go func() { errs <- ping(context.Background()) }()
	testwait.For(t, 5*time.Second, time.Millisecond, "the first ping running", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return running == 1
	})
	if err := ping(short); !errors.Is(err, sequencer.ErrStoreUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call that timed out behind a ping in flight: %v, want unavailable (deadline exceeded)", err)
	}
	for range 6 {
		go func() { errs <- ping(context.Background()) }()
	}
	time.Sleep(20 * time.Millisecond) // the six wait on the first (a ping each would run beside it)
	answer = errors.New("the answer")
	close(release)
	for range 7 {
		if err := <-errs; err == nil || err.Error() != "the answer" {
			t.Fatalf("a call sharing the ping got %v, want its answer", err)
		}
	}
	if most != 1 {
		t.Fatalf("%d pings at once for 7 callers, want one at a time", most)
	}
	t.Logf("7 callers, %d pings", calls) // 1 unless a caller came after the answer
	before := calls
	answer = nil
	if err := ping(context.Background()); err != nil || calls != before+1 {
		t.Fatalf("the next call: %v, %d pings after %d, want a fresh answered ping", err, calls, before)
	}
}
