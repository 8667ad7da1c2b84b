package bench

import (
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Latency bounds: values are recorded in microseconds, from 1 µs to 2 min,
// with 3 significant digits (0.1% resolution).
const (
	latencyMinUS   = 1
	latencyMaxUS   = int64(2 * time.Minute / time.Microsecond)
	latencyDigits  = 3
	latencyShards  = 32
	latencyShardMk = latencyShards - 1
)

// Latency is an HDR histogram of send latencies that many senders record into
// concurrently. It is sharded (a sender records into shard sender%32) so that
// 1,024 senders do not serialize on one lock; Snapshot merges the shards.
type Latency struct {
	shards [latencyShards]latencyShard
}

type latencyShard struct {
	mu sync.Mutex
	h  *hdrhistogram.Histogram
	_  [40]byte // keep shards on separate cache lines
}

// NewLatency returns an empty histogram.
func NewLatency() *Latency {
	l := &Latency{}
	for i := range l.shards {
		l.shards[i].h = hdrhistogram.New(latencyMinUS, latencyMaxUS, latencyDigits)
	}
	return l
}

// Record adds one latency observed by sender. Values beyond two minutes are
// clamped to two minutes.
func (l *Latency) Record(sender int, d time.Duration) {
	us := int64(d / time.Microsecond)
	if us < latencyMinUS {
		us = latencyMinUS
	}
	if us > latencyMaxUS {
		us = latencyMaxUS
	}
	s := &l.shards[sender&latencyShardMk]
	s.mu.Lock()
	_ = s.h.RecordValue(us) // in range by construction
	s.mu.Unlock()
}

// Snapshot returns the merged histogram of every shard.
func (l *Latency) Snapshot() *hdrhistogram.Histogram {
	out := hdrhistogram.New(latencyMinUS, latencyMaxUS, latencyDigits)
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		out.Merge(s.h)
		s.mu.Unlock()
	}
	return out
}

// LatencySummary is the part of a latency distribution the report shows, in
// milliseconds.
type LatencySummary struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
}

// Summarize reads the quantiles of h (recorded in microseconds). An empty
// histogram gives the zero summary.
func Summarize(h *hdrhistogram.Histogram) LatencySummary {
	n := h.TotalCount()
	if n == 0 {
		return LatencySummary{}
	}
	ms := func(us int64) float64 { return float64(us) / 1000 }
	q := h.ValueAtPercentiles([]float64{50, 90, 99, 99.9})
	return LatencySummary{
		Count: n,
		Mean:  h.Mean() / 1000,
		P50:   ms(q[50]),
		P90:   ms(q[90]),
		P99:   ms(q[99]),
		P999:  ms(q[99.9]),
		Max:   ms(h.Max()),
	}
}
