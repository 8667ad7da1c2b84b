package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// gatewayName is the name of the actor every node serves forwarded sends
// and wake-ups on (node-to-node protocol: never rename).
const gatewayName = "sequencer-gateway"

// RemoteConfig configures the protoactor-go remote transport.
type RemoteConfig struct {
	// Listen is host:port to listen on (port 0 picks a free one).
	Listen string
	// Logger receives the library's warnings and errors (its info chatter
	// is dropped). Default: slog.Default().
	Logger *slog.Logger
}

// RemoteTransport is the Transport over protoactor-go remote (gRPC streams
// between actor systems). Each node runs its own actor system with one
// named gateway actor; forwarded sends are requests to the owner's gateway,
// answered with a ForwardReply. Only package remote is used, not the
// library's gossip cluster.
//
// Run at most one per process: the library sets grpc's process-global
// logger on every start, which races with the gRPC goroutines of a remote
// already running (several nodes in one process: use MemNetwork).
type RemoteTransport struct {
	cfg RemoteConfig

	mu       sync.Mutex
	system   *actor.ActorSystem
	remote   *remote.Remote
	ctx      context.Context // handlers' context, canceled by Close
	cancel   context.CancelFunc
	handlers sync.WaitGroup
	closed   bool
	done     chan struct{} // closed by Close: waiting forwards give up
}

var _ Transport = (*RemoteTransport)(nil)

// errTransportClosed fails forwards still waiting when the transport closes.
var errTransportClosed = errors.New("cluster transport closed")

// NewRemoteTransport returns a transport that listens on cfg.Listen once
// started.
func NewRemoteTransport(cfg RemoteConfig) *RemoteTransport {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &RemoteTransport{cfg: cfg, done: make(chan struct{})}
}

// warnHandler drops records below Warn (the library logs every connection
// at Info).
type warnHandler struct{ slog.Handler }

func (h warnHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}
func (h warnHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return warnHandler{h.Handler.WithAttrs(as)}
}
func (h warnHandler) WithGroup(name string) slog.Handler {
	return warnHandler{h.Handler.WithGroup(name)}
}

// Start listens, spawns the gateway actor and returns the bound address.
func (t *RemoteTransport) Start(h Handler) (addr string, err error) {
	host, portStr, err := net.SplitHostPort(t.cfg.Listen)
	if err != nil {
		return "", fmt.Errorf("cluster listen %q: %w", t.cfg.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return "", fmt.Errorf("cluster listen %q: port: %w", t.cfg.Listen, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.system != nil || t.closed {
		return "", errors.New("remote transport already started")
	}
	// The library panics on a failed listen, after touching process-global
	// state; find out first.
	probe, err := net.Listen("tcp", t.cfg.Listen)
	if err != nil {
		return "", fmt.Errorf("cluster listen: %w", err)
	}
	probe.Close()
	logger := slog.New(warnHandler{t.cfg.Logger.Handler()}).With("lib", "protoactor")
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	r := remote.NewRemote(system, remote.Configure(host, port))
	if err := startRemote(r); err != nil {
		system.Shutdown()
		return "", fmt.Errorf("cluster listen %s: %w", t.cfg.Listen, err)
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	props := actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *clusterv1.ForwardSend:
			sender := c.Sender()
			if sender == nil {
				return
			}
			t.handlers.Add(1)
			go func() {
				defer t.handlers.Done()
				reply := h.HandleForward(t.ctx, m)
				system.Root.Send(sender, reply)
			}()
		case *clusterv1.Wake:
			h.HandleWake(m)
		}
	})
	if _, err := system.Root.SpawnNamed(props, gatewayName); err != nil {
		r.Shutdown(false)
		system.Shutdown()
		return "", fmt.Errorf("spawn cluster gateway: %w", err)
	}
	t.system, t.remote = system, r
	return system.Address(), nil
}

// startRemote starts r, turning the library's panic on a failed listen into
// an error.
func startRemote(r *remote.Remote) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	r.Start()
	return nil
}

// Forward asks the gateway at addr to handle req and waits for its reply
// until ctx ends.
func (t *RemoteTransport) Forward(ctx context.Context, addr string, req *clusterv1.ForwardSend) (*clusterv1.ForwardReply, error) {
	t.mu.Lock()
	system := t.system
	closed := t.closed
	t.mu.Unlock()
	if system == nil || closed {
		return nil, errors.New("remote transport not running")
	}
	timeout := time.Minute
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	// The future outlives ctx a little, so a deadline reads as ctx's error.
	f := system.Root.RequestFuture(actor.NewPID(addr, gatewayName), req, timeout+time.Second)
	type outcome struct {
		res any
		err error
	}
	ch := make(chan outcome, 1)
	go func() {
		res, err := f.Result()
		ch <- outcome{res, err}
	}()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.done:
		return nil, fmt.Errorf("request to %s: %w", addr, errTransportClosed)
	case o := <-ch:
		if o.err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("request to %s: %w", addr, o.err)
		}
		switch r := o.res.(type) {
		case *clusterv1.ForwardReply:
			return r, nil
		case *actor.DeadLetterResponse:
			return nil, fmt.Errorf("request to %s: no gateway there (dead letter)", addr)
		default:
			return nil, fmt.Errorf("request to %s: unexpected reply %T", addr, o.res)
		}
	}
}

// Wake sends w to the gateway at addr without waiting.
func (t *RemoteTransport) Wake(addr string, w *clusterv1.Wake) {
	t.mu.Lock()
	system, closed := t.system, t.closed
	t.mu.Unlock()
	if system == nil || closed {
		return
	}
	system.Root.Send(actor.NewPID(addr, gatewayName), w)
}

// Close cancels the running handlers, waits for them, and stops the remote
// and the actor system.
func (t *RemoteTransport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.done)
	system, r, cancel := t.system, t.remote, t.cancel
	t.mu.Unlock()
	if system == nil {
		return nil
	}
	cancel()
	t.handlers.Wait()
	// Not the library's graceful shutdown: its endpoint-manager stop writes
	// shared fields without synchronization (a data race under -race) and
	// can wait 10 s for gRPC. Stopping the gRPC server ends the incoming
	// streams; outgoing connections end with the process.
	r.Shutdown(false)
	system.Shutdown()
	return nil
}
