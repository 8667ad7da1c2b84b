package idgen

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/metrics"
)

// t0 is a fake-clock start 0.3 ms into a millisecond, so waits for the next
// millisecond are visibly shorter than 1 ms.
var t0 = time.Date(2026, 11, 30, 8, 0, 0, 300_000, time.UTC)

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func mustNew(t *testing.T, cfg Config) *Generator {
	t.Helper()
	g, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return g
}

func mustNext(t *testing.T, g *Generator) uint64 {
	t.Helper()
	id, err := g.Next()
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return id
}

func TestEpochConstant(t *testing.T) {
	if got := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(); got != Epoch {
		t.Fatalf("Epoch = %d, 2024-01-01T00:00:00Z is %d", Epoch, got)
	}
}

func TestWorkerIDBounds(t *testing.T) {
	for _, tc := range []struct {
		worker int
		ok     bool
	}{
		{-1, false},
		{0, true},
		{1, true},
		{1023, true},
		{1024, false},
		{1 << 20, false},
	} {
		clk := clock.NewFake(t0)
		g, err := New(Config{WorkerID: tc.worker, Clock: clk})
		if !tc.ok {
			if err == nil {
				t.Errorf("worker %d: New succeeded, want an error", tc.worker)
			}
			continue
		}
		if err != nil {
			t.Errorf("worker %d: %v", tc.worker, err)
			continue
		}
		id := mustNext(t, g)
		ts, w, seq := Decode(id)
		if w != tc.worker || !ts.Equal(t0.Truncate(time.Millisecond)) || seq != 0 {
			t.Errorf("worker %d: Decode(%d) = %s, %d, %d", tc.worker, id, ts, w, seq)
		}
		if id>>63 != 0 {
			t.Errorf("worker %d: sign bit set in %d", tc.worker, id)
		}
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		ms          int64
		worker, seq int
	}{
		{Epoch + 1, 0, 0},
		{Epoch + 1, MaxWorkerID, MaxSeq},
		{t0.UnixMilli(), 517, 42},
		{Epoch + maxRelMs, MaxWorkerID, MaxSeq}, // the last representable id
	} {
		id := Compose(tc.ms, tc.worker, tc.seq)
		ts, w, seq := Decode(id)
		if ts.UnixMilli() != tc.ms || w != tc.worker || seq != tc.seq {
			t.Errorf("Decode(Compose(%d, %d, %d)) = %d, %d, %d", tc.ms, tc.worker, tc.seq, ts.UnixMilli(), w, seq)
		}
		if int64(id) < 0 {
			t.Errorf("Compose(%d, %d, %d) = %d: negative as BIGINT", tc.ms, tc.worker, tc.seq, id)
		}
	}
}

func TestNextMonotonic(t *testing.T) {
	clk := clock.NewFake(t0)
	g := mustNew(t, Config{WorkerID: 7, Clock: clk})
	var prev uint64
	steps := []time.Duration{0, 0, time.Millisecond, 0, 250 * time.Microsecond, 800 * time.Microsecond, time.Second, 0, 24 * time.Hour}
	for i, step := range steps {
		clk.Advance(step)
		for j := 0; j < 3; j++ {
			id := mustNext(t, g)
			if id <= prev {
				t.Fatalf("step %d: id %d not above previous %d", i, id, prev)
			}
			ts, w, _ := Decode(id)
			if w != 7 || !ts.Equal(clk.Now().Truncate(time.Millisecond)) {
				t.Fatalf("step %d: Decode = %s worker %d, clock %s", i, ts, w, clk.Now())
			}
			prev = id
		}
	}
	if clk.Slept() != 0 {
		t.Fatalf("slept %s without any rollback or overflow", clk.Slept())
	}
}

func TestNextConcurrentUnique(t *testing.T) {
	// The fake clock never moves by itself: each 4096 ids exhaust a
	// millisecond and the generator sleeps (advances) to the next one.
	clk := clock.NewFake(t0)
	g := mustNew(t, Config{WorkerID: 3, Clock: clk})
	const workers, each = 4, 5000
	out := make([][]uint64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]uint64, 0, each)
			for range each {
				id, err := g.Next()
				if err != nil {
					t.Error(err)
					return
				}
				ids = append(ids, id)
			}
			out[w] = ids
		}()
	}
	wg.Wait()
	seen := make(map[uint64]bool, workers*each)
	for w, ids := range out {
		for i, id := range ids {
			if seen[id] {
				t.Fatalf("id %d issued twice", id)
			}
			seen[id] = true
			if i > 0 && id <= ids[i-1] {
				t.Fatalf("goroutine %d: id %d after %d", w, id, ids[i-1])
			}
		}
	}
	if len(seen) != workers*each {
		t.Fatalf("got %d ids, want %d", len(seen), workers*each)
	}
}

