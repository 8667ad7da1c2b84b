package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/api"
	"github.com/sequencer-im/sequencer/cluster"
	"github.com/sequencer-im/sequencer/persist/open"
)

// Config is everything a node needs. The zero value of every field means its
// documented default (applied by WithDefaults); cmd/sequencer fills it from
// flags and SEQUENCER_* environment variables.
type Config struct {
	// Listen is the API address: Connect, gRPC, gRPC-Web and JSON, plus
	// /healthz, /readyz and /metrics unless AdminListen is set. Default
	// 127.0.0.1:7070.
	Listen string
	// Store is a postgres:// or postgresql:// URL or a libpq keyword DSN for
	// PostgreSQL, or sqlite:PATH / a path without "://" for the embedded
	// store (the allow-list of persist/open.Parse; anything else is refused).
	// Default ./data (embedded, ./data/sequencer.db).
	Store string
	// ClusterListen is the inter-node address; empty runs a single node.
	ClusterListen string
	// NodeID names this node in the cluster and holds its leases. Default:
	// hostname plus a random suffix (a new name per start).
	NodeID string

	// MaxBody is the largest accepted body in bytes. Default 65536.
	MaxBody int
	// Pprof serves Go's /debug/pprof/ handlers on the admin mux (with
	// /healthz and /metrics). Default off.
	Pprof bool
	// MaxBatchBytes is the largest SendBatch request (its protobuf size) in
	// bytes; larger ones are invalid_argument. Default 4 MiB.
	MaxBatchBytes int
	// PassivateAfter stops a conversation actor idle this long. Default 30s.
	PassivateAfter time.Duration
	// CommitWorkers is the number of parallel group-commit transactions. Default 4.
	CommitWorkers int
	// MaxBatchMessages bounds the messages of one store transaction. Default 4000.
	MaxBatchMessages int
	// MaxQueuePerConv bounds the sends queued on one conversation. Default 4096.
	MaxQueuePerConv int
	// MaxPending bounds the sends queued on the node. Default 65536.
	MaxPending int
	// MaxPendingBytes bounds the bytes of the sends queued on the node
	// (bodies and keys). Default 256 MiB.
	MaxPendingBytes int
	// MaxConversations bounds the live conversation actors. Default
	// 1,000,000.
	MaxConversations int
	// StoreConns is the size of the PostgreSQL read pool (pulls, lookups,
	// head loads, retention). Default 8.
	StoreConns int
	// StoreCommitConns is the size of the PostgreSQL commit pool, used by
	// commits only, so reads never delay them. 0 (the default) means
	// CommitWorkers.
	StoreCommitConns int
	// StoreControlConns is the size of the PostgreSQL control pool: cluster
	// membership heartbeats and partition leases, the worker-id lease, so
	// that reads and commits cannot starve them. 0 (the default) means 2.
	StoreControlConns int
	// CommitTimeout bounds one store commit; past it the outcome is unknown
	// and the conversation re-reads the store. Default 5s.
	CommitTimeout time.Duration
	// WorkerLeaseTTL is how long the snowflake worker-id lease lives without
	// renewal. Default 10s.
	WorkerLeaseTTL time.Duration
	// DrainTimeout bounds the graceful stop on SIGTERM. Default 30s.
	DrainTimeout time.Duration

	// API security (docs/SECURITY.md).

	// TLSCert and TLSKey are PEM files: when set (both), the API is served
	// with TLS (HTTP/2 via ALPN, and HTTP/1.1) instead of cleartext. They
	// are re-read on SIGHUP (Server.Reload).
	TLSCert, TLSKey string
	// ClientCA is a PEM file of CA certificates: with TLS, every API client
	// must present a certificate signed by one of them. Re-read on SIGHUP.
	ClientCA string
	// AuthTokenFile holds the bearer tokens the API accepts, one per line
	// ('#' comments); when set, every RPC needs "Authorization: Bearer
	// <token>". Re-read on SIGHUP; a bad file keeps the previous tokens.
	AuthTokenFile string
	// AdminListen, when set, serves /healthz, /readyz and /metrics on this
	// address instead of Listen.
	AdminListen string
	// CORSOrigins are the browser origins allowed to call the API
	// (comma-separated on the command line). Default none.
	CORSOrigins []string

	// Cluster mode only (ClusterListen set).

	// ClusterAdvertise is the inter-node address other nodes dial. Default:
	// the address ClusterListen bound (set it when listening on 0.0.0.0).
	ClusterAdvertise string
	// MemberTTL is how long a node's membership lease lives without a
	// heartbeat; a crashed node's conversations move after about this long.
	// Default 5s. Must exceed 2*Heartbeat.
	MemberTTL time.Duration
	// Heartbeat is the membership lease renewal interval. Default 250ms.
	Heartbeat time.Duration
	// Partitions is the fixed partition count of the ring; every node of a
	// cluster must use the same value. Default 271.
	Partitions int
	// HandoffWait bounds how long a send waits for a moving conversation to
	// become writable before it fails with unavailable. Default 2s.
	HandoffWait time.Duration
	// ClusterTLSCert, ClusterTLSKey and ClusterCA (PEM files): mutual TLS
	// between nodes; a node accepts and dials only peers whose certificate
	// chains to ClusterCA. All three or none.
	ClusterTLSCert, ClusterTLSKey, ClusterCA string
	// ClusterInsecure allows a non-loopback ClusterListen without TLS
	// (refused otherwise).
	ClusterInsecure bool

	// Retention, when > 0, makes the node delete messages whose server_at
	// is older than now-Retention (persist.TrimAll; heads are kept), once
	// shortly after start and then every RetentionEvery. 0 keeps
	// everything. At least one hour.
	Retention time.Duration
	// RetentionEvery is the time between retention passes (jittered by
	// +-10%). Default 1h.
	RetentionEvery time.Duration

	// TracerProvider, when set, traces the API's RPCs and the forwards
	// between nodes (OpenTelemetry; `sequencer serve` sets it from the
	// OTEL_* environment). nil: no tracing. Not a flag.
	TracerProvider trace.TracerProvider
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	defDur := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	def(&c.Listen, "127.0.0.1:7070")
	def(&c.Store, "./data")
	if c.NodeID == "" {
		c.NodeID = generatedNodeID()
	}
	defInt(&c.MaxBody, sequencer.DefaultMaxBody)
	defInt(&c.MaxBatchBytes, api.DefaultMaxBatchBytes)
	defDur(&c.PassivateAfter, 30*time.Second)
	defInt(&c.CommitWorkers, 4)
	defInt(&c.MaxBatchMessages, 4000)
	defInt(&c.MaxQueuePerConv, 4096)
	defInt(&c.MaxPending, actor.DefaultMaxPending)
	defInt(&c.MaxPendingBytes, actor.DefaultMaxPendingBytes)
	defInt(&c.MaxConversations, actor.DefaultMaxConversations)
	defInt(&c.StoreConns, 8)
	defDur(&c.CommitTimeout, 5*time.Second)
	defDur(&c.WorkerLeaseTTL, 10*time.Second)
	defDur(&c.DrainTimeout, 30*time.Second)
	defDur(&c.MemberTTL, cluster.DefaultMemberTTL)
	defDur(&c.Heartbeat, cluster.DefaultHeartbeat)
	defInt(&c.Partitions, 271)
	defDur(&c.HandoffWait, 2*time.Second)
	defDur(&c.RetentionEvery, time.Hour)
	return c
}

