package cluster

import (
	"fmt"
	"log/slog"
	"net"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/feed"
	"github.com/sequencer-im/sequencer/internal/conf"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/ring"
)

// Config is one cluster node. DefaultConfig holds every default; the zero
// value of every optional field means its default (WithDefaults).
type Config struct {
	// NodeID is the stable name of this node (1..64 bytes, no "/"); the ring
	// places partitions by NodeID. Required.
	NodeID string
	// Store is the shared membership and partition-lease table (for
	// PostgreSQL: postgres.Store.Cluster()). Required.
	Store membership.Store

	// Feed is the node's change-feed hub (package feed): the node serves
	// its peers' Feed streams from it (cluster/feed.go). Optional.
	Feed *feed.Hub

	// ClusterListen is the node-to-node address the transport listens on
	// (host:port; port 0 picks a free one). Required unless Transport is set.
	ClusterListen string
	// ClusterAdvertise is the address other nodes dial to reach this one.
	// Default: the address the transport actually bound (right for
	// 127.0.0.1 or a specific interface; set it when listening on 0.0.0.0).
	ClusterAdvertise string
	// APIAddr is this node's client API address, answered by Route so
	// clients can go to the owner directly. Optional.
	APIAddr string
	// Transport carries forwarded sends and wake-ups between nodes. Default:
	// connect-go over HTTP/2 on ClusterListen (NewConnectTransport), with
	// mutual TLS when the TLS files are set.
	Transport Transport
	// TLSCertFile, TLSKeyFile and TLSCAFile (PEM) turn on mutual TLS between
	// nodes: this node presents the certificate, and accepts and dials only
	// peers whose certificate chains to the CA (LoadPeerTLS). All three or
	// none.
	TLSCertFile, TLSKeyFile, TLSCAFile string
	// Insecure allows a ClusterListen that is not a loopback address without
	// TLS (refused otherwise).
	Insecure bool
	// MaxBody is the body limit every forwarded item is checked against
	// (the API's --max-body).
	MaxBody int

	// Ring shapes the ring (partition count, ...). Every node of a cluster
	// must use the same values. Default: ring.DefaultConfig().
	Ring ring.Config

	// MemberTTL is how long a member row lives without a heartbeat (by the
	// database clock); a node silent this long is presumed dead and its
	// partitions are taken over. Must exceed 2*Heartbeat.
	MemberTTL time.Duration
	// Heartbeat is the interval of lease renewals, and of the retries to take
	// partitions this node should own.
	Heartbeat time.Duration
	// HandoffWait bounds how long a Send waits for its partition to become
	// writable (the owner by the ring has not taken the lease yet, or the
	// partition is moving) before it fails with a retryable error.
	HandoffWait time.Duration
	// ForwardTimeout bounds how long this node holds one Send or SendBatch
	// (the caller's deadline when sooner): a send it could not place by
	// then is answered deadline_exceeded (outcome unknown; the client
	// resends with the same client_msg_id). docs/API.md states it.
	ForwardTimeout time.Duration
	// SlowLink: when the link's share of a forward's round trip to a peer
	// averages above it, a client send that follows redirects
	// (sequencer.FollowsRedirects) is not forwarded there but answered at
	// once with the owner's address (sequencer.OwnerElsewhere): the client
	// reaches the owner faster itself. 0: never (links are used however
	// slow). Not a flag; --redirect-to-owner=false turns every redirect off.
	SlowLink time.Duration
	// StopTimeout bounds the wait for a partition's in-flight batches when it
	// is handed off or the node steps down; the lease is released anyway
	// after it (late commits are fenced).
	StopTimeout time.Duration

	// IDs, when set, is the node's msg_id issuer (the server's worker-id
	// lease, idgen.Issuer). A node that stepped down rejoins only once it
	// can issue msg_ids: a member that took its partitions back but could
	// not issue ids would refuse their sends while its peers could serve
	// them. It is kicked whenever the store answers the cluster again after
	// a failure, so it renews at once. nil: msg_ids never hold a rejoin up.
	IDs IDIssuer

	// Clock is the local clock (heartbeat freshness). Default: real time.
	Clock clock.Clock
	// Logger receives membership changes and failures. Default: slog.Default().
	Logger *slog.Logger
	// Metrics, when set, gets the cluster collectors registered on its
	// Registry (sequencer_cluster_*).
	Metrics *metrics.Set
	// TracerProvider, when set, traces forwards and wake-ups on the default
	// transport (ConnectConfig.TracerProvider). nil: no tracing.
	TracerProvider trace.TracerProvider
}