func TestSameMillisecondOverflow(t *testing.T) {
	clk := clock.NewFake(t0)
	g := mustNew(t, Config{WorkerID: 9, Clock: clk})
	ms := t0.Truncate(time.Millisecond)
	var prev uint64
	for i := 0; i <= MaxSeq; i++ {
		id := mustNext(t, g)
		ts, _, seq := Decode(id)
		if !ts.Equal(ms) || seq != i || id <= prev && i > 0 {
			t.Fatalf("id #%d: %s seq %d (prev %d)", i, ts, seq, prev)
		}
		prev = id
	}
	if clk.Slept() != 0 {
		t.Fatalf("slept %s within the first 4096 ids", clk.Slept())
	}
	id := mustNext(t, g) // the 4097th
	ts, _, seq := Decode(id)
	if !ts.Equal(ms.Add(time.Millisecond)) || seq != 0 || id <= prev {
		t.Fatalf("4097th id: %s seq %d, want next ms seq 0", ts, seq)
	}
	if want := ms.Add(time.Millisecond).Sub(t0); clk.Slept() != want {
		t.Fatalf("slept %s, want %s (to the next ms boundary)", clk.Slept(), want)
	}
}

func TestClockRollback(t *testing.T) {
	for _, tc := range []struct {
		name      string
		back      time.Duration
		wantErr   bool
		wantSlept time.Duration
	}{
		{"1ms waits", time.Millisecond, false, time.Millisecond},
		{"5ms waits", 5 * time.Millisecond, false, 5 * time.Millisecond},
		{"6ms refused", 6 * time.Millisecond, true, 0},
		{"10ms refused", 10 * time.Millisecond, true, 0},
		{"1h refused", time.Hour, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			m := metrics.New()
			g := mustNew(t, Config{WorkerID: 1, Clock: clk, Metrics: m})
			first := mustNext(t, g)
			clk.Advance(-tc.back)
			id, err := g.Next()
			waited := counterValue(t, m.ClockRollbacks.WithLabelValues("waited"))
			refused := counterValue(t, m.ClockRollbacks.WithLabelValues("refused"))
			if clk.Slept() != tc.wantSlept {
				t.Errorf("slept %s, want %s", clk.Slept(), tc.wantSlept)
			}
			if tc.wantErr {
				if !errors.Is(err, sequencer.ErrClockMovedBackwards) {
					t.Fatalf("Next = %d, %v; want ErrClockMovedBackwards", id, err)
				}
				if c := sequencer.ErrorCode(err); c != sequencer.CodeUnavailable || !c.Retryable() {
					t.Errorf("code %s, want unavailable (retryable)", c)
				}
				if refused != 1 || waited != 0 {
					t.Errorf("metrics refused=%v waited=%v, want 1, 0", refused, waited)
				}
				// Once the clock is back past the last id, ids resume above it.
				clk.Advance(tc.back)
				if id := mustNext(t, g); id <= first {
					t.Errorf("after recovery id %d <= %d", id, first)
				}
				return
			}
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			if id <= first {
				t.Fatalf("id %d after waiting is not above %d", id, first)
			}
			if waited != 1 || refused != 0 {
				t.Errorf("metrics waited=%v refused=%v, want 1, 0", waited, refused)
			}
		})
	}
}

// TestClockStepBackWhileWaiting: the clock steps back by seconds while
// Next waits for the next millisecond (4096 ids in this one): Next must
// refuse at once (clock moved backwards), not spin until the clock is past
// that millisecond again.
func TestClockStepBackWhileWaiting(t *testing.T) {
	clk := clock.NewFake(t0)
	g := mustNew(t, Config{WorkerID: 3, Clock: clk})
	for i := 0; i <= MaxSeq; i++ {
		mustNext(t, g)
	}
	// From the next reading on the clock is 5s back, and then runs 1us per
	// reading (a free-running clock: waitPast spins on it).
	readings := 0
	stepped := false
	clk.OnNow = func(now time.Time) time.Time {
		readings++
		if !stepped {
			stepped = true
			return now
		}
		if readings == 3 {
			return now.Add(-5 * time.Second)
		}
		return now.Add(time.Microsecond)
	}
	id, err := g.Next()
	clk.OnNow = nil
	if !errors.Is(err, sequencer.ErrClockMovedBackwards) {
		t.Fatalf("Next = %d, %v; want ErrClockMovedBackwards", id, err)
	}
	if readings > 100 {
		t.Fatalf("Next read the clock %d times: it spun while the clock was behind", readings)
	}
}

func TestAfterMsFloor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ahead   time.Duration // floor minus the clock's ms
		wantErr bool
	}{
		{"floor behind the clock", -time.Second, false},
		{"floor is this ms", 0, false},
		{"floor 3ms ahead waits", 3 * time.Millisecond, false},
		{"floor 10ms ahead refused", 10 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			floor := t0.Add(tc.ahead).UnixMilli()
			g := mustNew(t, Config{WorkerID: 2, Clock: clk, AfterMs: floor})
			id, err := g.Next()
			if tc.wantErr {
				if !errors.Is(err, sequencer.ErrClockMovedBackwards) {
					t.Fatalf("Next = %d, %v; want ErrClockMovedBackwards", id, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ts, _, _ := Decode(id); ts.UnixMilli() <= floor {
				t.Fatalf("id for ms %d, not above the floor %d", ts.UnixMilli(), floor)
			}
		})
	}
}

func TestClockOutsideLayout(t *testing.T) {
	clk := clock.NewFake(EpochTime.Add(-time.Hour))
	g := mustNew(t, Config{WorkerID: 0, Clock: clk})
	if _, err := g.Next(); err == nil || sequencer.ErrorCode(err) != sequencer.CodeInternal {
		t.Fatalf("clock before Epoch: Next error %v, want code internal", err)
	}
}
