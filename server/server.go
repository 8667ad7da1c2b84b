// Package server wires one sequencer node together: the store, the worker-id
// lease and msg_id generator, the conversation actors with their group-commit
// writer, the RPC API (with TLS, bearer tokens, CORS, gRPC reflection and
// gRPC health) and the health, readiness and metrics endpoints (on the API
// port or --admin-listen), the
// reload of the API's secrets on SIGHUP, a watch that logs store outages and
// a lost lease, and (in cluster mode) membership, fenced partition ownership
// and forwarding. It owns the order of start and of the graceful stop; it
// implements no sequencing, storage or transport logic of its own.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/api"
	"github.com/sequencer-im/sequencer/cluster"
	"github.com/sequencer-im/sequencer/console"
	"github.com/sequencer-im/sequencer/feed"
	"github.com/sequencer-im/sequencer/idgen"
	"github.com/sequencer-im/sequencer/internal/netbuf"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/open"
)

var (
	_ api.Sender = (*actor.Conversations)(nil)
	_ api.Sender = (*cluster.Node)(nil)
	_ api.Router = (*cluster.Node)(nil)
	_ api.Reader = persist.Store(nil)
)

// Server is a running node.
type Server struct {
	cfg       Config
	log       *slog.Logger
	metrics   *metrics.Set
	store     persist.Store
	ping      func(context.Context) error // store.Ping, one at a time (sharedPing)
	lease     *idgen.Issuer
	node      *actor.Conversations
	cluster   *cluster.Node     // nil on a single node
	feed      *feed.Hub         // the change feed's fan-out
	peerFeed  *cluster.PeerFeed // the feed's upstream in cluster mode (nil on a single node)
	fire      *firehoseRun      // the firehose to NATS JetStream; nil without --feed-nats
	console   *console.Console
	sends     *console.SendCounter // the API's sends per conversation, for the console
	http      *http.Server
	listener  net.Listener
	admin     *http.Server // nil without AdminListen
	adminLn   net.Listener
	edge      *edge
	stopWatch func()
	// lastPing is the watch's last store ping (nil before the first): what
	// sequencer_ready reads, so that a scrape never waits on the store.
	lastPing  atomic.Pointer[pingResult]
	stopClock func() // stops the test clock's file reader (testClock)
	served    chan error
	draining  atomic.Bool
	health    *api.Health        // grpc.health.v1 on the API port
	stopTrim  context.CancelFunc // nil without --retention
	trimDone  chan struct{}
}

