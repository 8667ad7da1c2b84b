package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/api"
	"github.com/sequencer-im/sequencer/cluster"
	"github.com/sequencer-im/sequencer/idgen"
	"github.com/sequencer-im/sequencer/internal/conf"
	"github.com/sequencer-im/sequencer/persist/open"
	"github.com/sequencer-im/sequencer/persist/postgres"
	"github.com/sequencer-im/sequencer/ring"
)

// Config is everything a node needs. DefaultConfig holds every default
// (composed from the components' DefaultConfig); the zero value of a field
// means its default (WithDefaults). cmd/sequencer starts from DefaultConfig
// and sets it from flags and SEQUENCER_* environment variables, whose
// defaults are DefaultConfig's.
type Config struct {
	// Listen is the API address: Connect, gRPC, gRPC-Web and JSON, plus
	// /healthz, /readyz and /metrics unless AdminListen is set.
	Listen string
	// Store is a postgres:// or postgresql:// URL or a libpq keyword DSN for
	// PostgreSQL, a mysql:// URL for MySQL / MariaDB, or sqlite:PATH / a
	// path without "://" for the embedded store (the allow-list of
	// persist/open.Parse; anything else is refused).
	// The default ./data is the embedded store ./data/sequencer.db.
	Store string
	// ClusterListen is the inter-node address; empty runs a single node.
	ClusterListen string
	// NodeID names this node in the cluster and holds its leases. Default:
	// hostname plus a random suffix (a new name per start).
	NodeID string

	// MaxBody is the largest accepted body in bytes (api.Config.MaxBody).
	MaxBody int
	// Pprof serves Go's /debug/pprof/ handlers on the admin mux (with
	// /healthz and /metrics). Default off.
	Pprof bool
	// MaxBatchBytes is the largest SendBatch request (its protobuf size) in
	// bytes; larger ones are invalid_argument (api.Config.MaxBatchBytes).
	MaxBatchBytes int
	// PassivateAfter stops a conversation actor idle this long.
	PassivateAfter time.Duration
	// CommitWorkers is the most parallel group-commit transactions (see
	// commit.Config.Workers).
	CommitWorkers int
	// MaxBatchMessages bounds the messages of one store transaction.
	MaxBatchMessages int
	// MaxQueuePerConv bounds the sends queued on one conversation.
	MaxQueuePerConv int
	// MaxPending bounds the sends queued on the node.
	MaxPending int
	// MaxPendingBytes bounds the bytes of the sends queued on the node
	// (bodies and keys).
	MaxPendingBytes int
	// MaxConversations bounds the live conversation actors.
	MaxConversations int
	// StoreConns is the size of the PostgreSQL read pool (pulls, lookups,
	// head loads, retention).
	StoreConns int
	// StoreCommitConns is the size of the PostgreSQL commit pool, used by
	// commits only, so reads never delay them. 0 (the default) means
	// CommitWorkers.
	StoreCommitConns int
	// StoreControlConns is the size of the PostgreSQL control pool: cluster
	// membership heartbeats and partition leases, the worker-id lease and
	// Settle, so that reads and commits cannot starve them.
	StoreControlConns int
	// CommitTimeout bounds one store commit; past it the outcome is unknown
	// and the conversation re-reads the store.
	CommitTimeout time.Duration
	// WorkerLeaseTTL is how long the snowflake worker-id lease lives without
	// renewal (idgen.LeaseConfig.TTL).
	WorkerLeaseTTL time.Duration
	// DrainTimeout bounds the graceful stop on SIGTERM.
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
	// Must exceed 2*Heartbeat (cluster.Config.MemberTTL).
	MemberTTL time.Duration
	// Heartbeat is the membership lease renewal interval.
	Heartbeat time.Duration
	// Partitions is the fixed partition count of the ring; every node of a
	// cluster must use the same value (ring.Config.Partitions).
	Partitions int
	// HandoffWait bounds how long a send waits for a moving conversation to
	// become writable before it fails with unavailable.
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
	// everything. At least one hour (minRetention).
	Retention time.Duration
	// RetentionEvery is the time between retention passes (jittered by
	// +-10%).
	RetentionEvery time.Duration

	// TracerProvider, when set, traces the API's RPCs and the forwards
	// between nodes (OpenTelemetry; `sequencer serve` sets it from the
	// OTEL_* environment). nil: no tracing. Not a flag.
	TracerProvider trace.TracerProvider
}

// minRetention is the shortest Retention other than 0.
const minRetention = time.Hour

// DefaultConfig returns every default. The components' settings come from
// their own DefaultConfig; NodeID stays empty (WithDefaults generates one:
// the hostname plus a random suffix).
func DefaultConfig() Config {
	a, ap, cl, wl := actor.DefaultConfig(), api.DefaultConfig(), cluster.DefaultConfig(), idgen.DefaultLeaseConfig()
	pg := postgres.DefaultOptions()
	return Config{
		Listen:            "127.0.0.1:7070",
		Store:             "./data",
		MaxBody:           ap.MaxBody,
		MaxBatchBytes:     ap.MaxBatchBytes,
		PassivateAfter:    a.PassivateAfter,
		CommitWorkers:     a.CommitWorkers,
		MaxBatchMessages:  a.MaxBatchMessages,
		MaxQueuePerConv:   a.MaxQueuePerConv,
		MaxPending:        a.MaxPending,
		MaxPendingBytes:   int(a.MaxPendingBytes),
		MaxConversations:  a.MaxConversations,
		StoreConns:        int(pg.MaxConns),
		StoreControlConns: int(pg.ControlConns),
		CommitTimeout:     a.CommitTimeout,
		WorkerLeaseTTL:    wl.TTL,
		DrainTimeout:      30 * time.Second,
		MemberTTL:         cl.MemberTTL,
		Heartbeat:         cl.Heartbeat,
		Partitions:        cl.Ring.Partitions,
		HandoffWait:       cl.HandoffWait,
		RetentionEvery:    time.Hour,
	}
}

