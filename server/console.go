package server

import (
	"net/http"
	"time"

	"github.com/sequencer-im/sequencer/cluster"
	"github.com/sequencer-im/sequencer/console"
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
			Leaving: m.Leaving, Self: m.NodeID == s.NodeID, HeartbeatAgeMs: max(0, age.Milliseconds())})
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
	return []console.Member{{NodeID: v.s.cfg.NodeID, APIAddr: v.s.Addr(), Self: true}}
}
func (v singleView) Partitions() []console.Partition { return nil }

// withConsole serves the web console under /console/ and everything else
// with api. (The console moves to the admin listener once there is one.)
func (s *Server) withConsole(api http.Handler) http.Handler {
	var view console.ClusterView = singleView{s}
	if s.cluster != nil {
		view = clusterView{s.cluster}
	}
	s.console = console.New(console.Config{NodeID: s.cfg.NodeID, Cluster: view, Reader: s.store,
		Gatherer: s.metrics.Registry, Logger: s.log})
	mux := http.NewServeMux()
	mux.Handle("/console/", s.console)
	mux.Handle("/console", s.console)
	mux.Handle("/", api)
	return mux
}
