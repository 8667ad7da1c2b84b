// Command sequencer runs the message sequencer: `sequencer serve` runs a node,
// `sequencer migrate` applies the store's schema, `sequencer admin` runs
// operator commands (package admin), `sequencer bench` runs the separate
// sequencer-bench binary next to this one (cmd/sequencer-bench).
// It only parses configuration, builds, runs and stops; the wiring lives in
// package server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/sequencer-im/sequencer/admin"
	"github.com/sequencer-im/sequencer/buildinfo"
	"github.com/sequencer-im/sequencer/internal/conf"
	"github.com/sequencer-im/sequencer/internal/reqid"
	"github.com/sequencer-im/sequencer/persist/open"
	"github.com/sequencer-im/sequencer/server"
)

const usage = `sequencer: one writer per conversation, contiguous seqs, acks only after a durable commit.

Usage:
  sequencer serve   [flags]   run a node (embedded store under ./data by default)
  sequencer migrate [flags]   apply the store's schema migrations and exit
  sequencer admin   COMMAND   operator commands: members, partitions, head, route, shards,
                              drain, forget, migrate status, trim, backup, feed (sequencer admin --help)
  sequencer bench   [flags]   run sequencer-bench from this binary's directory (docs/BENCHMARKS.md)
  sequencer health  [flags]   exit 0 when a node's /readyz (or --url) answers 200 (container health checks)
  sequencer version           print the version, commit and Go version (also --version)
  sequencer help    [command]

Run 'sequencer COMMAND --help' for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "serve":
		err = serve(rest, stderr, getenv)
	case "migrate":
		err = migrate(rest, stdout, stderr, getenv)
	case "bench":
		err = benchCmd(rest, stdout, stderr)
	case "admin":
		err = adminCmd(rest, stdout, stderr, getenv)
	case "health":
		err = health(rest, stdout, stderr, getenv)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, buildinfo.Get())
		return 0
	case "help", "-h", "--help":
		if len(rest) > 0 {
			return run([]string{rest[0], "--help"}, stdout, stderr, getenv)
		}
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "sequencer: unknown command %q (see 'sequencer help')\n", cmd)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var code exitCode
	if errors.As(err, &code) {
		return int(code) // the child (sequencer-bench) has said why
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "sequencer %s: %v (see 'sequencer %s --help')\n", cmd, oneLine(ue.err), cmd)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "sequencer %s: %v\n", cmd, err)
		return 1
	}
	return 0
}

// serveFlags binds every server.Config field to a flag (and its environment
// variable). Every default is server.DefaultConfig()'s (TestServeFlagDefaults).
func serveFlags(fs *flag.FlagSet, c *server.Config, logLevel *string) {
	d := server.DefaultConfig()
	fs.StringVar(&c.Listen, "listen", d.Listen, "API address (Connect/gRPC/JSON, plus /healthz, /readyz, /metrics and the web console /console/ unless --admin-listen)")
	fs.StringVar(&c.Store, "store", d.Store, "PostgreSQL: a postgres:// or postgresql:// URL or a keyword DSN (host=... dbname=...); MySQL/MariaDB: mysql://user:pass@host:port/db (?socket=PATH for a unix socket); embedded store: sqlite:PATH or a path without ://; anything else is refused")
	fs.StringVar(&c.Cluster.ClusterListen, "cluster-listen", d.Cluster.ClusterListen, "inter-node address; with a PostgreSQL or MySQL store, nodes sharing the database form one cluster")
	fs.StringVar(&c.NodeID, "node-id", d.NodeID, "stable name of this node in the cluster (default: hostname plus a random suffix)")
	fs.IntVar(&c.API.MaxBody, "max-body", d.API.MaxBody, "largest accepted message body in bytes")
	fs.IntVar(&c.API.MaxBatchBytes, "max-batch-bytes", d.API.MaxBatchBytes, "largest SendBatch request in bytes (larger: invalid_argument)")
	fs.DurationVar(&c.Actors.PassivateAfter, "passivate-after", d.Actors.PassivateAfter, "stop a conversation actor after it idled this long")
	fs.IntVar(&c.Actors.Commit.Workers, "commit-workers", d.Actors.Commit.Workers, "parallel group-commit transactions (two start as soon as anything waits; each further one only when 128 messages wait)")
	fs.IntVar(&c.Actors.Commit.MaxMessages, "max-batch-messages", d.Actors.Commit.MaxMessages, "most messages in one store transaction")
	c.Actors.Commit.KeepReadPositions = d.Actors.Commit.KeepReadPositions
	fs.Var(conf.Not{B: &c.Actors.Commit.KeepReadPositions}, "send-marks-read", "a user's Send raises their own read position in the conversation to the message's seq, in the same transaction (own messages are never unread); false leaves positions to MarkRead alone")
	fs.IntVar(&c.Actors.MaxQueuePerConv, "max-queue-per-conv", d.Actors.MaxQueuePerConv, "sends queued on one conversation before resource_exhausted")
	fs.IntVar(&c.Actors.MaxPending, "max-pending", d.Actors.MaxPending, "sends queued on the node before resource_exhausted")
	fs.Int64Var(&c.Actors.MaxPendingBytes, "max-pending-bytes", d.Actors.MaxPendingBytes, "bytes of the sends queued on the node (bodies and keys) before resource_exhausted")
	fs.IntVar(&c.Actors.MaxConversations, "max-conversations", d.Actors.MaxConversations, "live conversation actors before sends to new conversations get resource_exhausted (idle ones passivate)")
	fs.DurationVar(&c.Actors.Windows.Edit, "edit-window", d.Actors.Windows.Edit, "refuse an Edit of a message sent longer ago than this with failed_precondition (0: no limit)")
	fs.DurationVar(&c.Actors.Windows.Recall, "recall-window", d.Actors.Windows.Recall, "refuse a Recall of a message sent longer ago than this with failed_precondition (0: no limit)")
	fs.IntVar(&c.Feed.MaxSubscriptions, "max-subscriptions", d.Feed.MaxSubscriptions, "conversations followed by all Subscribe streams of the node (a stream of n conversations counts n); a Subscribe past it gets resource_exhausted")
	fs.IntVar(&c.Feed.MaxQueue, "subscribe-queue", d.Feed.MaxQueue, "messages one Subscribe stream may have waiting; a subscriber that falls further behind is ended with resource_exhausted (it resumes from its last seqs)")
	fs.DurationVar(&c.Feed.Heartbeat, "subscribe-heartbeat", d.Feed.Heartbeat, "a Subscribe stream silent this long gets a heartbeat event")
	fs.DurationVar(&c.Feed.ReadTimeout, "subscribe-read-timeout", d.Feed.ReadTimeout, "a Subscribe stream whose backlog read the store has not answered after this long ends with unavailable (the subscriber resumes)")
	fs.StringVar(&c.Firehose.URL, "feed-nats", d.Firehose.URL, "publish every stored message to NATS JetStream at this URL (nats://HOST:PORT; tls:// for TLS; docs/FEED.md); a bad URL, an unreachable server or a missing stream is exit 1 at start")
	fs.StringVar(&c.Firehose.Subject, "feed-subject", d.Firehose.Subject, "firehose: subject prefix; each message goes to PREFIX.<partition>")
	fs.StringVar(&c.Firehose.Format, "feed-format", d.Firehose.Format, "firehose: payload format, proto (the Message protobuf) or json (protojson)")
	fs.BoolVar(&c.Firehose.CreateStream, "feed-create-stream", d.Firehose.CreateStream, "firehose: create the stream when none holds PREFIX.* (file storage, 2h duplicate window, 1 replica); without it a missing stream is exit 1")
	fs.StringVar(&c.Firehose.CredsFile, "feed-nats-creds", d.Firehose.CredsFile, "firehose: NATS credentials file (JWT and nkey)")
	fs.StringVar(&c.Firehose.CAFile, "feed-nats-ca", d.Firehose.CAFile, "firehose: PEM CA of the NATS server's TLS certificate")
	fs.StringVar(&c.Firehose.CertFile, "feed-nats-cert", d.Firehose.CertFile, "firehose: PEM client certificate for NATS (with --feed-nats-key)")
	fs.StringVar(&c.Firehose.KeyFile, "feed-nats-key", d.Firehose.KeyFile, "firehose: PEM private key of --feed-nats-cert")
	fs.IntVar(&c.StoreConns, "store-conns", d.StoreConns, "PostgreSQL read pool: connections for pulls, lookups and head loads")
	fs.IntVar(&c.StoreCommitConns, "store-commit-conns", d.StoreCommitConns, "PostgreSQL commit pool: connections only commits use (0: --commit-workers)")
	fs.IntVar(&c.StoreControlConns, "store-control-conns", d.StoreControlConns, "PostgreSQL control pool: connections for membership heartbeats, partition leases, the worker-id lease and the store ping behind /readyz")
	fs.DurationVar(&c.Actors.Commit.Timeout, "commit-timeout", d.Actors.Commit.Timeout, "bound on one store commit; past it the outcome is re-read from the store")
	fs.DurationVar(&c.IDs.TTL, "worker-lease-ttl", d.IDs.TTL, "lifetime of the snowflake worker-id lease without renewal")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", d.DrainTimeout, "bound on the graceful stop after SIGTERM")
	fs.StringVar(&c.Cluster.ClusterAdvertise, "cluster-advertise", d.Cluster.ClusterAdvertise, "inter-node address other nodes dial (default: the address --cluster-listen bound)")
	fs.StringVar(&c.Cluster.TLSCertFile, "cluster-tls-cert", d.Cluster.TLSCertFile, "cluster: this node's certificate (PEM) for mutual TLS between nodes (with --cluster-tls-key and --cluster-ca)")
	fs.StringVar(&c.Cluster.TLSKeyFile, "cluster-tls-key", d.Cluster.TLSKeyFile, "cluster: the private key (PEM) of --cluster-tls-cert")
	fs.StringVar(&c.Cluster.TLSCAFile, "cluster-ca", d.Cluster.TLSCAFile, "cluster: CA certificate (PEM); nodes accept and dial only peers whose certificate chains to it")
	fs.BoolVar(&c.Cluster.Insecure, "cluster-insecure", d.Cluster.Insecure, "cluster: allow a non-loopback --cluster-listen without TLS (plain HTTP/2; refused otherwise)")
	fs.DurationVar(&c.Cluster.MemberTTL, "member-ttl", d.Cluster.MemberTTL, "cluster: a node silent this long is presumed dead and its conversations move (failover time)")
	fs.DurationVar(&c.Cluster.Heartbeat, "heartbeat", d.Cluster.Heartbeat, "cluster: membership lease renewal interval (member-ttl must exceed 2x heartbeat)")
	fs.IntVar(&c.Cluster.Ring.Partitions, "partitions", d.Cluster.Ring.Partitions, "cluster: fixed partition count of the ring, the same on every node")
	fs.DurationVar(&c.Cluster.HandoffWait, "handoff-wait", d.Cluster.HandoffWait, "cluster: how long a send waits for a moving conversation before unavailable")
	fs.StringVar(logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.Pprof, "pprof", d.Pprof, "serve Go's /debug/pprof/ profiles with the health endpoints (use with --admin-listen: they are not behind the API token)")
	c.Retention = d.Retention
	fs.Var(admin.Duration{D: &c.Retention}, "retention", "delete messages older than this (90d, 36h; heads are kept, seqs never go back); 0 keeps everything")
	fs.StringVar(&c.TLSCert, "tls-cert", d.TLSCert, "PEM certificate: serve the API with TLS (HTTP/2 via ALPN and HTTP/1.1); re-read on SIGHUP")
	fs.StringVar(&c.TLSKey, "tls-key", d.TLSKey, "PEM private key of --tls-cert")
	fs.StringVar(&c.ClientCA, "client-ca", d.ClientCA, "with TLS: require API client certificates signed by this PEM CA (bundle); re-read on SIGHUP")
	fs.StringVar(&c.AuthTokenFile, "auth-token-file", d.AuthTokenFile, "bearer tokens, one per line (# comments): every API RPC then needs Authorization: Bearer <token>; re-read on SIGHUP")
	fs.StringVar(&c.AdminListen, "admin-listen", d.AdminListen, "address for /healthz, /readyz, /metrics and the web console /console/ (they then leave --listen)")
	c.CORSOrigins = d.CORSOrigins
	fs.BoolVar(&c.RedirectToOwner, "redirect-to-owner", d.RedirectToOwner, "answer a plain Connect Send (JSON or binary POST) that this node cannot forward, because the owner is out of its reach over the cluster link, with HTTP 307 to the owner's API address (--redirect-to-owner=false: the 503/504 error only)")
	fs.Var(listFlag{&c.CORSOrigins}, "cors-origins", "comma-separated browser origins allowed to call the API (CORS), e.g. https://app.example.com")
}

func serve(args []string, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := server.DefaultConfig() // the fields without a flag keep their default
	var level string
	serveFlags(fs, &cfg, &level)
	format := fs.String("log-format", "text", "text (key=value lines) or json (one JSON object per line)")
	fs.Usage = usageWithEnv(fs, "sequencer serve [flags]: run a node")
	if err := parseWithEnv(fs, args, getenv); err != nil {
		return err
	}
	logger, err := newLogger(stderr, level, *format)
	if err != nil {
		return usageError{err}
	}
	// As given: a flag set to 0 is an error, not its default. An empty
	// --node-id is generated in server.Run.
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	tp, shutdownTracing, err := newTracerProvider(context.Background(), getenv)
	if err != nil {
		return usageError{err}
	}
	if tp != nil {
		cfg.TracerProvider = tp
		logger.Info("tracing: exporting spans over OTLP/HTTP (OTEL_EXPORTER_OTLP_* environment)")
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(ctx); err != nil {
			logger.Warn("tracing: spans not flushed at exit", "err", err)
		}
	}()
	if getenv("GOGC") == "" {
		debug.SetGCPercent(serveGCPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return server.Run(ctx, cfg, logger)
}

// serveGCPercent is the garbage collector's target for `serve` unless GOGC
// is set: the node's live heap is small (tens of MB for tens of thousands of
// live conversations) and its allocation rate high (one request's worth per
// message), so the default 100 spent about a fifth of the server's CPU in
// GC. Measured (docs/BENCHMARKS.md): 400 cut the server's CPU per message on
// JSON unary sends by about 20%. GOMEMLIMIT bounds the heap where memory is
// tight; GOGC overrides this.
const serveGCPercent = 400

func migrate(args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	store := fs.String("store", server.DefaultConfig().Store, "postgres://... DSN, mysql://... URL, or a file path / sqlite:PATH for the embedded store; "+
		"on Citus (a coordinator's database) the first migrate creates the distributed schema with the session's citus.shard_count: "+
		"set it in the DSN, ?options=-c%20citus.shard_count%3DN (docs/CITUS.md)")
	fs.Usage = usageWithEnv(fs, "sequencer migrate [flags]: apply the store's schema migrations and exit")
	if err := parseWithEnv(fs, args, getenv); err != nil {
		return err
	}
	if _, err := open.Parse(*store); err != nil {
		return usageError{err}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := open.Store(ctx, *store, open.Options{})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "migrated %s\n", server.Redact(*store))
	return s.Close()
}

// oneLine joins a multi-line error (errors.Join) with "; ".
func oneLine(err error) string {
	return strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l}
	// reqid.Handler: records logged with an API request's context carry
	// its request_id (the X-Request-Id the client got).
	switch format {
	case "text":
		return slog.New(reqid.Handler(slog.NewTextHandler(w, opts))), nil
	case "json":
		return slog.New(reqid.Handler(slog.NewJSONHandler(w, opts))), nil
	}
	return nil, fmt.Errorf("log-format %q: want text or json", format)
}
