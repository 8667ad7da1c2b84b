// Command sequencer runs the message sequencer: `sequencer serve` runs a node,
// `sequencer migrate` applies the store's schema, `sequencer bench` measures.
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
	"syscall"
	"time"

	"github.com/sequencer-im/sequencer/persist/open"
	"github.com/sequencer-im/sequencer/server"
)

const usage = `sequencer: one writer per conversation, contiguous seqs, acks only after a durable commit.

Usage:
  sequencer serve   [flags]   run a node (embedded store under ./data by default)
  sequencer migrate [flags]   apply the store's schema migrations and exit
  sequencer bench   [flags]   run the benchmarks (see docs/BENCHMARKS.md)
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
	case "help", "-h", "--help":
		if len(rest) > 0 {
			return run([]string{rest[0], "--help"}, stdout, stderr, getenv)
		}
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "sequencer: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "sequencer %s: %v\n", cmd, err)
		return 1
	}
	return 0
}

// serveFlags binds every server.Config field to a flag (and its environment
// variable). Defaults shown are server.Config's.
func serveFlags(fs *flag.FlagSet, c *server.Config, logLevel *string) {
	d := server.Config{NodeID: "x"}.WithDefaults()
	fs.StringVar(&c.Listen, "listen", d.Listen, "API address (Connect/gRPC/JSON, plus /healthz, /readyz, /metrics)")
	fs.StringVar(&c.Store, "store", d.Store, "postgres://... DSN for PostgreSQL, or a file path / sqlite:PATH for the embedded store")
	fs.StringVar(&c.ClusterListen, "cluster-listen", "", "inter-node address; with a PostgreSQL store, nodes sharing the database form one cluster")
	fs.StringVar(&c.NodeID, "node-id", "", "stable name of this node in the cluster (default: hostname plus a random suffix)")
	fs.IntVar(&c.MaxBody, "max-body", d.MaxBody, "largest accepted message body in bytes")
	fs.DurationVar(&c.PassivateAfter, "passivate-after", d.PassivateAfter, "stop a conversation actor after it idled this long")
	fs.IntVar(&c.CommitWorkers, "commit-workers", d.CommitWorkers, "parallel group-commit transactions")
	fs.IntVar(&c.MaxBatchMessages, "max-batch-messages", d.MaxBatchMessages, "most messages in one store transaction")
	fs.IntVar(&c.MaxQueuePerConv, "max-queue-per-conv", d.MaxQueuePerConv, "sends queued on one conversation before resource_exhausted")
	fs.IntVar(&c.MaxPending, "max-pending", d.MaxPending, "sends queued on the node before resource_exhausted")
	fs.DurationVar(&c.CommitTimeout, "commit-timeout", d.CommitTimeout, "bound on one store commit; past it the outcome is re-read from the store")
	fs.DurationVar(&c.WorkerLeaseTTL, "worker-lease-ttl", d.WorkerLeaseTTL, "lifetime of the snowflake worker-id lease without renewal")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", d.DrainTimeout, "bound on the graceful stop after SIGTERM")
	fs.StringVar(&c.ClusterAdvertise, "cluster-advertise", "", "inter-node address other nodes dial (default: the address --cluster-listen bound)")
	fs.StringVar(&c.ClusterTLSCert, "cluster-tls-cert", "", "cluster: this node's certificate (PEM) for mutual TLS between nodes (with --cluster-tls-key and --cluster-ca)")
	fs.StringVar(&c.ClusterTLSKey, "cluster-tls-key", "", "cluster: the private key (PEM) of --cluster-tls-cert")
	fs.StringVar(&c.ClusterCA, "cluster-ca", "", "cluster: CA certificate (PEM); nodes accept and dial only peers whose certificate chains to it")
	fs.BoolVar(&c.ClusterInsecure, "cluster-insecure", false, "cluster: allow a non-loopback --cluster-listen without TLS (plain HTTP/2; refused otherwise)")
	fs.DurationVar(&c.MemberTTL, "member-ttl", d.MemberTTL, "cluster: a node silent this long is presumed dead and its conversations move (failover time)")
	fs.DurationVar(&c.Heartbeat, "heartbeat", d.Heartbeat, "cluster: membership lease renewal interval (member-ttl must exceed 2x heartbeat)")
	fs.IntVar(&c.Partitions, "partitions", d.Partitions, "cluster: fixed partition count of the ring, the same on every node")
	fs.DurationVar(&c.HandoffWait, "handoff-wait", d.HandoffWait, "cluster: how long a send waits for a moving conversation before unavailable")
	fs.StringVar(logLevel, "log-level", "info", "debug, info, warn or error")
}

func serve(args []string, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg server.Config
	var level string
	serveFlags(fs, &cfg, &level)
	fs.Usage = usageWithEnv(fs, "sequencer serve [flags]: run a node")
	if err := parseWithEnv(fs, args, getenv); err != nil {
		return err
	}
	logger, err := newLogger(stderr, level)
	if err != nil {
		return err
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return server.Run(ctx, cfg, logger)
}

func migrate(args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	store := fs.String("store", "./data", "postgres://... DSN, or a file path / sqlite:PATH for the embedded store")
	fs.Usage = usageWithEnv(fs, "sequencer migrate [flags]: apply the store's schema migrations and exit")
	if err := parseWithEnv(fs, args, getenv); err != nil {
		return err
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

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log-level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