// WithDefaults returns c with every zero field set to its DefaultConfig
// value, and a generated NodeID when it is empty.
func (c Config) WithDefaults() Config {
	conf.FillZero(&c, DefaultConfig())
	if c.NodeID == "" {
		c.NodeID = generatedNodeID()
	}
	return c
}

// The components' parts of a Config, without the dependencies Start adds
// (store, id source, logger, metrics), and the flag that sets each of their
// fields: Validate reports the components' rules under the flags' names.
func (c Config) apiConfig() api.Config {
	return api.Config{MaxBody: c.MaxBody, MaxBatchBytes: c.MaxBatchBytes, TracerProvider: c.TracerProvider}
}

var apiFlags = map[string]string{"MaxBody": "max-body", "MaxBatchBytes": "max-batch-bytes"}

func (c Config) actorConfig() actor.Config {
	return actor.Config{
		PassivateAfter: c.PassivateAfter, MaxQueuePerConv: c.MaxQueuePerConv, MaxPending: c.MaxPending,
		MaxPendingBytes: int64(c.MaxPendingBytes), MaxConversations: c.MaxConversations,
		CommitWorkers: c.CommitWorkers, MaxBatchMessages: c.MaxBatchMessages, CommitTimeout: c.CommitTimeout,
	}
}

var actorFlags = map[string]string{
	"PassivateAfter": "passivate-after", "MaxQueuePerConv": "max-queue-per-conv", "MaxPending": "max-pending",
	"MaxPendingBytes": "max-pending-bytes", "MaxConversations": "max-conversations",
	"CommitWorkers": "commit-workers", "MaxBatchMessages": "max-batch-messages", "CommitTimeout": "commit-timeout",
}

func (c Config) clusterConfig() cluster.Config {
	return cluster.Config{
		NodeID: c.NodeID, ClusterListen: c.ClusterListen, ClusterAdvertise: c.ClusterAdvertise,
		Ring:      ring.Config{Partitions: c.Partitions},
		MemberTTL: c.MemberTTL, Heartbeat: c.Heartbeat, HandoffWait: c.HandoffWait,
		TLSCertFile: c.ClusterTLSCert, TLSKeyFile: c.ClusterTLSKey, TLSCAFile: c.ClusterCA,
		Insecure: c.ClusterInsecure, MaxBody: c.MaxBody, TracerProvider: c.TracerProvider,
	}
}

// clusterFlags maps the cluster's tunables; its listen and TLS rules are
// checked by Validate itself (with flag-specific hints), MaxBody by the
// API's rule and the partition count against ring's bounds (the ring reads
// 0 as its default, a flag of 0 is an error).
var clusterFlags = map[string]string{"MemberTTL": "member-ttl", "Heartbeat": "heartbeat", "HandoffWait": "handoff-wait"}

func (c Config) leaseConfig() idgen.LeaseConfig {
	return idgen.LeaseConfig{Holder: c.NodeID, TTL: c.WorkerLeaseTTL}
}

var leaseFlags = map[string]string{"TTL": "worker-lease-ttl"}

// Validate reports every field that makes no sense, as given, named by its
// flag: zero counts and durations are errors (Start fills them with
// WithDefaults first), an empty NodeID is not (it is generated). The
// components' settings are checked by their own Validate.
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
	cflags := clusterFlags
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
		if !IsShared(c.Store) {
			errs = append(errs, errors.New("cluster-listen needs a PostgreSQL or MySQL store (--store postgres://... or mysql://...): nodes meet in the shared database"))
		}
		if c.NodeID != "" {
			cflags = maps.Clone(clusterFlags)
			cflags["NodeID"] = "node-id" // a cluster node id also has no '/'
		}
	}
	if len(c.NodeID) > 64 {
		errs = append(errs, fmt.Errorf("node-id must be 1..64 bytes"))
	}
	ch := conf.Checker{}
	conf.Positive(&ch, "store-conns", c.StoreConns)
	conf.Range(&ch, "store-commit-conns", c.StoreCommitConns, 0, math.MaxInt32)
	conf.Positive(&ch, "store-control-conns", c.StoreControlConns)
	conf.Range(&ch, "partitions", c.Partitions, 1, ring.MaxPartitions)
	conf.PositiveDuration(&ch, "drain-timeout", c.DrainTimeout)
	conf.PositiveDuration(&ch, "RetentionEvery", c.RetentionEvery)
	if c.Retention < 0 || c.Retention > 0 && c.Retention < minRetention {
		ch.Bad("retention", c.Retention, fmt.Sprintf("must be 0 (keep forever) or at least %v", minRetention))
	}
	ch.Add(conf.Rename(c.apiConfig().Validate(), "", apiFlags))
	ch.Add(conf.Rename(c.actorConfig().Validate(), "", actorFlags))
	ch.Add(conf.Rename(c.clusterConfig().Validate(), "", cflags))
	ch.Add(conf.Rename(c.leaseConfig().Validate(), "", leaseFlags))
	errs = append(errs, ch.Err())
	return errors.Join(errs...)
}

// IsPostgres reports whether a --store value names PostgreSQL (a URL or a
// keyword DSN).
func IsPostgres(store string) bool {
	sp, err := open.Parse(store)
	return err == nil && sp.Kind == open.KindPostgres
}

// IsShared reports whether a --store value names a database server that
// nodes can share (PostgreSQL or MySQL): the stores with a membership table.
func IsShared(store string) bool {
	sp, err := open.Parse(store)
	return err == nil && sp.Kind.Shared()
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