// Run starts a node and serves until ctx ends or (cluster mode) an operator
// requests a drain of this node through the membership table, then drains
// (see Shutdown) within cfg.DrainTimeout.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	s, err := Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	var drain, superseded <-chan struct{} // nil on a single node: never ready
	if s.cluster != nil {
		drain, superseded = s.cluster.DrainRequested(), s.cluster.Superseded()
	}
	var exitErr error
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-drain:
			log.Info("drain requested by an operator (sequencer admin drain): stopping as on SIGTERM")
			break wait
		case <-superseded:
			exitErr = errors.New("another process took this node id (--node-id): stopped serving")
			log.Error("superseded: another live process runs with this --node-id; exiting", "node_id", s.cfg.NodeID)
			break wait
		case <-hup:
			s.Reload()
		case err := <-s.served:
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("api server stopped", "err", err)
			}
			break wait
		}
	}
	log.Info("draining", "timeout", s.cfg.DrainTimeout)
	dctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer cancel()
	return errors.Join(exitErr, s.Shutdown(dctx))
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
	s := &Server{cfg: cfg, log: log, metrics: metrics.New(), served: make(chan error, 2)} // API and admin servers
	var err error
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

	s.edge, err = newEdge(cfg)
	if err != nil {
		return nil, err
	}
	tlsConf, err := s.edge.tlsConfig()
	if err != nil {
		return nil, err
	}

	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sopts := cfg.storeOptions(s.log)
	sopts.Citus.NoLeaseCheck = testNoLeaseCheck(log)
	st, err := open.Store(octx, cfg.Store, sopts)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	s.store = st
	s.ping = sharedPing(st.Ping)
	if err := checkNotACluster(octx, cfg, st); err != nil {
		return nil, err
	}
	if s.fire, err = s.openFirehose(octx, st); err != nil {
		return nil, err
	}
	clk, stopClock := testClock(log) // nil: the real clock
	s.stopClock = stopClock

	lcfg := cfg.issuerConfig()
	lcfg.Metrics, lcfg.Clock = s.metrics, clk
	s.lease, err = idgen.NewIssuer(st, lcfg)
	if err != nil {
		return nil, err
	}
	if err := startLease(octx, s.lease, log); err != nil {
		return nil, err
	}

	// The API address is bound first: in cluster mode Route answers it.
	s.listener, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	if cfg.AdminListen != "" {
		s.adminLn, err = net.Listen("tcp", cfg.AdminListen)
		if err != nil {
			return nil, fmt.Errorf("admin-listen %s: %w", cfg.AdminListen, err)
		}
	}

	acfg := cfg.Actors
	acfg.Store, acfg.IDs, acfg.Metrics, acfg.Logger, acfg.Clock = st, s.lease, s.metrics, log, clk
	// The change feed: the conversation actors publish what they
	// committed into the hub, Subscribe streams from it (package feed).
	fcfg := cfg.Feed
	fcfg.KeepReadPositions = cfg.Actors.Commit.KeepReadPositions // one flag, --send-marks-read
	s.feed = feed.NewHub(fcfg, nil)
	acfg.Feed = s.feed
	if s.fire != nil {
		// The firehose: every commit records its conversation in the
		// store's outbox; the live batches spare it a store read.
		acfg.Feed = tee{s.feed, s.fire.pub}
		acfg.OutboxPartitions = cfg.Cluster.Ring.Partitions
	}
	var sender api.Sender
	var router api.Router = api.RouterFunc(s.routeSingle)
	if cfg.clustered() {
		table, ok := st.(membership.Provider)
		if !ok {
			return nil, fmt.Errorf("cluster mode needs a PostgreSQL store")
		}
		ccfg := cfg.clusterConfig()
		ccfg.Store, ccfg.APIAddr, ccfg.Logger, ccfg.Metrics, ccfg.Clock = table.Membership(), s.Addr(), log, s.metrics, clk
		ccfg.Feed = s.feed
		// A node that stepped down rejoins once it can issue msg_ids;
		// the cluster kicks the issuer when the store answers again.
		ccfg.IDs = s.lease
		s.cluster, err = cluster.New(ccfg)
		if err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		// Commits carry the partition fence (actor.Ownership); a commit
		// refused for a stale fence makes the node step down.
		acfg.Ownership = s.cluster
	}
	s.node, err = actor.NewConversations(acfg)
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
		// Live messages of conversations other nodes commit: one Feed
		// stream per peer (cluster/feed.go).
		if up := cluster.NewPeerFeed(s.cluster, s.feed); up != nil {
			s.feed.SetUpstream(up)
			s.peerFeed = up
		}
	}
	if s.fire != nil {
		s.fire.start(s.cluster, s.metrics) // every partition without a cluster
	}
	s.metrics.SetReadiness(s.readinessLastPing) // sequencer_ready: what /readyz answers, from the watch's last store ping
	s.registerGauges()

	scfg := cfg.apiConfig()
	s.sends = console.NewSendCounter()
	scfg.Sender, scfg.Reader, scfg.Router, scfg.Metrics, scfg.Logger = s.sends.Wrap(sender), st, router, s.metrics, log
	// Read positions are served from this node's store for any
	// conversation, never forwarded: they need no single writer (api.ReadPositions).
	scfg.Positions = st
	scfg.Feed = s.feed
	svc := api.NewService(scfg)
	apiEdge := api.Edge{Tokens: s.edge.tokens, CORSOrigins: cfg.CORSOrigins, RedirectToOwner: cfg.RedirectToOwner}
	apiMux := api.NewAPIMux(svc, apiEdge)
	s.health = api.NewHealth(s.readiness)
	api.MountGRPCTools(apiMux, svc, s.health, apiEdge)
	adminMux := api.NewAdminMux(s.readiness, s.metrics.Registry, log)
	adminMux.Handle("/console/", s.startConsole())
	if s.fire != nil {
		s.console.ServeFirehose(s.fire.consoleState)
	}
	if cfg.Pprof {
		adminMux.HandleFunc("/debug/pprof/", pprof.Index)
		adminMux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		adminMux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		adminMux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		adminMux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	if s.adminLn == nil {
		apiMux.Handle("/", adminMux)
	} else {
		s.admin = api.NewServer(cfg.AdminListen, adminMux)
		s.admin.ErrorLog = httpErrorLog(log, "admin")
		go func() { s.served <- s.admin.Serve(s.adminLn) }()
	}
	s.http = api.NewServer(cfg.Listen, apiMux)
	s.http.ErrorLog = httpErrorLog(log, "api")
	s.http.RegisterOnShutdown(s.feed.Close) // Subscribe streams end (unavailable) so the drain can finish
	if tlsConf != nil {
		s.http.TLSConfig = tlsConf
		go func() { s.served <- s.http.ServeTLS(netbuf.Yielding(s.listener), "", "") }()
	} else {
		go func() { s.served <- s.http.Serve(netbuf.Listener(s.listener)) }()
	}
	s.stopWatch = s.startWatch(watchInterval)
	if cfg.Retention > 0 {
		tctx, stop := context.WithCancel(context.Background())
		s.stopTrim, s.trimDone = stop, make(chan struct{})
		go s.retain(tctx)
	}
	wid, _ := s.lease.WorkerID()
	log.Info("serving", "listen", s.listener.Addr().String(), "tls", tlsConf != nil,
		"client_certs", tlsConf != nil && tlsConf.ClientCAs != nil, "auth_tokens", s.edge.tokens != nil,
		"admin_listen", s.AdminAddr(), "store", Redact(cfg.Store), "node_id", cfg.NodeID,
		"worker_id", wid, "cluster_listen", cfg.Cluster.ClusterListen)
	ok = true
	return s, nil
}

