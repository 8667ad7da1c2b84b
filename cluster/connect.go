package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"

	"github.com/sequencer-im/sequencer/internal/tracing"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
	"github.com/sequencer-im/sequencer/proto/cluster/v1/clusterv1connect"
)

// ConnectConfig configures the connect-go transport.
type ConnectConfig struct {
	// Listen is host:port to listen on (port 0 picks a free one).
	Listen string
	// TLS, when set, is mutual TLS between nodes (LoadPeerTLS): the listener
	// serves HTTP/2 over TLS and dials peers with TLS. When nil, both sides
	// speak HTTP/2 without TLS (h2c): only for a loopback Listen, or when
	// Insecure allows it.
	TLS *PeerTLS
	// Insecure allows h2c on a non-loopback Listen (--cluster-insecure).
	Insecure bool
	// MaxRequestBytes bounds one request's encoded size (a forwarded
	// batch). Default 8 MiB.
	MaxRequestBytes int
	// Logger receives transport failures. Default: slog.Default().
	Logger *slog.Logger
	// TracerProvider, when set, traces the calls on both sides
	// (otelconnect): the receiving node's span is the child of the calling
	// node's (peers are authenticated). nil: no tracing.
	TracerProvider trace.TracerProvider
}

// PeerTLS is the mutual TLS of the cluster port: the node's certificate
// (presented on both sides) and the cluster CA that every peer's
// certificate must chain to.
type PeerTLS struct {
	Server *tls.Config // the listener: requires and verifies client certificates
	Client *tls.Config // dialing peers: presents the certificate, verifies the peer's chain
}

// LoadPeerTLS reads the node's certificate and key and the cluster CA (PEM
// files) and builds both sides of mutual TLS:
//   - the listener requires a client certificate that chains to the CA
//     (tls.RequireAndVerifyClientCert; the certificate must allow client
//     authentication: extended key usage clientAuth, or none);
//   - a dialing node verifies that the peer's certificate chains to the CA
//     (extended key usage serverAuth, or none) but not its host name: nodes
//     dial each other by the address in the membership table, often an IP
//     address, and the CA is the cluster's own, so membership of the cluster
//     is proven by the chain. Use a CA that signs nothing but this cluster's
//     node certificates.
func LoadPeerTLS(certFile, keyFile, caFile string) (*PeerTLS, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("cluster tls certificate: %w", err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("cluster ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("cluster ca %s: no PEM certificate found", caFile)
	}
	return NewPeerTLS(cert, pool), nil
}

// NewPeerTLS builds mutual TLS from a loaded certificate and the cluster CA
// pool (see LoadPeerTLS).
func NewPeerTLS(cert tls.Certificate, ca *x509.CertPool) *PeerTLS {
	server := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    ca,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		NextProtos:   []string{"h2"},
	}
	client := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"},
		// The chain is verified below, against the cluster CA; the host
		// name is not (see LoadPeerTLS).
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("cluster peer presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots: ca, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			if err != nil {
				return fmt.Errorf("cluster peer certificate: %w", err)
			}
			return nil
		},
	}
	return &PeerTLS{Server: server, Client: client}
}

// IsLoopback reports whether the host of addr (host:port) is a loopback
// address or "localhost". An empty host (all interfaces) is not.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ConnectTransport is the Transport over connect-go: every node serves
// ClusterService (proto/cluster/v1) on its cluster port, HTTP/2 with mutual
// TLS, or h2c on loopback; forwarded batches are unary calls, wake-ups are
// unary calls nobody waits for. Any number can run in one process.
type ConnectTransport struct {
	cfg    ConnectConfig
	client *http.Client
	scheme string

	mu      sync.Mutex
	srv     *http.Server
	ln      net.Listener
	clients map[string]clusterv1connect.ClusterServiceClient
	closed  bool
	ctx     context.Context // handlers' base context, canceled by Close
	cancel  context.CancelFunc
	served  chan struct{}
}

var _ Transport = (*ConnectTransport)(nil)

// DefaultMaxRequestBytes bounds one node-to-node request (ConnectConfig).
const DefaultMaxRequestBytes = 8 << 20

// TestDialFromEnv, for tests only, names the local IP this node dials its
// peers from (e.g. 127.0.0.12), so that the e2e nemesis's proxies tell a
// node's links apart by source address (docs/TESTING.md "Network faults").
// Never set in production: an unparsable or empty value changes nothing.
const TestDialFromEnv = "SEQUENCER_TEST_CLUSTER_DIAL_FROM"

