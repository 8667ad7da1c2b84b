// Package metrics defines the sequencer's Prometheus collectors in one place,
// so names and labels stay consistent across packages. Every collector is
// registered on the Registry a Set is built with; a nil *Set is valid and
// records nothing, so packages take an optional *Set.
package metrics

import (
	"github.com/sequencer-im/sequencer/buildinfo"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Set is the sequencer's collectors.
type Set struct {
	Registry *prometheus.Registry

	Sends           *prometheus.CounterVec   // sequencer_sends_total{code}
	DedupHits       prometheus.Counter       // sequencer_dedup_hits_total
	BatchMessages   prometheus.Histogram     // sequencer_commit_batch_messages: rows per store transaction
	BatchConvs      prometheus.Histogram     // sequencer_commit_batch_conversations: conversations per store transaction
	CommitSeconds   *prometheus.HistogramVec // sequencer_commit_seconds{result}
	LiveConvs       prometheus.Gauge         // sequencer_conversation_actors
	Passivations    prometheus.Counter       // sequencer_passivations_total
	ClockRollbacks  *prometheus.CounterVec   // sequencer_clock_rollbacks_total{outcome="waited|refused"}
	WorkerLease     prometheus.Gauge         // sequencer_worker_lease_held (1/0)
	Requests        *prometheus.CounterVec   // sequencer_rpc_requests_total{method,code}
	HeadRegressions prometheus.Counter       // sequencer_head_regressions_total
	Trimmed         prometheus.Counter       // sequencer_trimmed_messages_total
	BuildInfo       *prometheus.GaugeVec     // sequencer_build_info{version,commit,goversion}: always 1
	SendSeconds     *prometheus.HistogramVec // sequencer_send_seconds{method="Send|SendBatch",code}: request received to answer
}

// SetReadiness registers sequencer_ready, 1 while ready returns nil (what
// /readyz answers), else 0; it is evaluated on every scrape, so ready must
// not wait on the store (the server passes its readiness with the store's
// last ping). Alerts on readiness flapping use it. Call it once, when ready
// can be called.
func (s *Set) SetReadiness(ready func() error) {
	if s == nil {
		return
	}
	s.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sequencer_ready", Help: "1 while the node accepts sends (/readyz answers 200), else 0; evaluated per scrape, with the store's answer from the node's last store ping (every second).",
	}, func() float64 {
		if ready() != nil {
			return 0
		}
		return 1
	}))
}

// New builds a Set on a fresh registry (with Go and process collectors).
func New() *Set {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := func(c prometheus.Collector) { r.MustRegister(c) }
	s := &Set{Registry: r}
	s.Sends = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sequencer_sends_total", Help: "Send results by code (ok, duplicate, invalid_argument, unavailable, ...).",
	}, []string{"code"})
	s.DedupHits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sequencer_dedup_hits_total", Help: "Sends answered with the first send's ids (duplicate: true).",
	})
	s.BatchMessages = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sequencer_commit_batch_messages", Help: "Messages per store transaction.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 14),
	})
	s.BatchConvs = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sequencer_commit_batch_conversations", Help: "Conversations per store transaction.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 14),
	})
	s.CommitSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "sequencer_commit_seconds", Help: "Store commit latency by result.",
		Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
	}, []string{"result"})
	s.LiveConvs = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sequencer_conversation_actors", Help: "Live (not passivated) conversation actors.",
	})
	s.Passivations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sequencer_passivations_total", Help: "Conversation actors stopped after idling.",
	})
	s.ClockRollbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sequencer_clock_rollbacks_total", Help: "Clock moved backwards while issuing msg_ids (waited: <= 5 ms, refused: more).",
	}, []string{"outcome"})
	s.WorkerLease = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sequencer_worker_lease_held", Help: "1 while this node holds its snowflake worker-id lease.",
	})
	s.Requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sequencer_rpc_requests_total", Help: "RPCs by method and result code.",
	}, []string{"method", "code"})
	s.HeadRegressions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sequencer_head_regressions_total",
		Help: "Conversations refused because the store's head fell below a seq this node acked (the store lost acknowledged messages).",
	})
	s.BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sequencer_build_info", Help: "Always 1; the labels say which build runs (sequencer version).",
	}, []string{"version", "commit", "goversion"})
	bi := buildinfo.Get()
	s.BuildInfo.WithLabelValues(bi.Version, bi.Commit, bi.GoVersion).Set(1)
	s.Trimmed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sequencer_trimmed_messages_total", Help: "Messages deleted by this node's retention passes (--retention).",
	})
	s.SendSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "sequencer_send_seconds", Help: "Send and SendBatch latency on this node, from request received to answer, by code (ok, duplicate, invalid_argument, unavailable, ...; a SendBatch that answered is ok).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"method", "code"})
	for _, c := range []prometheus.Collector{s.Sends, s.DedupHits, s.BatchMessages, s.BatchConvs, s.CommitSeconds,
		s.LiveConvs, s.Passivations, s.ClockRollbacks, s.WorkerLease, s.Requests, s.HeadRegressions, s.Trimmed, s.BuildInfo, s.SendSeconds} {
		f(c)
	}
	return s
}

