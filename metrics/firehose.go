package metrics

import "github.com/prometheus/client_golang/prometheus"

// FeedStats is what the firehose reports on a scrape.
type FeedStats struct {
	LagMessages   uint64  // committed messages not yet acknowledged by the broker
	LagSeconds    float64 // age of the oldest of them (0 when none)
	Published     uint64  // acknowledged publishes
	PublishErrors uint64
	StoreErrors   uint64
	Skipped       uint64 // seqs retention removed before they were published
	Publishing    bool   // false after a failed publish, until one succeeds
}

// Firehose reports sequencer_feed_lag_messages, sequencer_feed_lag_seconds,
// sequencer_feed_publishing and the counters sequencer_feed_published_total,
// sequencer_feed_publish_errors_total, sequencer_feed_store_errors_total and
// sequencer_feed_skipped_total (read returns them).
func (s *Set) Firehose(read func() FeedStats) {
	if s == nil {
		return
	}
	s.gaugeFunc("sequencer_feed_lag_messages", "Committed messages of the partitions this node owns not yet acknowledged by the broker (the firehose's backlog).", nil,
		func() float64 { return float64(read().LagMessages) })
	s.gaugeFunc("sequencer_feed_lag_seconds", "Age of the oldest message the firehose still owes the broker (0 when none).", nil,
		func() float64 { return read().LagSeconds })
	s.gaugeFunc("sequencer_feed_publishing", "1 while the firehose publishes, 0 after a failed publish until one succeeds.", nil,
		func() float64 {
			if read().Publishing {
				return 1
			}
			return 0
		})
	counter := func(name, help string, f func(FeedStats) uint64) {
		s.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(read())) }))
	}
	counter("sequencer_feed_published_total", "Messages the broker acknowledged (stored or de-duplicated).", func(f FeedStats) uint64 { return f.Published })
	counter("sequencer_feed_publish_errors_total", "Publishes that failed (retried).", func(f FeedStats) uint64 { return f.PublishErrors })
	counter("sequencer_feed_store_errors_total", "Firehose store calls (outbox scans, backlog reads, cursor updates) that failed (retried).", func(f FeedStats) uint64 { return f.StoreErrors })
	counter("sequencer_feed_skipped_total", "Seqs retention deleted before the firehose published them.", func(f FeedStats) uint64 { return f.Skipped })
}

// FeedPublishLag registers sequencer_feed_publish_lag_seconds (from a
// message's server_at to the broker's ack) and returns its observer; nil
// on a nil Set.
func (s *Set) FeedPublishLag() func(seconds float64) {
	if s == nil {
		return nil
	}
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sequencer_feed_publish_lag_seconds",
		Help:    "Time from a message's commit (server_at) to the broker's acknowledgement of its publish.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}})
	s.Registry.MustRegister(h)
	return h.Observe
}
