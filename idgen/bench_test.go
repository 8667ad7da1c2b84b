package idgen

import (
	"context"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/clock"
)

// The layout caps one worker at 4096 ids per ms: 4,096,000 ids/s, 244 ns/id.
// These benchmarks use the real clock; see docs/IDGEN.md for the figures.
//
//	go test -run '^$' -bench . -benchtime 2s ./idgen/

func reportRate(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ids/s")
}

// BenchmarkNext: one goroutine, fixed worker id, real clock.
func BenchmarkNext(b *testing.B) {
	g, err := New(Config{WorkerID: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := g.Next(); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b)
}

// BenchmarkNextParallel: GOMAXPROCS goroutines share one generator.
func BenchmarkNextParallel(b *testing.B) {
	g, err := New(Config{WorkerID: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := g.Next(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportRate(b)
}

// BenchmarkNextLeased: one goroutine, generator gated by an Issuer on the
// in-memory store (the gate checks are on the path; renewals are not, as in
// production where the background loop renews long before the reservation
// ends).
func BenchmarkNextLeased(b *testing.B) {
	l, err := NewIssuer(newLeaseStore(), IssuerConfig{Holder: "bench", TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	if err := l.RenewOnce(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := l.Next(); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b)
}

// fastClock reads the real clock but runs one extra millisecond ahead per
// 4000 readings, so a generator on it never exhausts a millisecond: the
// benchmark then shows the cost of an id (clock reading included) without
// the layout's cap. Single goroutine only.
// Its timers are the real clock's.
type fastClock struct {
	clock.Real
	n int64
}

func (c *fastClock) Now() time.Time {
	c.n++
	return time.Now().Add(time.Duration(c.n/4000) * time.Millisecond)
}
func (c *fastClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// BenchmarkNextUncapped: the cost of one id when the layout's 4096/ms cap
// never binds (how much headroom below 244 ns/id there is).
func BenchmarkNextUncapped(b *testing.B) {
	g, err := New(Config{WorkerID: 1, Clock: &fastClock{}})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := g.Next(); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b)
}

// BenchmarkClockNow: the clock reading alone, for comparison.
func BenchmarkClockNow(b *testing.B) {
	var sink int64
	for i := 0; i < b.N; i++ {
		sink += time.Now().UnixMilli()
	}
	_ = sink
}