// The gauges below are evaluated on every scrape (GaugeFunc): they read the
// state where it lives, so nothing is copied, duplicated or polled. Each
// registering method is nil-safe and is called once per Set.

// gaugeFunc registers one GaugeFunc.
func (s *Set) gaugeFunc(name, help string, labels prometheus.Labels, f func() float64) {
	s.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f))
}

// Pending reports the node's admission state: sequencer_pending_sends and
// sequencer_pending_sends_limit (--max-pending), sequencer_pending_bytes
// and sequencer_pending_bytes_limit (--max-pending-bytes). read returns the
// sends and bytes held and their limits.
func (s *Set) Pending(read func() (sends, sendsLimit, bytes, bytesLimit int64)) {
	if s == nil {
		return
	}
	s.gaugeFunc("sequencer_pending_sends", "Sends admitted on this node and not yet answered.", nil,
		func() float64 { n, _, _, _ := read(); return float64(n) })
	s.gaugeFunc("sequencer_pending_sends_limit", "Pending sends past which sends get resource_exhausted (--max-pending).", nil,
		func() float64 { _, l, _, _ := read(); return float64(l) })
	s.gaugeFunc("sequencer_pending_bytes", "Bytes (bodies and keys) of the pending sends.", nil,
		func() float64 { _, _, b, _ := read(); return float64(b) })
	s.gaugeFunc("sequencer_pending_bytes_limit", "Pending bytes past which sends get resource_exhausted (--max-pending-bytes).", nil,
		func() float64 { _, _, _, l := read(); return float64(l) })
}

// CommitQueue reports sequencer_commit_queue_batches: conversation batches
// waiting for a group-commit transaction (depth returns it).
func (s *Set) CommitQueue(depth func() int) {
	if s == nil {
		return
	}
	s.gaugeFunc("sequencer_commit_queue_batches", "Conversation batches queued for the group-commit writer, not yet in a transaction.", nil,
		func() float64 { return float64(depth()) })
}

// PoolStat is one connection pool's state (PostgreSQL).
type PoolStat struct {
	Acquired, Idle, Total, Max int32
}

// StorePool reports sequencer_store_pool_{acquired,idle,total,max}_conns
// {pool=name} for one PostgreSQL connection pool ("read", "commit" or
// "control"), all four from one reading of stat per scrape: a scrape's
// acquired and idle connections never add up to more than its total.
func (s *Set) StorePool(name string, stat func() PoolStat) {
	if s == nil {
		return
	}
	l := prometheus.Labels{"pool": name}
	desc := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, l) }
	s.Registry.MustRegister(&poolCollector{stat: stat, descs: [4]*prometheus.Desc{
		desc("sequencer_store_pool_acquired_conns", "PostgreSQL connections in use, by pool."),
		desc("sequencer_store_pool_idle_conns", "PostgreSQL connections idle in the pool, by pool."),
		desc("sequencer_store_pool_total_conns", "PostgreSQL connections open (acquired, idle and being opened), by pool."),
		desc("sequencer_store_pool_max_conns", "PostgreSQL pool size, by pool (--store-conns for read, --store-commit-conns, --store-control-conns)."),
	}})
}

// poolCollector is one pool's four gauges (acquired, idle, total, max).
type poolCollector struct {
	stat  func() PoolStat
	descs [4]*prometheus.Desc
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stat()
	for i, v := range [4]int32{st.Acquired, st.Idle, st.Total, st.Max} {
		ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.GaugeValue, float64(v))
	}
}

// StoreRetries reports sequencer_store_commit_retries_total: commit
// transactions the store rolled back and redid after a deadlock or lock
// wait timeout before COMMIT (MySQL; nothing was written by them).
func (s *Set) StoreRetries(read func() uint64) {
	if s == nil {
		return
	}
	s.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sequencer_store_commit_retries_total",
		Help: "Commit transactions redone after a deadlock (1213) or lock wait timeout (1205) before COMMIT (MySQL)."},
		func() float64 { return float64(read()) }))
}

