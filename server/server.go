// Package server wires one sequencer node together: the store, the worker-id
// lease and msg_id generator, the conversation actors with their group-commit
// writer, the RPC API with health, readiness and metrics on one port, and (in
// cluster mode) membership, fenced partition ownership and forwarding. It owns
// the order of start and of the graceful stop; it implements no sequencing,
// storage or transport logic of its own.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/api"
	"github.com/sequencer-im/sequencer/cluster"
	"github.com/sequencer-im/sequencer/console"
	"github.com/sequencer-im/sequencer/idgen"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/open"
	"github.com/sequencer-im/sequencer/persist/postgres"
	"github.com/sequencer-im/sequencer/ring"
)

var (
	_ api.Sender = (*actor.Node)(nil)
	_ api.Sender = (*cluster.Node)(nil)
	_ api.Router = (*cluster.Node)(nil)
)

// Server is a running node.
type Server struct {
	cfg      Config
	log      *slog.Logger
	metrics  *metrics.Set
	store    persist.Store
	lease    *idgen.Lease
	node     *actor.Node
	cluster  *cluster.Node // nil on a single node
	console  *console.Console
	http     *http.Server
	listener net.Listener
	served   chan error
	draining atomic.Bool
}

// Run starts a node and serves until ctx ends, then drains (see Shutdown)
// within cfg.DrainTimeout.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	s, err := Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-s.served:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("api server stopped", "err", err)
		}
	}
	log.Info("draining", "timeout", s.cfg.DrainTimeout)
	dctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer cancel()
	return s.Shutdown(dctx)
}

// Start builds the node and starts serving; it returns once the API listens.
// A store that is down at start is an error (the operator sees it at once);
// a store that goes down later makes sends fail with unavailable.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Server{cfg: cfg, log: log, metrics: metrics.New(), served: make(chan error, 1)}
	ok := false
	defer func() {
		if !ok {
			if s.cluster != nil {
				_ = s.cluster.Leave(context.Background())
				_ = s.cluster.Close()
			}
			s.closeAll(context.Background())
		}
	}()

	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := open.Store(octx, cfg.Store, open.Options{})
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	s.store = st

	s.lease, err = idgen.NewLease(st, idgen.LeaseConfig{Holder: cfg.NodeID, TTL: cfg.WorkerLeaseTTL, Metrics: s.metrics})
	if err != nil {
		return nil, err
	}
	if err := s.lease.Start(octx); err != nil {
		return nil, fmt.Errorf("worker-id lease: %w", err)
	}

	// The API address is bound first: in cluster mode Route answers it.
	s.listener, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}

	acfg := actor.Config{
		Store: st, IDs: s.lease, Metrics: s.metrics, Logger: log,
		PassivateAfter: cfg.PassivateAfter, MaxQueuePerConv: cfg.MaxQueuePerConv, MaxPending: cfg.MaxPending,
		CommitWorkers: cfg.CommitWorkers, MaxBatchMessages: cfg.MaxBatchMessages, CommitTimeout: cfg.CommitTimeout,
	}
	var sender api.Sender
	var router api.Router = api.RouterFunc(s.routeSingle)
	if cfg.ClusterListen != "" {
		pg, isPG := st.(*postgres.Store)
		if !isPG {
			return nil, fmt.Errorf("cluster mode needs a PostgreSQL store")
		}
		s.cluster, err = cluster.New(cluster.Config{
			NodeID: cfg.NodeID, Store: pg.Cluster(), ClusterListen: cfg.ClusterListen,
			ClusterAdvertise: cfg.ClusterAdvertise, APIAddr: s.Addr(),
			Ring:      ring.Config{Partitions: cfg.Partitions},
			MemberTTL: cfg.MemberTTL, Heartbeat: cfg.Heartbeat, HandoffWait: cfg.HandoffWait,
			Logger: log, Metrics: s.metrics,
		})
		if err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		// Commits carry the partition fence; a fenced commit makes the node
		// step down.
		acfg.Store = s.cluster.FenceStore(st)
		acfg.Ownership = s.cluster
	}
	s.node, err = actor.NewNode(acfg)
	if err != nil {
		return nil, err
	}
	sender = s.node
	if s.cluster != nil {
		if err := s.cluster.Start(octx, s.node); err != nil {
			s.cluster = nil // never joined: nothing to leave
			return nil, fmt.Errorf("cluster: %w", err)
		}
		sender, router = s.cluster, s.cluster
	}

	svc := api.NewService(api.Config{
		Sender: sender, Reader: st, MaxBody: cfg.MaxBody, Metrics: s.metrics, Logger: log, Router: router,
	})
	s.http = api.NewServer(cfg.Listen, s.withConsole(api.NewHTTPHandler(svc, s.ready, s.metrics.Registry)))
	go func() { s.served <- s.http.Serve(s.listener) }()
	wid, _ := s.lease.WorkerID()
	log.Info("serving", "listen", s.listener.Addr().String(), "store", Redact(cfg.Store), "node_id", cfg.NodeID,
		"worker_id", wid, "cluster_listen", cfg.ClusterListen)
	ok = true
	return s, nil
}

// Addr is the API address the node listens on.
func (s *Server) Addr() string { return s.listener.Addr().String() }

// Metrics returns the node's collectors.
func (s *Server) Metrics() *metrics.Set { return s.metrics }

// ready is /readyz: the node accepts sends only with a reachable store, a
// leased worker id and (in cluster mode) a known ring.
func (s *Server) ready() error {
	if s.draining.Load() {
		return sequencer.ErrShuttingDown
	}
	if !s.lease.Ready() {
		return sequencer.ErrWorkerLeaseLost
	}
	if s.cluster != nil {
		if err := s.cluster.Ready(); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		return fmt.Errorf("%w: %v", sequencer.ErrStoreUnavailable, err)
	}
	return nil
}

// routeSingle answers Route on a single node: this node owns everything.
func (s *Server) routeSingle(ctx context.Context, convID string) (sequencer.Route, error) {
	return sequencer.Route{NodeID: s.cfg.NodeID, Address: s.Addr()}, nil
}

// Shutdown drains: /readyz turns 503; in cluster mode the node leaves the
// ring and hands its partitions off (its in-flight batches finish, new sends
// are forwarded to the new owners); the API stops taking requests and lets
// in-flight ones finish (their sends commit or fail cleanly), the actors drain
// their queues, then the worker-id lease is released and the store closed.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	var errs []error
	if s.cluster != nil {
		if err := s.cluster.Leave(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cluster leave: %w", err))
		}
	}
	if s.http != nil {
		if err := s.http.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("api: %w", err))
		}
	}
	// Only now: sends forwarded before the leave needed it for their replies.
	if s.cluster != nil {
		if err := s.cluster.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.closeAll(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Error("drain incomplete", "err", err)
		return err
	}
	s.log.Info("stopped cleanly")
	return nil
}

func (s *Server) closeAll(ctx context.Context) error {
	var errs []error
	if s.console != nil {
		s.console.Close()
	}
	if s.node != nil {
		if err := s.node.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("conversations: %w", err))
		}
	}
	if s.lease != nil {
		if err := s.lease.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("worker lease: %w", err))
		}
	}
	if s.store != nil {
		if err := s.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("store: %w", err))
		}
	}
	if s.listener != nil && s.http == nil {
		s.listener.Close()
	}
	return errors.Join(errs...)
}

// Redact hides a --store DSN's password, for logs and messages.
func Redact(store string) string {
	if !IsPostgres(store) {
		return store
	}
	u, err := url.Parse(store)
	if err != nil {
		return "postgres://(unparsable DSN)"
	}
	return u.Redacted()
}
