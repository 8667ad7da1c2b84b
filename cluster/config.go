package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/ring"
)

// Defaults of Config.
const (
	// Failover defaults: safety comes from the fence in every commit, not
	// from timing, so detection can be fast. A crashed node's row expires
	// after DefaultMemberTTL; a peer whose forwards fail at the transport
	// level polls the membership every suspectPoll until then, so the
	// takeover follows the expiry closely. Six heartbeats fit in one TTL:
	// a node must miss all of them (a stall of the process or of
	// PostgreSQL longer than 1.5 s) to be presumed dead, and then it only
	// steps down and rejoins; nothing is lost (cluster/README.md).
	DefaultMemberTTL      = 1500 * time.Millisecond
	DefaultHeartbeat      = 250 * time.Millisecond
	DefaultHandoffWait    = 2 * time.Second
	DefaultForwardTimeout = 10 * time.Second
	DefaultStopTimeout    = 10 * time.Second
)

// Config is one cluster node. The zero value of every optional field means
// its documented default (WithDefaults).
type Config struct {
	// NodeID is the stable name of this node (1..64 bytes, no "/"); the ring
	// places partitions by NodeID. Required.
	NodeID string
	// Store is the shared membership and partition-lease table (for
	// PostgreSQL: postgres.Store.Cluster()). Required.
	Store membership.Store

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
	// (the API's --max-body). Default sequencer.DefaultMaxBody.
	MaxBody int

	// Ring shapes the ring (partition count, ...). Every node of a cluster
	// must use the same values. Default: ring's defaults (271 partitions).
	Ring ring.Config

	// MemberTTL is how long a member row lives without a heartbeat (by the
	// database clock); a node silent this long is presumed dead and its
	// partitions are taken over. Default 1.5s. Must exceed 2*Heartbeat.
	MemberTTL time.Duration
	// Heartbeat is the interval of lease renewals, and of the retries to take
	// partitions this node should own. Default 250ms.
	Heartbeat time.Duration
	// HandoffWait bounds how long a Send waits for its partition to become
	// writable (the owner by the ring has not taken the lease yet, or the
	// partition is moving) before it fails with a retryable error. Default 2s.
	HandoffWait time.Duration
	// ForwardTimeout bounds one forwarded Send when the caller's context has
	// no deadline. Default 10s.
	ForwardTimeout time.Duration
	// StopTimeout bounds the wait for a partition's in-flight batches when it
	// is handed off or the node steps down; the lease is released anyway
	// after it (late commits are fenced). Default 10s.
	StopTimeout time.Duration

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

// WithDefaults returns c with every zero optional field set to its default.
func (c Config) WithDefaults() Config {
	defDur := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	defDur(&c.MemberTTL, DefaultMemberTTL)
	defDur(&c.Heartbeat, DefaultHeartbeat)
	defDur(&c.HandoffWait, DefaultHandoffWait)
	defDur(&c.ForwardTimeout, DefaultForwardTimeout)
	defDur(&c.StopTimeout, DefaultStopTimeout)
	if c.MaxBody <= 0 {
		c.MaxBody = sequencer.DefaultMaxBody
	}
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every field that makes no sense (after WithDefaults).
func (c Config) Validate() error {
	var errs []error
	if len(c.NodeID) == 0 || len(c.NodeID) > 64 {
		errs = append(errs, fmt.Errorf("node id %q: must be 1..64 bytes", c.NodeID))
	}
	for _, r := range c.NodeID {
		if r == '/' || r < 0x20 || r == 0x7f {
			errs = append(errs, fmt.Errorf("node id %q: no '/' or control characters", c.NodeID))
			break
		}
	}
	if c.Store == nil {
		errs = append(errs, errors.New("cluster store is required"))
	}
	if c.Transport == nil {
		if _, _, err := net.SplitHostPort(c.ClusterListen); err != nil {
			errs = append(errs, fmt.Errorf("cluster listen %q: %w", c.ClusterListen, err))
		}
		tlsSet := c.TLSCertFile != "" || c.TLSKeyFile != "" || c.TLSCAFile != ""
		switch {
		case tlsSet && (c.TLSCertFile == "" || c.TLSKeyFile == "" || c.TLSCAFile == ""):
			errs = append(errs, errors.New("cluster tls: the certificate, key and CA go together (--cluster-tls-cert, --cluster-tls-key, --cluster-ca)"))
		case !tlsSet && !c.Insecure && c.ClusterListen != "" && !IsLoopback(c.ClusterListen):
			errs = append(errs, fmt.Errorf("cluster listen %s is not a loopback address: set --cluster-tls-cert, --cluster-tls-key and --cluster-ca (or --cluster-insecure)", c.ClusterListen))
		}
	}
	if _, err := ring.New(nil, c.Ring); err != nil {
		errs = append(errs, err)
	}
	for name, d := range map[string]time.Duration{
		"member ttl": c.MemberTTL, "heartbeat": c.Heartbeat, "handoff wait": c.HandoffWait,
		"forward timeout": c.ForwardTimeout, "stop timeout": c.StopTimeout,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s %v: must be > 0", name, d))
		}
	}
	if c.Heartbeat > 0 && c.MemberTTL <= 2*c.Heartbeat {
		errs = append(errs, fmt.Errorf("member ttl %v must exceed twice the heartbeat %v", c.MemberTTL, c.Heartbeat))
	}
	return errors.Join(errs...)
}