// ClusterState reports sequencer_cluster_heartbeat_age_seconds (since this
// node's last successful membership heartbeat) and
// sequencer_cluster_partitions_moving (partitions whose lease holder is not
// their ring owner, free ones included, in this node's view).
func (s *Set) ClusterState(heartbeatAge func() float64, moving func() int) {
	if s == nil {
		return
	}
	s.gaugeFunc("sequencer_cluster_heartbeat_age_seconds", "Seconds since this node's last successful membership heartbeat (past --member-ttl it is presumed dead).", nil, heartbeatAge)
	s.gaugeFunc("sequencer_cluster_partitions_moving", "Partitions whose lease is not held by their ring owner in this node's view (moving, or free).", nil,
		func() float64 { return float64(moving()) })
}

// FeedStat is the change feed's state and totals (package feed's Hub).
type FeedStat struct {
	Streams, Follows, Conversations, Taps  int
	Delivered, Heartbeats, Cut, Refused    uint64
	BacklogReads, BacklogMessages, TapsCut uint64
}

// Feed reports the change feed: sequencer_feed_streams,
// sequencer_feed_subscriptions (stream x conversation pairs, what
// --max-subscriptions bounds), sequencer_feed_conversations,
// sequencer_feed_peer_taps, and the counters
// sequencer_feed_delivered_messages_total, sequencer_feed_heartbeats_total,
// sequencer_feed_slow_consumers_cut_total,
// sequencer_feed_subscribes_refused_total,
// sequencer_feed_backlog_reads_total,
// sequencer_feed_backlog_messages_total and
// sequencer_feed_peer_taps_cut_total; read returns them.
func (s *Set) Feed(read func() FeedStat) {
	if s == nil {
		return
	}
	g := func(name, help string, f func(FeedStat) int) {
		s.gaugeFunc(name, help, nil, func() float64 { return float64(f(read())) })
	}
	c := func(name, help string, f func(FeedStat) uint64) {
		s.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(read())) }))
	}
	g("sequencer_feed_streams", "Subscribe streams open on this node.", func(f FeedStat) int { return f.Streams })
	g("sequencer_feed_subscriptions", "Conversations followed by this node's Subscribe streams, a stream of n conversations counting n (--max-subscriptions bounds it).",
		func(f FeedStat) int { return f.Follows })
	g("sequencer_feed_conversations", "Distinct conversations this node's Subscribe streams follow.", func(f FeedStat) int { return f.Conversations })
	g("sequencer_feed_peer_taps", "Peers' Feed streams this node serves (one per peer that has subscribers).", func(f FeedStat) int { return f.Taps })
	c("sequencer_feed_delivered_messages_total", "Messages sent to subscribers (backlog and live).", func(f FeedStat) uint64 { return f.Delivered })
	c("sequencer_feed_heartbeats_total", "Heartbeat events sent to idle Subscribe streams.", func(f FeedStat) uint64 { return f.Heartbeats })
	c("sequencer_feed_slow_consumers_cut_total", "Subscribe streams ended with resource_exhausted because their subscriber fell behind (--subscribe-queue).",
		func(f FeedStat) uint64 { return f.Cut })
	c("sequencer_feed_subscribes_refused_total", "Subscribes refused with resource_exhausted at the node's bound (--max-subscriptions).",
		func(f FeedStat) uint64 { return f.Refused })
	c("sequencer_feed_backlog_reads_total", "Store reads of Subscribe streams' backlogs (each names up to 1,000 conversations).",
		func(f FeedStat) uint64 { return f.BacklogReads })
	c("sequencer_feed_backlog_messages_total", "Messages those backlog reads returned.", func(f FeedStat) uint64 { return f.BacklogMessages })
	c("sequencer_feed_peer_taps_cut_total", "Peers' Feed streams this node ended because their queue overflowed (the peer re-reads the store).",
		func(f FeedStat) uint64 { return f.TapsCut })
}

// PeerFeed reports the cluster's feed upstream: sequencer_feed_peer_links
// (one per other live member), sequencer_feed_peer_links_up (those whose
// stream answered and is open) and sequencer_feed_peer_stream_ends_total
// (streams to peers that ended; each makes the node re-read the store for
// what it follows); read returns them.
func (s *Set) PeerFeed(read func() (links, up int, ended uint64)) {
	if s == nil {
		return
	}
	s.gaugeFunc("sequencer_feed_peer_links", "Feed links of this node to its peers (one per other live member).", nil,
		func() float64 { l, _, _ := read(); return float64(l) })
	s.gaugeFunc("sequencer_feed_peer_links_up", "Feed links to peers whose stream answered and is open (below sequencer_feed_peer_links: live messages from that peer wait for a reconnect; streams fill from the store).", nil,
		func() float64 { _, u, _ := read(); return float64(u) })
	s.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sequencer_feed_peer_stream_ends_total",
		Help: "Feed streams to peers that ended (a peer died, a link was cut, its queue overflowed); each re-reads the store for what this node follows."},
		func() float64 { _, _, e := read(); return float64(e) }))
}
