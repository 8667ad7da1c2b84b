package cluster

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/metrics"
)

// clusterMetrics are the cluster's collectors, registered on the
// metrics.Set's registry. A nil *clusterMetrics records nothing.
type clusterMetrics struct {
	version   prometheus.Gauge       // sequencer_cluster_membership_version
	members   prometheus.Gauge       // sequencer_cluster_members
	partsHeld prometheus.Gauge       // sequencer_cluster_partitions_held
	handoffs  *prometheus.CounterVec // sequencer_cluster_partition_changes_total{change="acquired|released"}
	stepDowns prometheus.Counter     // sequencer_cluster_step_downs_total
	forwards  *prometheus.CounterVec // sequencer_cluster_forwards_total{result}
	batches   prometheus.Histogram   // sequencer_cluster_forward_batch_items
	recvd     *prometheus.CounterVec // sequencer_cluster_forwarded_received_total{result}
	wakesDrop prometheus.Counter     // sequencer_cluster_wakes_dropped_total
	peersDown prometheus.Gauge       // sequencer_cluster_peers_unreachable
}

func newClusterMetrics(set *metrics.Set) *clusterMetrics {
	if set == nil || set.Registry == nil {
		return nil
	}
	m := &clusterMetrics{
		version: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sequencer_cluster_membership_version", Help: "Version of the membership view this node routes by.",
		}),
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sequencer_cluster_members", Help: "Live members in this node's membership view.",
		}),
		partsHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sequencer_cluster_partitions_held", Help: "Partition leases this node holds and may write by (0 while its membership lease is not renewed, e.g. cut from the store: the other nodes take its partitions).",
		}),
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sequencer_cluster_partition_changes_total", Help: "Partition leases acquired and released by this node.",
		}, []string{"change"}),
		stepDowns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sequencer_cluster_step_downs_total", Help: "Times this node dropped all partitions (presumed dead or fenced) and rejoined.",
		}),
		forwards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sequencer_cluster_forwards_total", Help: "Sends forwarded to their owner, by result (ok, a code, transport_error, stalled, refused, owner_gone; not_sent: no connection could be opened; unreachable: not sent, the owner's link is down).",
		}, []string{"result"}),
		batches: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sequencer_cluster_forward_batch_items", Help: "Items per forwarded batch sent by this node.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 6),
		}),
		recvd: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sequencer_cluster_forwarded_received_total", Help: "Forwarded items received from other nodes, by result (accepted; accepted_from_non_member: the sender is not a live member of this node's view, e.g. cut from the store and forwarding to its partitions' next owners; invalid; refused: the batch names no sender).",
		}, []string{"result"}),
		wakesDrop: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sequencer_cluster_wakes_dropped_total", Help: "Wake-ups from other nodes dropped by the per-sender rate limit.",
		}),
		peersDown: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sequencer_cluster_peers_unreachable", Help: "Peers whose cluster link stalled and has not answered a probe since: sends to them are answered at once (forwards result unreachable).",
		}),
	}
	m.batches = register(set.Registry, m.batches)
	m.recvd = register(set.Registry, m.recvd)
	m.wakesDrop = register(set.Registry, m.wakesDrop)
	m.version = register(set.Registry, m.version)
	m.members = register(set.Registry, m.members)
	m.partsHeld = register(set.Registry, m.partsHeld)
	m.handoffs = register(set.Registry, m.handoffs)
	m.stepDowns = register(set.Registry, m.stepDowns)
	m.forwards = register(set.Registry, m.forwards)
	m.peersDown = register(set.Registry, m.peersDown)
	return m
}

// register registers c, or returns the collector already registered under
// its name (two nodes sharing one Set in a test).
func register[C prometheus.Collector](r prometheus.Registerer, c C) C {
	if err := r.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
	}
	return c
}

func (m *clusterMetrics) view(v membership.View) {
	if m == nil {
		return
	}
	m.version.Set(float64(v.Version))
	m.members.Set(float64(len(v.Members)))
}

func (m *clusterMetrics) held(n int) {
	if m != nil {
		m.partsHeld.Set(float64(n))
	}
}

func (m *clusterMetrics) acquired(n int) {
	if m != nil {
		m.handoffs.WithLabelValues("acquired").Add(float64(n))
	}
}

func (m *clusterMetrics) released(n int) {
	if m != nil {
		m.handoffs.WithLabelValues("released").Add(float64(n))
	}
}

func (m *clusterMetrics) stepDown() {
	if m != nil {
		m.stepDowns.Inc()
	}
}

func (m *clusterMetrics) forward(result string) {
	if m != nil {
		m.forwards.WithLabelValues(result).Inc()
	}
}

func (m *clusterMetrics) forwardBatch(items int) {
	if m != nil {
		m.batches.Observe(float64(items))
	}
}

func (m *clusterMetrics) received(result string, n int) {
	if m != nil && n > 0 {
		m.recvd.WithLabelValues(result).Add(float64(n))
	}
}

func (m *clusterMetrics) peerDown(delta int) {
	if m != nil {
		m.peersDown.Add(float64(delta))
	}
}

func (m *clusterMetrics) wakeDropped() {
	if m != nil {
		m.wakesDrop.Inc()
	}
}
