package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// Protocol is the wire protocol the client speaks; every sequencer node serves
// all of them on its one API port.
type Protocol int

const (
	// ProtocolGRPC is gRPC over HTTP/2 (the default).
	ProtocolGRPC Protocol = iota
	// ProtocolConnect is Connect's own protocol (binary protobuf over HTTP).
	ProtocolConnect
	// ProtocolGRPCWeb is gRPC-Web.
	ProtocolGRPCWeb
)

func (p Protocol) String() string {
	switch p {
	case ProtocolGRPC:
		return "grpc"
	case ProtocolConnect:
		return "connect"
	case ProtocolGRPCWeb:
		return "grpc-web"
	default:
		return fmt.Sprintf("Protocol(%d)", int(p))
	}
}

func (p Protocol) clientOptions() []connect.ClientOption {
	switch p {
	case ProtocolConnect:
		return nil
	case ProtocolGRPCWeb:
		return []connect.ClientOption{connect.WithGRPCWeb()}
	default:
		return []connect.ClientOption{connect.WithGRPC()}
	}
}

// RetryPolicy says how long and how often a call is retried. Only retryable
// failures are retried: unavailable, resource_exhausted, transport errors
// (connection refused or reset, lost response) and a single attempt that ran
// past AttemptTimeout while the overall budget remains. A Send is always
// retried with the same client_msg_id, so a retry never stores a message twice.
// The zero value of every field means its documented default.
type RetryPolicy struct {
	// MaxAttempts bounds the attempts of one call, the first included. 0 (the
	// default) means no count limit: Deadline bounds the call. 1 disables
	// retries.
	MaxAttempts int
	// Deadline is the overall budget of one call, all attempts and backoffs
	// included. The caller's ctx bounds it further. Default 30s.
	Deadline time.Duration
	// AttemptTimeout bounds one attempt (a Route lookup plus the RPC). An
	// attempt that runs past it is retried while Deadline allows. Default 10s.
	AttemptTimeout time.Duration
	// BaseBackoff is the wait after the first failed attempt; it doubles per
	// attempt up to MaxBackoff, and each wait is jittered into [d/2, d].
	// Default 20ms.
	BaseBackoff time.Duration
	// MaxBackoff caps the wait between attempts. It is also how long a node
	// that failed at the transport level is avoided. Default 1s.
	MaxBackoff time.Duration
	// RouteCheck: a Send attempt not answered within RouteCheck asks another
	// node for the conversation's owner (Route), and again every RouteCheck
	// while it waits; when the answer names an owner other than the node the
	// attempt went to (the partition moved, or the route was stale), the
	// attempt is given up (outcome unknown) and the Send goes to that owner
	// at once, with the same client_msg_id. Default 250ms. Not used with
	// DisableRouting.
	RouteCheck time.Duration
}

// Defaults of Config and RetryPolicy.
const (
	DefaultDeadline       = 30 * time.Second
	DefaultAttemptTimeout = 10 * time.Second
	DefaultBaseBackoff    = 20 * time.Millisecond
	DefaultMaxBackoff     = time.Second
	DefaultRouteCheck     = 250 * time.Millisecond
	DefaultRouteCacheSize = 65536
	DefaultConnections    = 4

	DefaultBatchMaxItems       = 1000
	DefaultBatchMaxBytes       = 3 << 20
	DefaultBatchMaxQueuedItems = 10000
	DefaultBatchMaxQueuedBytes = 32 << 20
	DefaultBatchMaxInFlight    = 4
)