// checkNotACluster refuses a node without --cluster-listen on a database
// whose membership table has live members: it would own every conversation
// by its own Route and /readyz while every commit it made was fenced by the
// cluster's partition leases.
func checkNotACluster(ctx context.Context, cfg Config, st persist.Store) error {
	table, ok := st.(membership.Provider)
	if cfg.clustered() || !ok {
		return nil
	}
	v, err := table.Membership().View(ctx)
	if err != nil || len(v.Members) == 0 {
		return nil // no cluster here (a store without the table answers an error)
	}
	ids := make([]string, 0, len(v.Members))
	for _, m := range v.Members {
		ids = append(ids, m.NodeID)
	}
	return fmt.Errorf("this database serves a cluster of %d live member(s) (%s): start this node with --cluster-listen (and its own --node-id) to join it, or give it a database of its own",
		len(v.Members), strings.Join(ids, ", "))
}

// storeOptions are the store settings of a node: pools of StoreConns
// reads, StoreCommitConns commits (0: one per commit worker) and
// StoreControlConns control connections; the embedded store's lock names
// the node; bodies up to the API's MaxBody; log gets the store's notices
// (Citus: "distributed: N workers, M shards").
func (cfg Config) storeOptions(log *slog.Logger) open.Options {
	commits := cfg.StoreCommitConns
	if commits <= 0 {
		commits = cfg.Actors.Commit.Workers
	}
	return open.Options{
		Pools:    open.Pools{Read: cfg.StoreConns, Commit: commits, Control: cfg.StoreControlConns},
		MaxBody:  cfg.API.MaxBody,
		Logger:   log,
		Embedded: open.Embedded{LockHolder: cfg.NodeID},
	}
}