// NewConnectTransport checks cfg and returns a transport that listens on
// cfg.Listen once started.
func NewConnectTransport(cfg ConnectConfig) (*ConnectTransport, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return nil, fmt.Errorf("cluster listen %q: %w", cfg.Listen, err)
	}
	if cfg.TLS == nil && !cfg.Insecure && !IsLoopback(cfg.Listen) {
		return nil, fmt.Errorf("cluster listen %s is not a loopback address: set --cluster-tls-cert, --cluster-tls-key and --cluster-ca (or --cluster-insecure)", cfg.Listen)
	}
	var protocols http.Protocols
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}
	if ip := net.ParseIP(os.Getenv(TestDialFromEnv)); ip != nil {
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}
	tr := &http.Transport{
		Protocols:           &protocols,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		DialContext:         dialer.DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		// A peer that stops answering (frozen, cable cut) is noticed by
		// HTTP/2 pings, not only by the callers' deadlines.
		HTTP2: &http.HTTP2Config{SendPingTimeout: 2 * time.Second, PingTimeout: 2 * time.Second},
	}
	t := &ConnectTransport{cfg: cfg, clients: map[string]clusterv1connect.ClusterServiceClient{}}
	if cfg.TLS != nil {
		protocols.SetHTTP2(true)
		tr.TLSClientConfig = cfg.TLS.Client
		t.scheme = "https://"
	} else {
		protocols.SetUnencryptedHTTP2(true)
		t.scheme = "http://"
	}
	t.client = &http.Client{Transport: tr}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t, nil
}

// Start listens and serves h; it returns the bound address.
func (t *ConnectTransport) Start(h Handler) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.srv != nil || t.closed {
		return "", errors.New("cluster transport already started")
	}
	ln, err := net.Listen("tcp", t.cfg.Listen)
	if err != nil {
		return "", fmt.Errorf("cluster listen: %w", err)
	}
	mux := http.NewServeMux()
	hopts := []connect.HandlerOption{
		connect.WithReadMaxBytes(t.cfg.MaxRequestBytes),
		// Nodes are close (a LAN): compression costs more CPU than it saves.
		connect.WithCompressMinBytes(math.MaxInt),
	}
	if ic := tracing.Interceptor(t.cfg.TracerProvider, true); ic != nil {
		hopts = append(hopts, ic)
	}
	mux.Handle(clusterv1connect.NewClusterServiceHandler(&clusterService{h: h}, hopts...))
	mux.HandleFunc("GET "+probePath, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	var protocols http.Protocols
	srv := &http.Server{
		Handler:           mux,
		Protocols:         &protocols,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return t.ctx },
		ErrorLog:          slog.NewLogLogger(t.cfg.Logger.Handler(), slog.LevelDebug),
	}
	if t.cfg.TLS != nil {
		protocols.SetHTTP2(true)
		srv.TLSConfig = t.cfg.TLS.Server.Clone()
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	t.srv, t.ln, t.served = srv, ln, make(chan struct{})
	go func() {
		defer close(t.served)
		var err error
		if t.cfg.TLS != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.cfg.Logger.Error("cluster transport stopped serving", "err", err)
		}
	}()
	return ln.Addr().String(), nil
}

func (t *ConnectTransport) peer(addr string) (clusterv1connect.ClusterServiceClient, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errTransportClosed
	}
	c, ok := t.clients[addr]
	if !ok {
		copts := []connect.ClientOption{
			connect.WithReadMaxBytes(t.cfg.MaxRequestBytes), connect.WithSendMaxBytes(t.cfg.MaxRequestBytes),
			connect.WithAcceptCompression("gzip", nil, nil), // no compression between nodes
		}
		if ic := tracing.Interceptor(t.cfg.TracerProvider, true); ic != nil {
			copts = append(copts, ic)
		}
		c = clusterv1connect.NewClusterServiceClient(t.client, t.scheme+addr, copts...)
		t.clients[addr] = c
	}
	return c, nil
}

// errTransportClosed fails forwards after the transport closed.
var errTransportClosed = errors.New("cluster transport closed")