// Config configures a Client. Only Addrs is required.
type Config struct {
	// Addrs are one or more node API addresses: "host:port" (HTTP/2 over
	// TLS when TLSConfig is set, else cleartext h2c) or a "http://host:port"
	// / "https://host:port" URL. Any node
	// serves any request (it forwards to the owner), so these are only the
	// entry points; the owners of conversations are learned with Route.
	Addrs []string
	// HTTPClient carries the RPCs. Default: an http.Client over
	// http.Transports speaking HTTP/2 only (cleartext h2c with prior
	// knowledge for http://, TLS for https://), with HTTP/2 pings to detect
	// dead connections: Connections of them for unary calls and one for
	// Subscribe streams. Close closes their idle connections; a
	// caller-supplied client is left alone.
	HTTPClient connect.HTTPClient
	// TLSConfig is the TLS configuration of the default transport (server
	// CAs in RootCAs, a client certificate in Certificates for nodes started
	// with --client-ca). When set, "host:port" addresses mean https://.
	// Ignored with a caller-supplied HTTPClient (configure its transport).
	// Default nil: cleartext, unless an address says https:// (then the
	// system's roots).
	TLSConfig *tls.Config
	// Connections is how many HTTP/2 connections the default transport
	// spreads its unary calls over, per node (round robin; each is dialed
	// on first use). Subscribe streams are kept apart, on one more
	// connection per node, which carries up to the node's limit of
	// concurrent streams (10,000): the deliveries to many of them then
	// share its writes. Ignored with a caller-supplied HTTPClient.
	// Default 4.
	Connections int
	// Token is the bearer token sent on every call ("Authorization: Bearer
	// <Token>"), for nodes started with --auth-token-file. A call refused for
	// a missing or wrong token fails with unauthenticated and is not retried.
	// Default empty: no Authorization header.
	Token string
	// Protocol is the wire protocol. Default ProtocolGRPC.
	Protocol Protocol
	// Gzip asks the nodes to gzip answers above 1 KiB (Pull pages,
	// PullMany, Subscribe events of large messages), for clients on a slow
	// or metered link. Default false: answers come as they are, as between
	// the nodes; on a LAN gzip costs both sides more CPU than the bytes
	// save (a PullMany of 10,000 messages without it: about 3 ms less of
	// the node's CPU and 2 ms less per call on one machine,
	// docs/BENCHMARKS.md). Requests are never compressed.
	Gzip bool
	// Retry is the retry policy of every call.
	Retry RetryPolicy
	// RouteCacheSize bounds how many conversations the client remembers the
	// partition of (least recently used are forgotten). Default 65536.
	RouteCacheSize int
	// DisableRouting sends every call to the Addrs nodes, which forward Sends
	// to the owner (one more hop). Use it when Addrs is a load balancer that
	// hides the nodes' own addresses. Default false: Sends go straight to the
	// owner learned with Route.
	DisableRouting bool
	// Logger receives the client's Debug logs (retries, route changes). The
	// client never logs above Debug. Default slog.Default().
	Logger *slog.Logger
	// Batching says how concurrent Sends to one node are coalesced into
	// SendBatch requests.
	Batching BatchPolicy
}

