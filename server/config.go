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
	"github.com/sequencer-im/sequencer/feed"
	"github.com/sequencer-im/sequencer/idgen"
	"github.com/sequencer-im/sequencer/internal/conf"
	"github.com/sequencer-im/sequencer/persist/open"
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
	// NodeID names this node in the cluster and holds its leases. Default:
	// hostname plus a random suffix (a new name per start).
	NodeID string

	// Pprof serves Go's /debug/pprof/ handlers on the admin mux (with
	// /healthz and /metrics). Default off.
	Pprof bool
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
	// RedirectToOwner answers a plain Connect Send that this node could not
	// place, because the conversation's owner is out of its reach over the
	// cluster link, with HTTP 307 to the owner (api.Edge.RedirectToOwner,
	// docs/API.md "Redirects"). Default true.
	RedirectToOwner bool

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

	// The components' knobs, each in the component's own Config under its
	// own names: their defaults are the component's DefaultConfig, their
	// rules its Validate (reported under the flags' names, see flagNames).
	// Start fills in their dependencies (store, id source, ownership,
	// clock, logger, metrics) and the node-wide values (NodeID, MaxBody,
	// TracerProvider); what a caller puts there is ignored.

	// API holds the request limits: MaxBody (--max-body) and MaxBatchBytes
	// (--max-batch-bytes).
	API api.Config
	// Actors holds the conversation actors' bounds (--passivate-after,
	// --max-queue-per-conv, --max-pending, --max-pending-bytes,
	// --max-conversations), how late a message may be edited or recalled
	// (--edit-window, --recall-window: Windows) and, in Actors.Commit, the group commit's
	// (--commit-workers, --max-batch-messages, --commit-timeout).
	Actors actor.Config
	// Cluster is the cluster mode, on when Cluster.ClusterListen is set
	// (--cluster-listen): --cluster-advertise, the mutual-TLS files
	// (--cluster-tls-cert, --cluster-tls-key, --cluster-ca, as TLSCertFile,
	// TLSKeyFile, TLSCAFile), --cluster-insecure (Insecure), --partitions
	// (Ring.Partitions), --member-ttl, --heartbeat, --handoff-wait.
	Cluster cluster.Config
	// Feed bounds the change feed (Subscribe): --max-subscriptions
	// (MaxSubscriptions), --subscribe-queue (MaxQueue),
	// --subscribe-heartbeat (Heartbeat), --subscribe-read-timeout
	// (ReadTimeout).
	Feed feed.Config
	// Firehose publishes every stored message to NATS JetStream when
	// Firehose.URL is set (--feed-nats; docs/FEED.md).
	Firehose FirehoseConfig
	// IDs is the msg_id issuer, a snowflake generator on a worker id leased
	// from the store: --worker-lease-ttl (TTL); the other intervals follow
	// TTL (docs/IDGEN.md).
	IDs idgen.IssuerConfig
}

// minRetention is the shortest Retention other than 0.
const minRetention = time.Hour

// DefaultConfig returns every default. The components' settings are their
// own DefaultConfig; NodeID stays empty (WithDefaults generates one: the
// hostname plus a random suffix).
func DefaultConfig() Config {
	pools := open.DefaultOptions().Pools
	return Config{
		Listen:            "127.0.0.1:7070",
		Store:             "./data",
		StoreConns:        pools.Read,
		StoreControlConns: pools.Control,
		DrainTimeout:      30 * time.Second,
		RedirectToOwner:   true,
		RetentionEvery:    time.Hour,
		API:               api.DefaultConfig(),
		Actors:            actor.DefaultConfig(),
		Cluster:           cluster.DefaultConfig(),
		IDs:               idgen.DefaultIssuerConfig(),
		Feed:              feed.DefaultConfig(),
		Firehose:          FirehoseConfig{Subject: "sequencer", Format: "proto"},
	}
}

// WithDefaults returns c with every zero field set to its DefaultConfig
// value (the components' Configs field by field), and a generated NodeID
// when it is empty.
func (c Config) WithDefaults() Config {
	conf.FillZeroNested(&c, DefaultConfig())
	if c.NodeID == "" {
		c.NodeID = generatedNodeID()
	}
	return c
}

// clustered reports whether c runs a cluster node.
func (c Config) clustered() bool { return c.Cluster.ClusterListen != "" }