// registerGauges registers the gauges read on every scrape: pending sends
// and bytes against their limits, the group-commit queue, the PostgreSQL
// pools, the change feed and (in cluster mode) its peer links, the
// heartbeat age and the partitions moving.
func (s *Server) registerGauges() {
	s.metrics.Pending(func() (int64, int64, int64, int64) {
		l := s.node.Stats()
		return l.Pending, l.MaxPending, l.PendingBytes, l.MaxPendingBytes
	})
	s.metrics.CommitQueue(func() int { return s.node.Stats().CommitQueue })
	if pools, ok := s.store.(persist.PoolReporter); ok {
		for _, name := range pools.StorePools() {
			s.metrics.StorePool(name, func() metrics.PoolStat { return metrics.PoolStat(pools.StorePool(name)) })
		}
	}
	if r, ok := s.store.(persist.RetryCounter); ok {
		s.metrics.StoreRetries(r.Retries)
	}
	s.metrics.Feed(func() metrics.FeedStat {
		t := s.feed.Totals()
		return metrics.FeedStat{Streams: t.Streams, Follows: t.Follows, Conversations: t.Conversations, Taps: t.Taps,
			Delivered: t.Delivered, Heartbeats: t.Heartbeats, Cut: t.Cut, Refused: t.Refused,
			BacklogReads: t.BacklogReads, BacklogMessages: t.BacklogMsgs, TapsCut: t.TapsCut}
	})
	if s.peerFeed != nil {
		s.metrics.PeerFeed(s.peerFeed.State)
	}
	if c := s.cluster; c != nil {
		s.metrics.ClusterState(
			func() float64 { return time.Since(c.Snapshot().ReadAt).Seconds() },
			func() int { return c.Snapshot().Moving() })
	}
}

// Addr is the API address the node listens on.
func (s *Server) Addr() string { return s.listener.Addr().String() }

// AdminAddr is the address of /healthz, /readyz and /metrics: the admin
// listener's with AdminListen, else the API's.
func (s *Server) AdminAddr() string {
	if s.adminLn != nil {
		return s.adminLn.Addr().String()
	}
	return s.Addr()
}

// Reload re-reads the API's TLS certificate, client CAs and bearer tokens
// (Run calls it on SIGHUP). A file that fails to load keeps what it held in
// force; the error is logged at ERROR and returned.
func (s *Server) Reload() error {
	err := s.edge.reload()
	if err != nil {
		s.log.Error("reload failed: what could not be read stays as it was", "err", err)
		return err
	}
	s.log.Info("reloaded the API's TLS certificate, client CAs and tokens")
	return nil
}

// Metrics returns the node's collectors.
func (s *Server) Metrics() *metrics.Set { return s.metrics }

// startLease starts the worker-id lease. When the store answered the open
// but not the lease in time (a store under load, a link that just came
// back), the lease's loop retries, and until it holds a lease the node
// serves not ready, as when it loses the lease later: the start goes on. A
// refusal (disk full, a bad store) still stops it.
func startLease(ctx context.Context, l interface{ Start(context.Context) error }, log *slog.Logger) error {
	err := l.Start(ctx)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sequencer.ErrStoreUnavailable) {
		return fmt.Errorf("worker-id lease: %w", err)
	}
	log.Warn("worker-id lease not taken at start: retrying; not ready until it is", "err", err)
	return nil
}

// readiness is /readyz: the node accepts sends only with a reachable store, a
// leased worker id with a clock that can issue under it (not stepped back
// behind the ids already issued) and (in cluster mode) a known ring. The
// store is asked first: when it is down (or full) the lease and the
// membership fail too, and the store is what to fix.
func (s *Server) readiness() error {
	return s.readinessWith(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return s.ping(ctx)
	})
}

// pingResult is one store ping's outcome.
type pingResult struct{ err error }