// BatchPolicy coalesces concurrent Sends to the same node into SendBatch
// requests, adaptively like the server's group commit: while MaxInFlight
// requests to a node are in flight, the next Sends queue and go out together
// when one returns. SendMany's items of one conversation are never in two
// requests in flight at once, so they are stored in item order; Sends from
// concurrent goroutines have no order between them and may share the
// requests in flight even for one conversation. Each Send still gets its
// own result and error, and is retried on its own with its own
// client_msg_id. The zero value of every field means its documented default.
type BatchPolicy struct {
	// Disabled sends every message in its own Send RPC. Default false.
	Disabled bool
	// Linger is how long a request waits for more messages before it goes
	// out when none is in flight. Default 0: at once.
	Linger time.Duration
	// MaxItems is the most messages in one request (the server takes 1,000).
	// Default 1000.
	MaxItems int
	// MaxBytes bounds one request's message bytes (bodies and keys; the
	// server's --max-batch-bytes defaults to 4 MiB). Default 3 MiB.
	MaxBytes int
	// MaxQueuedItems and MaxQueuedBytes bound what waits for one node; past
	// them Send blocks until there is room or its ctx ends. Defaults 10,000
	// and 32 MiB.
	MaxQueuedItems int
	MaxQueuedBytes int
	// MaxInFlight is the most SendBatch requests in flight to one node at
	// once (1..64). Default 4.
	MaxInFlight int
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Retry.Deadline == 0 {
		c.Retry.Deadline = DefaultDeadline
	}
	b := &c.Batching
	if b.MaxItems == 0 {
		b.MaxItems = DefaultBatchMaxItems
	}
	if b.MaxBytes == 0 {
		b.MaxBytes = DefaultBatchMaxBytes
	}
	if b.MaxQueuedItems == 0 {
		b.MaxQueuedItems = DefaultBatchMaxQueuedItems
	}
	if b.MaxQueuedBytes == 0 {
		b.MaxQueuedBytes = DefaultBatchMaxQueuedBytes
	}
	if b.MaxInFlight == 0 {
		b.MaxInFlight = DefaultBatchMaxInFlight
	}
	if c.Retry.AttemptTimeout == 0 {
		c.Retry.AttemptTimeout = DefaultAttemptTimeout
	}
	if c.Retry.BaseBackoff == 0 {
		c.Retry.BaseBackoff = DefaultBaseBackoff
	}
	if c.Retry.MaxBackoff == 0 {
		c.Retry.MaxBackoff = DefaultMaxBackoff
	}
	if c.Retry.RouteCheck == 0 {
		c.Retry.RouteCheck = DefaultRouteCheck
	}
	if c.RouteCacheSize == 0 {
		c.RouteCacheSize = DefaultRouteCacheSize
	}
	if c.Connections == 0 {
		c.Connections = DefaultConnections
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// validate reports every field that makes no sense (after withDefaults).
func (c Config) validate() error {
	var errs []error
	if len(c.Addrs) == 0 {
		errs = append(errs, errors.New("addrs: at least one node address is required"))
	}
	for _, a := range c.Addrs {
		if _, err := c.nodeURL(a); err != nil {
			errs = append(errs, err)
		}
	}
	if strings.ContainsAny(c.Token, " \t\r\n") {
		errs = append(errs, errors.New("token: must not contain white space"))
	}
	if c.Protocol < ProtocolGRPC || c.Protocol > ProtocolGRPCWeb {
		errs = append(errs, fmt.Errorf("protocol %v: unknown", c.Protocol))
	}
	r := c.Retry
	if r.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("retry.max_attempts %d: must be >= 0", r.MaxAttempts))
	}
	for name, d := range map[string]time.Duration{
		"retry.deadline": r.Deadline, "retry.attempt_timeout": r.AttemptTimeout,
		"retry.base_backoff": r.BaseBackoff, "retry.max_backoff": r.MaxBackoff, "retry.route_check": r.RouteCheck,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s %v: must be > 0", name, d))
		}
	}
	if r.BaseBackoff > r.MaxBackoff {
		errs = append(errs, fmt.Errorf("retry.base_backoff %v: must not exceed retry.max_backoff %v", r.BaseBackoff, r.MaxBackoff))
	}
	if c.Connections < 0 || c.Connections > 64 {
		errs = append(errs, fmt.Errorf("connections %d: must be 1..64", c.Connections))
	}
	if c.RouteCacheSize < 0 {
		errs = append(errs, fmt.Errorf("route_cache_size %d: must be >= 0", c.RouteCacheSize))
	}
	if b := c.Batching; b.MaxItems < 0 || b.MaxItems > 1000 || b.MaxBytes < 0 || b.MaxQueuedItems < 0 || b.MaxQueuedBytes < 0 || b.Linger < 0 {
		errs = append(errs, fmt.Errorf("batching %+v: max_items must be 1..1000 and the other bounds >= 0", b))
	}
	if n := c.Batching.MaxInFlight; n < 0 || n > 64 {
		errs = append(errs, fmt.Errorf("batching.max_in_flight %d: must be 1..64", n))
	}
	return errors.Join(errs...)
}

