package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/cluster"
	"github.com/sequencer-im/sequencer/commit"
	"github.com/sequencer-im/sequencer/internal/testwait"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// gauge returns the value of the series of name whose labels include
// labels (name=value pairs), and whether there is one.
func gauge(t *testing.T, s *Server, name string, labels ...string) (float64, bool) {
	t.Helper()
	return gaugeIn(scrape(t, s), name, labels...)
}

// scrape gathers the node's metrics once.
func scrape(t *testing.T, s *Server) []*dto.MetricFamily {
	t.Helper()
	mfs, err := s.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// gaugeIn is gauge on one scrape.
func gaugeIn(mfs []*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !hasLabel(m, labels[i], labels[i+1]) {
					continue series
				}
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// The per-scrape gauges of a clustered PostgreSQL node: pending against the
// limits, the commit queue, the three pools, the heartbeat age and the
// partitions moving (all of them, until this only node holds them).
func TestGaugesOfAClusteredNode(t *testing.T) {
	s := start(t, Config{Store: pgtest.NewDatabase(t), Cluster: cluster.Config{ClusterListen: "127.0.0.1:0"}, StoreConns: 5,
		StoreControlConns: 1, Actors: actor.Config{Commit: commit.Config{Workers: 3}, MaxPending: 1234, MaxPendingBytes: 5 << 20}}, nil)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"sequencer_pending_sends", nil, 0},
		{"sequencer_pending_sends_limit", nil, 1234},
		{"sequencer_pending_bytes", nil, 0},
		{"sequencer_pending_bytes_limit", nil, 5 << 20},
		{"sequencer_commit_queue_batches", nil, 0},
		{"sequencer_store_pool_max_conns", []string{"pool", "read"}, 5},
		{"sequencer_store_pool_max_conns", []string{"pool", "commit"}, 3}, // StoreCommitConns 0: CommitWorkers
		{"sequencer_store_pool_max_conns", []string{"pool", "control"}, 1},
	} {
		if v, ok := gauge(t, s, c.name, c.labels...); !ok || v != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	for _, pool := range []string{"read", "commit", "control"} {
		mfs := scrape(t, s) // one scrape: the three from one reading of the pool
		total, ok := gaugeIn(mfs, "sequencer_store_pool_total_conns", "pool", pool)
		acq, _ := gaugeIn(mfs, "sequencer_store_pool_acquired_conns", "pool", pool)
		idle, _ := gaugeIn(mfs, "sequencer_store_pool_idle_conns", "pool", pool)
		if !ok || total < 1 || acq+idle > total {
			t.Errorf("pool %s: total %v, acquired %v, idle %v", pool, total, acq, idle)
		}
	}
	age, ok := gauge(t, s, "sequencer_cluster_heartbeat_age_seconds")
	if ttl := s.cfg.Cluster.MemberTTL.Seconds(); !ok || age < 0 || age > ttl {
		t.Errorf("heartbeat age %v s (present %v), want within the member TTL %v s", age, ok, ttl)
	}
	testwait.For(t, 30*time.Second, 20*time.Millisecond, "no partition moving on a settled one-node cluster", func() bool {
		moving, ok := gauge(t, s, "sequencer_cluster_partitions_moving")
		return ok && moving == 0
	})
}

// The embedded store has no pools and a single node no cluster gauges.
func TestGaugesOfAnEmbeddedNode(t *testing.T) {
	s := start(t, Config{}, nil)
	if _, ok := gauge(t, s, "sequencer_pending_sends_limit"); !ok {
		t.Error("no sequencer_pending_sends_limit")
	}
	for _, name := range []string{"sequencer_store_pool_max_conns", "sequencer_cluster_heartbeat_age_seconds", "sequencer_cluster_partitions_moving"} {
		if _, ok := gauge(t, s, name); ok {
			t.Errorf("%s on an embedded single node", name)
		}
	}
}

// Config.TracerProvider reaches the API: a Send over HTTP ends a server span.
func TestTracerProviderWired(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	s := start(t, Config{TracerProvider: tp}, nil)
	resp, err := http.Post("http://"+s.Addr()+"/sequencer.v1.SequencerService/Send", "application/json",
		strings.NewReader(`{"convId":"c1","fromUid":"1","clientMsgId":"k1","msgType":1,"body":"aGk="}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("send: %d, X-Request-Id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}
	for _, sp := range rec.Ended() {
		if sp.Name() == "sequencer.v1.SequencerService/Send" && sp.SpanKind() == trace.SpanKindServer {
			return
		}
	}
	t.Fatalf("no server span for Send among %d", len(rec.Ended()))
}

// sequencer_ready reads the store's answer from the watch's last ping, not
// from a ping of its own: a scrape (and the console, which gathers the same
// registry) must not wait on a store that does not answer. Before, each
// scrape of a node whose store was blackholed took the ping's 2 s bound
// (e2e availability: "n1: no scrape" through every db-blackhole cut). With
// the watch stopped, a failed last ping reads 0 while /readyz (a live ping)
// answers 200; an answered one reads 1.
func TestReadyGaugeUsesTheWatchsLastPing(t *testing.T) {
	s := start(t, Config{}, nil)
	testwait.For(t, 10*time.Second, 20*time.Millisecond, "the watch's first ping", func() bool {
		return s.lastPing.Load() != nil
	})
	s.stopWatch()
	if v, ok := gauge(t, s, "sequencer_ready"); !ok || v != 1 {
		t.Fatalf("sequencer_ready %v (registered %v) after an answered ping, want 1", v, ok)
	}
	s.lastPing.Store(&pingResult{err: sequencer.ErrStoreUnavailable})
	if v, _ := gauge(t, s, "sequencer_ready"); v != 0 {
		t.Fatalf("sequencer_ready %v after a failed ping, want 0 (the gauge pinged the store itself)", v)
	}
	if code, body := get(t, "http://"+s.Addr()+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz %d %s: it pings the store itself, which answers", code, body)
	}
	s.lastPing.Store(&pingResult{})
	if v, _ := gauge(t, s, "sequencer_ready"); v != 1 {
		t.Fatalf("sequencer_ready %v after the store answered again, want 1", v)
	}
}