// Forward calls ClusterService.Forward on the node at addr.
func (t *ConnectTransport) Forward(ctx context.Context, addr string, req *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
	c, err := t.peer(addr)
	if err != nil {
		return nil, err
	}
	// Close cancels the calls in flight.
	ctx, stop := mergeCancel(ctx, t.ctx)
	defer stop()
	res, err := c.Forward(ctx, connect.NewRequest(req))
	if err != nil {
		if ctx.Err() != nil && t.ctx.Err() == nil {
			return nil, ctx.Err()
		}
		if connect.CodeOf(err) == connect.CodePermissionDenied {
			var ce *connect.Error
			msg := err.Error()
			if errors.As(err, &ce) {
				msg = ce.Message()
			}
			return nil, &RefusedError{Msg: msg}
		}
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, fmt.Errorf("forward to %s: %w (%w)", addr, ErrNotSent, err)
		}
		return nil, fmt.Errorf("forward to %s: %w", addr, err)
	}
	return res.Msg, nil
}

// probePath answers any GET at once (Probe). A node without it answers 404,
// which proves the link as well.
const probePath = "/sequencer.cluster.probe"

var _ Prober = (*ConnectTransport)(nil)

// Probe asks the node at addr for any HTTP answer over the client that
// carries forwards (HTTP/2: the same connection as the forwards in flight,
// while it takes new streams). An error means no answer came before ctx
// ended, or the node cannot be reached.
func (t *ConnectTransport) Probe(ctx context.Context, addr string) error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return errTransportClosed
	}
	ctx, stop := mergeCancel(ctx, t.ctx)
	defer stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.scheme+addr+probePath, nil)
	if err != nil {
		return err
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<10))
	return resp.Body.Close()
}

// newConnectTransport is a node's default transport by its config: connect-go
// on ClusterListen, with mutual TLS when the certificate files are set.
func newConnectTransport(cfg Config) (*ConnectTransport, error) {
	var peerTLS *PeerTLS
	if cfg.TLSCertFile != "" {
		var err error
		if peerTLS, err = LoadPeerTLS(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSCAFile); err != nil {
			return nil, err
		}
	}
	maxReq := DefaultMaxRequestBytes
	if m := cfg.MaxBody + 1<<20; m > maxReq {
		maxReq = m
	}
	return NewConnectTransport(ConnectConfig{Listen: cfg.ClusterListen, TLS: peerTLS, Insecure: cfg.Insecure,
		MaxRequestBytes: maxReq, Logger: cfg.Logger, TracerProvider: cfg.TracerProvider})
}

// mergeCancel returns ctx, also canceled when other is.
func mergeCancel(ctx, other context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(other, cancel)
	return ctx, func() { stop(); cancel() }
}

// Wake calls ClusterService.Wake on the node at addr in the background.
func (t *ConnectTransport) Wake(addr string, w *clusterv1.WakeRequest) {
	c, err := t.peer(addr)
	if err != nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(t.ctx, 5*time.Second)
		defer cancel()
		if _, err := c.Wake(ctx, connect.NewRequest(w)); err != nil && t.ctx.Err() == nil {
			t.cfg.Logger.Debug("wake-up not delivered", "addr", addr, "err", err)
		}
	}()
}

// Close cancels the handlers and calls in flight, stops the listener and
// drops idle connections.
func (t *ConnectTransport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	srv, served := t.srv, t.served
	t.mu.Unlock()
	t.cancel()
	var err error
	if srv != nil {
		err = srv.Close()
		<-served
	}
	t.client.CloseIdleConnections()
	return err
}

// clusterService adapts a Handler to the generated connect handler.
type clusterService struct {
	clusterv1connect.UnimplementedClusterServiceHandler
	h Handler
}

func (s *clusterService) Forward(ctx context.Context, req *connect.Request[clusterv1.ForwardBatch]) (*connect.Response[clusterv1.ForwardBatchReply], error) {
	reply, err := s.h.HandleForward(ctx, req.Msg)
	if err != nil {
		var re *RefusedError
		if errors.As(err, &re) {
			return nil, connect.NewError(connect.CodePermissionDenied, errors.New(re.Msg))
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewResponse(reply), nil
}

func (s *clusterService) Wake(ctx context.Context, req *connect.Request[clusterv1.WakeRequest]) (*connect.Response[clusterv1.WakeReply], error) {
	peer := req.Peer().Addr
	if host, _, err := net.SplitHostPort(peer); err == nil {
		peer = host
	}
	s.h.HandleWake(peer, req.Msg)
	return connect.NewResponse(&clusterv1.WakeReply{}), nil
}