// baseURL turns a node address into the base URL of its API: "host:port"
// becomes "http://host:port"; http(s) URLs keep their scheme and lose a
// trailing slash.
func baseURL(addr string) (string, error) {
	a := strings.TrimSpace(addr)
	if strings.HasPrefix(a, "http://") || strings.HasPrefix(a, "https://") {
		u, err := url.Parse(a)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("address %q: not a usable URL", addr)
		}
		return strings.TrimSuffix(u.Scheme+"://"+u.Host+u.Path, "/"), nil
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return "", fmt.Errorf("address %q: want host:port or an http(s):// URL: %w", addr, err)
	}
	if port == "" {
		return "", fmt.Errorf("address %q: missing port", addr)
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// nodeURL is baseURL with the scheme of c: "host:port" is https:// when
// TLSConfig is set.
func (c Config) nodeURL(addr string) (string, error) {
	u, err := baseURL(addr)
	if err != nil {
		return "", err
	}
	a := strings.TrimSpace(addr)
	if c.TLSConfig != nil && !strings.HasPrefix(a, "http://") && !strings.HasPrefix(a, "https://") {
		u = "https://" + strings.TrimPrefix(u, "http://")
	}
	return u, nil
}

// clientOptions are the connect options of every node client: the
// protocol, the binary codec of codec.go (large PullMany answers decoded
// on two cores), gzip only with Gzip, and with a Token the Authorization
// header.
func (c Config) clientOptions() []connect.ClientOption {
	opts := append(c.Protocol.clientOptions(), connect.WithCodec(protoCodec{}))
	if !c.Gzip {
		opts = append(opts, connect.WithAcceptCompression("gzip", nil, nil))
	}
	if c.Token != "" {
		header := "Bearer " + c.Token
		opts = append(opts, connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", header)
				return next(ctx, req)
			}
		})))
	}
	return opts
}

// ownerURL turns the address a node gave for an owner (host:port, as Route
// answers it) into a base URL, taking the scheme from the node that answered
// and, when the owner listens on an unspecified host (":7070", "0.0.0.0:7070",
// "[::]:7070"), that node's host too. It returns "" when addr is empty or
// unusable: the caller then talks to the answering node, which forwards.
func ownerURL(addr, answeredBy string) string {
	if addr == "" {
		return ""
	}
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		u, err := baseURL(addr)
		if err != nil {
			return ""
		}
		return u
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return ""
	}
	via, err := url.Parse(answeredBy)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = via.Hostname()
	}
	return via.Scheme + "://" + net.JoinHostPort(host, port)
}

// pooledTransport is the default HTTPClient's transport: unary calls go
// round robin over calls (each a connection per node), Subscribe streams
// over streams. A connection's frames are read and written by one
// goroutine on each side, so a thousand concurrent unary calls run faster
// on a few connections than on one (docs/BENCHMARKS.md); long-lived
// streams, most of them idle, gain from sharing one: the node writes the
// deliveries of one commit to many of them together.
type pooledTransport struct {
	streams *http.Transport
	calls   []*http.Transport
	next    atomic.Uint32
}

func newPooledTransport(tlsConf *tls.Config, connections int) *pooledTransport {
	p := &pooledTransport{streams: defaultTransport(tlsConf)}
	for range connections {
		p.calls = append(p.calls, defaultTransport(tlsConf))
	}
	return p
}

func (p *pooledTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, sequencerv1connect.SequencerServiceSubscribeProcedure) {
		return p.streams.RoundTrip(r)
	}
	return p.calls[p.next.Add(1)%uint32(len(p.calls))].RoundTrip(r)
}

// CloseIdleConnections closes every idle connection of the pool.
func (p *pooledTransport) CloseIdleConnections() {
	p.streams.CloseIdleConnections()
	for _, t := range p.calls {
		t.CloseIdleConnections()
	}
}

// defaultTransport speaks HTTP/2 only: h2c with prior knowledge on http://
// (as gRPC needs) and HTTP/2 over TLS on https://, with tlsConf (nil: the
// system's defaults).
func defaultTransport(tlsConf *tls.Config) *http.Transport {
	var protocols http.Protocols
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Transport{
		Protocols: &protocols,
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		TLSClientConfig:     tlsConf.Clone(),
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
		HTTP2: &http.HTTP2Config{
			// A connection silent this long gets a ping; no answer within
			// PingTimeout closes it, so a crashed node (no FIN) is noticed.
			SendPingTimeout: 15 * time.Second,
			PingTimeout:     5 * time.Second,
			// DATA frames up to 1 MiB, not 16 KiB: a 2 MB PullMany
			// answer in a few frames, not about 130 (a write, a read
			// and a hand-over each); PullMany p50 1-2 ms lower
			// (docs/BENCHMARKS.md).
			MaxReadFrameSize: 1 << 20,
		},
	}
}