// IDIssuer is the node's msg_id issuer as the cluster sees it
// (Config.IDs).
type IDIssuer interface {
	// Issuable is nil when msg_ids can be issued now, else why not.
	Issuable() error
	// Kick tells the issuer that the store answers again: renew now.
	Kick()
}

// DefaultConfig returns every default (NodeID, Store and ClusterListen or
// Transport are still required).
//
// Failover: safety comes from the fence in every commit, not from timing,
// so detection can be fast. A crashed node's row expires after MemberTTL; a
// peer whose forwards fail at the transport level polls the membership
// every suspectPoll until then, so the takeover follows the expiry closely.
// Six heartbeats fit in one TTL: a node must miss all of them (a stall of
// the process or of PostgreSQL longer than the TTL) to be presumed dead,
// and then it only steps down and rejoins; nothing is lost
// (cluster/README.md).
func DefaultConfig() Config {
	return Config{
		MaxBody:        sequencer.DefaultMaxBody,
		Ring:           ring.DefaultConfig(),
		MemberTTL:      1500 * time.Millisecond,
		Heartbeat:      250 * time.Millisecond,
		HandoffWait:    2 * time.Second,
		ForwardTimeout: 10 * time.Second,
		SlowLink:       100 * time.Millisecond,
		StopTimeout:    10 * time.Second,
	}
}

// WithDefaults returns c with every zero optional field set to its
// DefaultConfig value, the real clock and slog.Default().
func (c Config) WithDefaults() Config {
	conf.FillZero(&c, DefaultConfig())
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every field that makes no sense, as given (after
// WithDefaults; zero durations are errors here). The required fields
// (NodeID, Store, ClusterListen without a Transport) are checked too.
func (c Config) Validate() error {
	ch := conf.Checker{Pkg: "cluster"}
	if len(c.NodeID) == 0 || len(c.NodeID) > 64 {
		ch.Bad("NodeID", fmt.Sprintf("%q", c.NodeID), "must be 1..64 bytes")
	}
	for _, r := range c.NodeID {
		if r == '/' || r < 0x20 || r == 0x7f {
			ch.Bad("NodeID", fmt.Sprintf("%q", c.NodeID), "no '/' or control characters")
			break
		}
	}
	if c.Store == nil {
		ch.Bad("Store", nil, "the cluster store is required")
	}
	if c.Transport == nil {
		if _, _, err := net.SplitHostPort(c.ClusterListen); err != nil {
			ch.Bad("ClusterListen", fmt.Sprintf("%q", c.ClusterListen), err.Error())
		}
		tlsSet := c.TLSCertFile != "" || c.TLSKeyFile != "" || c.TLSCAFile != ""
		switch {
		case tlsSet && (c.TLSCertFile == "" || c.TLSKeyFile == "" || c.TLSCAFile == ""):
			ch.Bad("TLSCertFile", nil, "the certificate, key and CA go together (--cluster-tls-cert, --cluster-tls-key, --cluster-ca)")
		case !tlsSet && !c.Insecure && c.ClusterListen != "" && !IsLoopback(c.ClusterListen):
			ch.Bad("ClusterListen", c.ClusterListen, "not a loopback address: set --cluster-tls-cert, --cluster-tls-key and --cluster-ca (or --cluster-insecure)")
		}
	}
	conf.Positive(&ch, "MaxBody", c.MaxBody)
	if _, err := ring.New(nil, c.Ring); err != nil {
		ch.Bad("Ring", nil, err.Error())
	}
	conf.PositiveDuration(&ch, "MemberTTL", c.MemberTTL)
	conf.PositiveDuration(&ch, "Heartbeat", c.Heartbeat)
	conf.PositiveDuration(&ch, "HandoffWait", c.HandoffWait)
	conf.PositiveDuration(&ch, "ForwardTimeout", c.ForwardTimeout)
	conf.PositiveDuration(&ch, "StopTimeout", c.StopTimeout)
	if c.Heartbeat > 0 && c.MemberTTL > 0 && c.MemberTTL <= 2*c.Heartbeat {
		ch.BadVs("MemberTTL", c.MemberTTL, fmt.Sprintf("must exceed twice %%s (%v)", c.Heartbeat), "Heartbeat")
	}
	return ch.Err()
}