// readinessLastPing is readiness with the store's answer taken from the
// watch's last ping (every watchInterval) instead of a ping of its own: the
// sequencer_ready gauge, evaluated on every scrape (and by the console),
// must not wait on a store that does not answer (a blackholed store held
// each scrape 2 s, the ping's bound). Before the watch's first ping the
// store counts as reachable: the node opened it just before.
func (s *Server) readinessLastPing() error {
	return s.readinessWith(func() error {
		if r := s.lastPing.Load(); r != nil {
			return r.err
		}
		return nil
	})
}

// readinessWith is readiness with ping as the store's answer.
func (s *Server) readinessWith(ping func() error) error {
	if s.draining.Load() {
		return sequencer.ErrShuttingDown
	}
	if err := ping(); err != nil {
		var se *sequencer.Error
		if errors.As(err, &se) {
			return err // the store's own reason, e.g. "store out of disk space"
		}
		return fmt.Errorf("%w: %v", sequencer.ErrStoreUnavailable, err)
	}
	if err := s.lease.Issuable(); err != nil {
		return err // worker id lease not held, or clock moved backwards
	}
	if s.cluster != nil {
		if err := s.cluster.Serving(); err != nil {
			return sequencer.Wrap(sequencer.CodeUnavailable, err, "cluster membership not ready")
		}
	}
	return nil
}

// routeSingle answers Route on a single node: this node owns everything.
func (s *Server) routeSingle(ctx context.Context, convID string) (sequencer.Route, error) {
	return sequencer.Route{NodeID: s.cfg.NodeID, Address: s.Addr()}, nil
}

// Shutdown drains: /readyz turns 503 and gRPC health NOT_SERVING; in
// cluster mode the node leaves the ring and hands its partitions off (its in-flight batches finish, new sends
// are forwarded to the new owners); the API stops taking requests and lets
// in-flight ones finish (their sends commit or fail cleanly), the actors drain
// their queues, then the worker-id lease is released and the store closed.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	if s.health != nil {
		s.health.Drain() // open grpc.health.v1 Watch streams: NOT_SERVING, then end
	}
	s.stopRetention()
	if s.stopWatch != nil {
		s.stopWatch()
	}
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
	if s.admin != nil {
		if err := s.admin.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("admin: %w", err))
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
	s.fire.close() // after the last commit: it stores the cursors it owes
	s.fire = nil
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
	if s.adminLn != nil && s.admin == nil {
		s.adminLn.Close()
	}
	if s.stopClock != nil {
		s.stopClock()
		s.stopClock = nil
	}
	return errors.Join(errs...)
}

// retain runs the retention passes until ctx ends: the first after a random
// wait of up to a tenth of RetentionEvery (at most 30s), so nodes started
// together do not trim at once, then every RetentionEvery +-10%. Every node
// of a cluster with --retention runs its own passes over all conversations;
// a pass is idempotent, so a second node's pass only reads.
func (s *Server) retain(ctx context.Context) {
	defer close(s.trimDone)
	every := s.cfg.RetentionEvery
	wait := rand.N(min(every/10, 30*time.Second) + 1)
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		before := time.Now().Add(-s.cfg.Retention)
		start := time.Now()
		n, err := persist.TrimAll(ctx, s.store, before, 0, func(n int) { s.metrics.Trimmed.Add(float64(n)) })
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.log.Warn("retention pass failed; the next pass finishes it", "before", before, "deleted", n, "err", err)
		default:
			s.log.Info("retention pass", "before", before, "deleted", n, "took", time.Since(start).Round(time.Millisecond))
		}
		wait = every - every/10 + rand.N(every/5+1)
	}
}

// stopRetention stops the retention loop and waits for it.
func (s *Server) stopRetention() {
	if s.stopTrim != nil {
		s.stopTrim()
		<-s.trimDone
		s.stopTrim = nil
	}
}

// Redact hides a --store DSN's password (every form: URL userinfo, URL
// query, keyword password=), for logs and messages.
func Redact(store string) string { return open.Redact(store) }
