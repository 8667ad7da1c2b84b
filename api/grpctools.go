package api

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	"github.com/sequencer-im/sequencer/internal/reqid"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// The gRPC tools' services on the API port (MountGRPCTools), so that grpcurl,
// grpcui, Postman, grpc_health_probe, Kubernetes gRPC probes and Envoy work
// unmodified:
//
//   - grpc.reflection.v1 and grpc.reflection.v1alpha (connectrpc.com/grpcreflect):
//     the descriptors of sequencer.v1.SequencerService, grpc.health.v1.Health
//     and the reflection services themselves; behind the bearer token when
//     tokens are on (the schema is the API's, not an operator endpoint);
//   - grpc.health.v1.Health, Check and Watch (connectrpc.com/grpchealth),
//     never behind the token: a load balancer's or kubelet's probe carries
//     none. Health says SERVING exactly when the node's readiness (what
//     /readyz answers 200 for) holds, NOT_SERVING otherwise and from the
//     start of a drain on (Health.Drain).

// HealthService is the service name a health check may ask for besides ""
// (the whole server): both have the same status. Any other name is
// not_found, as the gRPC health protocol says.
const HealthService = sequencerv1connect.SequencerServiceName

// WatchEvery is how often an open Watch stream re-checks readiness (one
// store ping each, as a /readyz probe) to notice a change that is not a
// drain (the store going down or back up, the worker-id lease lost). A
// drain is seen at once.
const WatchEvery = time.Second

// Health is the node's grpc.health.v1 checker: a grpchealth.Checker and
// grpchealth.Watcher whose status follows ready (the /readyz function; nil
// means always ready) until Drain. Safe for concurrent use.
type Health struct {
	ready   func() error
	every   time.Duration
	drained chan struct{}
	once    sync.Once
}

var (
	_ grpchealth.Checker = (*Health)(nil)
	_ grpchealth.Watcher = (*Health)(nil)
)

// NewHealth returns a Health answering from ready.
func NewHealth(ready func() error) *Health {
	return &Health{ready: ready, every: WatchEvery, drained: make(chan struct{})}
}

// Drain turns the status NOT_SERVING for good: a node calls it as its drain
// starts (SIGTERM). Each open Watch stream is sent NOT_SERVING (unless that
// was its last status already) and then ends with unavailable, so that no
// stream holds the graceful stop of the HTTP server open. Idempotent.
func (h *Health) Drain() { h.once.Do(func() { close(h.drained) }) }

func (h *Health) draining() bool {
	select {
	case <-h.drained:
		return true
	default:
		return false
	}
}

// Status is what a check answers now: NOT_SERVING while draining or not
// ready, else SERVING.
func (h *Health) Status() grpchealth.Status {
	if h.draining() {
		return grpchealth.StatusNotServing
	}
	if h.ready != nil && h.ready() != nil {
		return grpchealth.StatusNotServing
	}
	return grpchealth.StatusServing
}

func knownService(name string) error {
	if name == "" || name == HealthService {
		return nil
	}
	return connect.NewError(connect.CodeNotFound, errors.New("unknown service: this server answers \"\" and "+HealthService))
}

// errDrained ends a Watch stream once NOT_SERVING was sent during a drain.
var errDrained = connect.NewError(connect.CodeUnavailable, errors.New("the node is shutting down"))

// Check implements grpchealth.Checker.
func (h *Health) Check(ctx context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	if err := knownService(req.Service); err != nil {
		return nil, err
	}
	status := h.Status()
	if w, _ := ctx.Value(watchKey{}).(*watchState); w != nil && status == grpchealth.StatusNotServing && h.draining() {
		// grpchealth's Watch loop calls Check after each onChange and sends
		// the status when it changed. The first check of a drain answers
		// NOT_SERVING and queues one more round (onChange keeps one pending
		// signal); that round ends the stream.
		w.mu.Lock()
		ended, onChange := w.drainSeen, w.onChange
		w.drainSeen = true
		w.mu.Unlock()
		if ended {
			return nil, errDrained
		}
		if onChange != nil {
			onChange()
		}
	}
	return &grpchealth.CheckResponse{Status: status}, nil
}

// watchKey carries a Watch stream's *watchState in its request context
// (set by watchStream before grpchealth's handler runs).
type watchKey struct{}

type watchState struct {
	mu        sync.Mutex
	onChange  func()
	drainSeen bool
}

// Watch implements grpchealth.Watcher: onChange is called every h.every and
// at once when the drain starts; grpchealth's handler then checks and sends
// the status when it changed.
func (h *Health) Watch(ctx context.Context, req *grpchealth.CheckRequest, onChange func()) (func(), error) {
	if err := knownService(req.Service); err != nil {
		return nil, err
	}
	if w, _ := ctx.Value(watchKey{}).(*watchState); w != nil {
		w.mu.Lock()
		w.onChange = onChange
		w.mu.Unlock()
	}
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(h.every)
		defer t.Stop()
		drained := h.drained
		for {
			select {
			case <-stop:
				return
			case <-drained:
				drained = nil // once; the ticks go on until the stream ends
				onChange()
			case <-t.C:
				onChange()
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(stop) }) }, nil
}

// watchStream prepares a Watch stream: its *watchState in the context, and
// no read or write deadline (the server's per-request timeouts would cut a
// long-lived stream).
func watchStream(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), watchKey{}, &watchState{})))
	})
}

// reflectedServices are the services grpc.reflection lists.
var reflectedServices = []string{
	sequencerv1connect.SequencerServiceName,
	grpchealth.HealthV1ServiceName,
	grpcreflect.ReflectV1ServiceName,
	grpcreflect.ReflectV1AlphaServiceName,
}

// MountGRPCTools adds grpc.reflection.v1, grpc.reflection.v1alpha and
// grpc.health.v1 to mux (a mux of NewAPIMux), with edge's request id and
// CORS; reflection also behind edge's bearer token, health never. Their
// requests are read in a stream (reflection is a bidirectional stream), not
// whole as the API's are, with the same size limit per message.
func MountGRPCTools(mux *http.ServeMux, svc *Service, health *Health, edge Edge) {
	limit := edge.MaxRequestBytes
	if limit <= 0 {
		limit = svc.ReadMaxBytes()
	}
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(limit)}
	ew := connect.NewErrorWriter()
	guard := func(h http.Handler, token bool) http.Handler {
		if token && edge.Tokens != nil {
			h = requireToken(svc, ew, edge.Tokens, h)
		}
		if len(edge.CORSOrigins) > 0 {
			h = withCORS(edge.CORSOrigins, h)
		}
		return reqid.Middleware(h)
	}
	reflector := grpcreflect.NewStaticReflector(reflectedServices...)
	for _, mk := range []func(*grpcreflect.Reflector, ...connect.HandlerOption) (string, http.Handler){
		grpcreflect.NewHandlerV1, grpcreflect.NewHandlerV1Alpha,
	} {
		path, h := mk(reflector, opts...)
		mux.Handle(path, guard(h, true))
	}
	path, h := grpchealth.NewHandler(health, opts...)
	hh := guard(h, false)
	mux.Handle(path, hh)
	mux.Handle(path+"Watch", guard(watchStream(h), false))
}