// The components' Configs as Start hands them over, before it adds the
// dependencies: the node-wide values copied in.
func (c Config) apiConfig() api.Config {
	a := c.API
	a.TracerProvider = c.TracerProvider
	return a
}

func (c Config) clusterConfig() cluster.Config {
	cl := c.Cluster
	cl.NodeID, cl.MaxBody, cl.TracerProvider = c.NodeID, c.API.MaxBody, c.TracerProvider
	return cl
}

func (c Config) issuerConfig() idgen.IssuerConfig {
	l := c.IDs
	l.Holder = c.NodeID
	return l
}

// flagNames names the flag that sets each component field, by its path in
// Config: Validate reports the components' rules under these names. A
// component field without a flag is not reported (Start sets it, or it is
// the component's own default).
var flagNames = map[string]string{
	"API.MaxBody":               "max-body",
	"API.MaxBatchBytes":         "max-batch-bytes",
	"Actors.PassivateAfter":     "passivate-after",
	"Actors.MaxQueuePerConv":    "max-queue-per-conv",
	"Actors.MaxPending":         "max-pending",
	"Actors.MaxPendingBytes":    "max-pending-bytes",
	"Actors.MaxConversations":   "max-conversations",
	"Actors.Windows.Edit":       "edit-window",
	"Actors.Windows.Recall":     "recall-window",
	"Actors.Commit.Workers":     "commit-workers",
	"Actors.Commit.MaxMessages": "max-batch-messages",
	"Actors.Commit.Timeout":     "commit-timeout",
	"Cluster.MemberTTL":         "member-ttl",
	"Cluster.Heartbeat":         "heartbeat",
	"Cluster.HandoffWait":       "handoff-wait",
	"IDs.TTL":                   "worker-lease-ttl",
	"Feed.MaxSubscriptions":     "max-subscriptions",
	"Feed.MaxQueue":             "subscribe-queue",
	"Feed.Heartbeat":            "subscribe-heartbeat",
	"Feed.ReadTimeout":          "subscribe-read-timeout",
}

// clusterFlagNames adds what is reported only for a cluster node: its
// listen address and TLS files, and its node id (a cluster node id also
// has no '/'; an empty one is generated, so it is reported only as given).
var clusterFlagNames = map[string]string{
	"Cluster.ClusterListen": "cluster-listen",
	"Cluster.TLSCertFile":   "cluster-tls-cert",
	"Cluster.NodeID":        "node-id",
}

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
	names := flagNames
	if c.clustered() {
		if !IsShared(c.Store) {
			errs = append(errs, errors.New("cluster-listen needs a PostgreSQL or MySQL store (--store postgres://... or mysql://...): nodes meet in the shared database"))
		}
		names = maps.Clone(flagNames)
		maps.Copy(names, clusterFlagNames)
		if c.NodeID == "" {
			delete(names, "Cluster.NodeID")
		}
	}
	if len(c.NodeID) > 64 {
		errs = append(errs, fmt.Errorf("node-id must be 1..64 bytes"))
	}
	ch := conf.Checker{}
	conf.Positive(&ch, "store-conns", c.StoreConns)
	conf.Range(&ch, "store-commit-conns", c.StoreCommitConns, 0, math.MaxInt32)
	conf.Positive(&ch, "store-control-conns", c.StoreControlConns)
	conf.Range(&ch, "partitions", c.Cluster.Ring.Partitions, 1, ring.MaxPartitions)
	conf.PositiveDuration(&ch, "drain-timeout", c.DrainTimeout)
	conf.PositiveDuration(&ch, "RetentionEvery", c.RetentionEvery)
	if c.Retention < 0 || c.Retention > 0 && c.Retention < minRetention {
		ch.Bad("retention", c.Retention, fmt.Sprintf("must be 0 (keep forever) or at least %v", minRetention))
	}
	ch.Add(conf.Rename(conf.Nest(c.apiConfig().Validate(), "", "API"), "", names))
	ch.Add(conf.Rename(conf.Nest(c.Actors.Validate(), "", "Actors"), "", names))
	ch.Add(conf.Rename(conf.Nest(c.clusterConfig().Validate(), "", "Cluster"), "", names))
	ch.Add(conf.Rename(conf.Nest(c.issuerConfig().Validate(), "", "IDs"), "", names))
	ch.Add(conf.Rename(conf.Nest(c.Feed.Validate(), "", "Feed"), "", names))
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