// Validate reports the first field that makes no sense.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen %q: %w", c.Listen, err))
	}
	if _, err := open.Parse(c.Store); err != nil {
		errs = append(errs, err)
	}
	if c.AdminListen != "" {
		if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
			errs = append(errs, fmt.Errorf("admin-listen %q: %w", c.AdminListen, err))
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("tls-cert and tls-key go together"))
	}
	if c.ClientCA != "" && c.TLSCert == "" {
		errs = append(errs, errors.New("client-ca needs tls-cert and tls-key (client certificates are checked in the TLS handshake)"))
	}
	for _, o := range c.CORSOrigins {
		if o != "*" && !strings.HasPrefix(o, "http://") && !strings.HasPrefix(o, "https://") {
			errs = append(errs, fmt.Errorf("cors-origins %q: want an origin like https://app.example.com, or *", o))
		}
	}
	if c.ClusterListen != "" {
		if _, _, err := net.SplitHostPort(c.ClusterListen); err != nil {
			errs = append(errs, fmt.Errorf("cluster-listen %q: %w", c.ClusterListen, err))
		}
		tlsSet := c.ClusterTLSCert != "" || c.ClusterTLSKey != "" || c.ClusterCA != ""
		switch {
		case tlsSet && (c.ClusterTLSCert == "" || c.ClusterTLSKey == "" || c.ClusterCA == ""):
			errs = append(errs, errors.New("cluster-tls-cert, cluster-tls-key and cluster-ca go together"))
		case !tlsSet && !c.ClusterInsecure && !cluster.IsLoopback(c.ClusterListen):
			errs = append(errs, fmt.Errorf("cluster-listen %s is not a loopback address: mutual TLS between nodes needs --cluster-tls-cert, --cluster-tls-key and --cluster-ca (or --cluster-insecure to allow plain HTTP/2)", c.ClusterListen))
		}
		if !IsPostgres(c.Store) {
			errs = append(errs, errors.New("cluster-listen needs a PostgreSQL store (--store postgres://...): nodes meet in the shared database"))
		}
	}
	if len(c.NodeID) == 0 || len(c.NodeID) > 64 {
		errs = append(errs, fmt.Errorf("node-id must be 1..64 bytes"))
	}
	if c.MaxBody < 1 || c.MaxBody > 64<<20 {
		errs = append(errs, fmt.Errorf("max-body %d: must be 1..67108864", c.MaxBody))
	}
	if c.MaxBatchBytes < 1<<10 || c.MaxBatchBytes > 64<<20 {
		errs = append(errs, fmt.Errorf("max-batch-bytes %d: must be 1024..67108864", c.MaxBatchBytes))
	}
	pos := func(name string, v int) {
		if v < 1 {
			errs = append(errs, fmt.Errorf("%s %d: must be >= 1", name, v))
		}
	}
	pos("commit-workers", c.CommitWorkers)
	pos("max-batch-messages", c.MaxBatchMessages)
	pos("max-queue-per-conv", c.MaxQueuePerConv)
	pos("max-pending", c.MaxPending)
	pos("max-pending-bytes", c.MaxPendingBytes)
	pos("max-conversations", c.MaxConversations)
	pos("store-conns", c.StoreConns)
	pos("partitions", c.Partitions)
	if c.MemberTTL <= 2*c.Heartbeat {
		errs = append(errs, fmt.Errorf("member-ttl %v must exceed 2 x heartbeat %v", c.MemberTTL, c.Heartbeat))
	}
	if c.Retention != 0 && c.Retention < time.Hour {
		errs = append(errs, fmt.Errorf("retention %v: must be 0 (keep forever) or at least 1h", c.Retention))
	}
	for name, d := range map[string]time.Duration{
		"passivate-after": c.PassivateAfter, "commit-timeout": c.CommitTimeout,
		"worker-lease-ttl": c.WorkerLeaseTTL, "drain-timeout": c.DrainTimeout,
		"member-ttl": c.MemberTTL, "heartbeat": c.Heartbeat, "handoff-wait": c.HandoffWait,
		"retention interval": c.RetentionEvery,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s %v: must be > 0", name, d))
		}
	}
	return errors.Join(errs...)
}

// IsPostgres reports whether a --store value names PostgreSQL (a URL or a
// keyword DSN).
func IsPostgres(store string) bool {
	sp, err := open.Parse(store)
	return err == nil && sp.Kind == open.KindPostgres
}

func generatedNodeID() string {
	h, _ := os.Hostname()
	if h == "" {
		h = "node"
	}
	if len(h) > 40 {
		h = h[:40]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return h + "-" + hex.EncodeToString(b[:])
}
