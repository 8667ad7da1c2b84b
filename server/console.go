package server

import (
	"context"
	"net/http"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/buildinfo"

	"github.com/sequencer-im/sequencer/cluster"
	"github.com/sequencer-im/sequencer/console"
	"github.com/sequencer-im/sequencer/feed"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/ring"
)

// clusterView shows a cluster node's view in the console.
type clusterView struct{ n *cluster.Node }

func (v clusterView) Version() uint64 { return v.n.Snapshot().Version }

func (v clusterView) Members() []console.Member {
	s := v.n.Snapshot()
	since := time.Since(s.ReadAt) // local time since the store's clock read StoreNow
	out := make([]console.Member, 0, len(s.Members))
	for _, m := range s.Members {
		age := s.StoreNow.Sub(m.LeaseUntil.Add(-s.MemberTTL)) + since
		out = append(out, console.Member{NodeID: m.NodeID, APIAddr: m.APIAddr, ClusterAddr: m.ClusterAddr,
			Leaving: m.Leaving, Self: m.NodeID == s.NodeID, HeartbeatAgeMs: max(0, age.Milliseconds()), Version: m.Version})
	}
	return out
}

func (v clusterView) Partitions() []console.Partition {
	s := v.n.Snapshot()
	out := make([]console.Partition, len(s.Partitions))
	for i, p := range s.Partitions {
		out[i] = console.Partition{Owner: p.Owner, Epoch: p.Epoch, RingOwner: p.RingOwner}
	}
	return out
}

// singleView is a node without a cluster: it owns every conversation.
type singleView struct{ s *Server }

func (v singleView) Version() uint64 { return 0 }
func (v singleView) Members() []console.Member {
	return []console.Member{{NodeID: v.s.cfg.NodeID, APIAddr: v.s.Addr(), Self: true, Version: buildinfo.Get().Version}}
}
func (v singleView) Partitions() []console.Partition { return nil }

// citusWorkers shows a Citus store's workers in the console.
type citusWorkers struct{ s persist.Sharded }

func (w citusWorkers) Workers(ctx context.Context) ([]console.Worker, error) {
	ws, err := w.s.CitusWorkers(ctx)
	out := make([]console.Worker, len(ws))
	for i, x := range ws {
		out[i] = console.Worker{Addr: x.Addr, Shards: x.Shards, Reachable: x.Reachable}
	}
	return out, err
}

// startConsole builds the read-only web console (/console/), served on the
// admin mux: on --admin-listen when set, else on the API port (with its
// TLS). Like /metrics it needs no token, except the conversation lookup
// when --auth-token-file is set.
func (s *Server) startConsole() *console.Console {
	var view console.ClusterView = singleView{s}
	if s.cluster != nil {
		view = clusterView{s.cluster}
	}
	cfg := console.Config{NodeID: s.cfg.NodeID, Cluster: view, Reader: s.store, Gatherer: s.metrics.Registry, Logger: s.log,
		Sends: s.sends}
	if s.cluster != nil {
		// Hot partitions: the partition count is fixed for the cluster's life.
		n := len(view.Partitions())
		cfg.PartitionOf = func(conv string) (uint32, bool) { return ring.PartitionOf(conv, n), n > 0 }
	}
	if s.cfg.TLSCert != "" {
		// The other members' consoles are on their API ports, with TLS.
		cfg.PeerScheme = "https"
	}
	if rp, ok := s.store.(persist.ReadPositions); ok {
		cfg.Positions = rp
	}
	if sh, ok := s.store.(persist.Sharded); ok {
		if dist, _, _ := sh.Distributed(); dist {
			cfg.Workers = citusWorkers{sh}
		}
	}
	if tokens := s.edge.tokens; tokens != nil {
		// Conversation lookups show message metadata: the API's token guards them.
		cfg.Authorize = func(r *http.Request) bool { return tokens.Check(r.Header.Get("Authorization")) }
	}
	if hub := s.feed; hub != nil {
		// The conversation view tails live from the change feed, like a
		// Subscribe of one conversation.
		cfg.Tail = func(ctx context.Context, conv string, after uint64, send func(*sequencer.Message) error) error {
			return hub.Serve(ctx, feed.Subscription{Cursors: []persist.Cursor{{ConvID: conv, AfterSeq: after}}, Store: s.store,
				Send: func(e feed.Event) error {
					if e.Kind != feed.KindMessage {
						return nil // a heartbeat; a truncation shows as the jump in seqs
					}
					return send(e.Msg)
				}})
		}
	}
	s.console = console.New(cfg)
	return s.console
}
