package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	connectcors "connectrpc.com/cors"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/cors"
	"golang.org/x/net/http2"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/ratelog"
	"github.com/sequencer-im/sequencer/internal/reqid"
)

// The HTTP side of a node has two parts:
//
//   - the API (NewAPIMux): the Connect service at /sequencer.v1.SequencerService/
//     (gRPC, gRPC-Web, Connect binary and JSON), behind the guards of Edge
//     (bearer tokens, request size, CORS), plus gRPC reflection (behind the
//     token) and gRPC health (not) added by MountGRPCTools (grpctools.go);
//   - the admin endpoints (NewAdminMux): GET /healthz, GET /readyz and
//     GET /metrics, never behind a token.
//
// Without --admin-listen both are served on the API port (the admin mux is
// mounted at "/" of the API mux); with it, the admin mux has its own port
// and the API port serves only the RPCs.
//
// To add an operator endpoint (for example a web console), build the admin
// mux and register on it before serving:
//
//	admin := api.NewAdminMux(ready, reg, log)
//	admin.Handle("/console/", consoleHandler)
//
// Patterns follow net/http.ServeMux (Go 1.22 syntax: "GET /path", "/dir/").
// Whatever is registered there is reachable wherever the admin mux is served
// (the admin port, or the API port when --admin-listen is not set) and is
// not behind the API's bearer token: protect it with its own check or keep
// the admin port private.

// Edge configures the guards in front of the RPCs (NewAPIMux). The zero
// value guards nothing but the request size.
type Edge struct {
	// Tokens, when set, makes every RPC need "Authorization: Bearer <token>"
	// with a token of the set; other calls are answered unauthenticated
	// (HTTP 401) before anything is read or decoded.
	Tokens *Tokens
	// CORSOrigins are the browser origins allowed to call the API
	// ("https://app.example.com"; "*" allows any). Empty: no CORS headers,
	// browsers on other origins cannot call.
	CORSOrigins []string
	// MaxRequestBytes bounds an RPC's HTTP body. A larger body is answered
	// invalid_argument (never a retryable code). Default (<= 0): the
	// service's ReadMaxBytes.
	MaxRequestBytes int
	// RedirectToOwner answers a unary Connect Send that could not reach
	// the conversation's owner over the cluster link with HTTP 307 to the
	// owner's API address (redirect.go).
	RedirectToOwner bool
}

// NewAPIMux returns a mux serving svc's RPCs behind edge's guards, in this
// order: the request id (reqid: the caller's X-Request-Id when sane, else a
// new one; answered in the X-Request-Id response header and logged as
// request_id by a reqid.Handler), CORS (answers preflights), bearer token,
// request size, then the Connect handler. A unary Send in Connect's JSON
// form takes a direct path to the service instead of the Connect handler,
// with the same answer (sendjson.go); not when tracing is on.
func NewAPIMux(svc *Service, edge Edge) *http.ServeMux {
	return newAPIMux(svc, edge, svc.tracer == nil)
}

// newAPIMux is NewAPIMux; direct installs the direct path of JSON Sends
// (sendjson.go) in front of the Connect handler. The tests compare the two.
func newAPIMux(svc *Service, edge Edge, direct bool) *http.ServeMux {
	limit := edge.MaxRequestBytes
	if limit <= 0 {
		limit = svc.ReadMaxBytes()
	}
	path, h := svc.Handler(connect.WithReadMaxBytes(limit))
	ew := connect.NewErrorWriter()
	h = streamControl(h) // Subscribe's deadlines (subscribe.go)
	if direct {
		h = &sendJSON{svc: svc, ew: ew, next: h}
	}
	if edge.RedirectToOwner {
		h = redirectToOwner(h)
	}
	h = limitBody(svc, ew, int64(limit), h)
	h = needContentType(svc, h)
	if edge.Tokens != nil {
		h = requireToken(svc, ew, edge.Tokens, h)
	}
	if len(edge.CORSOrigins) > 0 {
		h = withCORS(edge.CORSOrigins, h)
	}
	h = reqid.Middleware(h)
	mux := http.NewServeMux()
	mux.Handle(path, h)
	return mux
}

// needContentType answers a POST whose Content-Type the API does not speak
// (none, or curl -d's application/x-www-form-urlencoded) HTTP 415 with a
// Connect error body (code invalid_argument) naming the types it speaks;
// the Connect handler alone would answer 415 with an empty body.
func needContentType(svc *Service, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ct := r.Header.Get("Content-Type")
		if r.Method != http.MethodPost || spokenContentType(ct) {
			next.ServeHTTP(w, r)
			return
		}
		svc.refuse(r, connect.CodeInvalidArgument)
		got := "missing"
		if ct != "" {
			got = strconv.Quote(ct) + " is not one the API speaks"
		}
		msg, _ := json.Marshal(map[string]string{"code": "invalid_argument",
			"message": "Content-Type " + got + ": send application/json (Connect JSON), application/proto (Connect binary), application/grpc or application/grpc-web"})
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Accept-Post", "application/json, application/proto, application/grpc, application/grpc-web")
		w.WriteHeader(http.StatusUnsupportedMediaType)
		_, _ = w.Write(append(msg, '\n'))
	})
}

// spokenContentType reports whether ct is a media type of the protocols the
// Connect handler serves (Connect unary and streaming, gRPC, gRPC-Web).
func spokenContentType(ct string) bool {
	mt := strings.ToLower(strings.TrimSpace(strings.SplitN(ct, ";", 2)[0]))
	switch mt {
	case "application/json", "application/proto", "application/connect+json", "application/connect+proto":
		return true
	}
	return strings.HasPrefix(mt, "application/grpc")
}

// NewAdminMux returns a mux serving:
//   - GET /healthz: 200 "ok" while the process runs;
//   - GET /readyz: 200 "ready" when ready() returns nil (ready nil means
//     always ready), else 503 "not ready: <reason>". The reason is the
//     domain message of the first *sequencer.Error in the chain (for example
//     "store unavailable"), else "not ready"; the full error (which may name
//     the store's host, user or database) is only logged, at WARN, once per
//     reason per NotReadyLogEvery;
//   - GET /metrics: reg in the Prometheus text format (not mounted when reg
//     is nil).
//
// log nil means slog.Default(). See the comment at the top of this file for
// adding handlers.
func NewAdminMux(ready func() error, reg *prometheus.Registry, log *slog.Logger) *http.ServeMux {
	if log == nil {
		log = slog.Default()
	}
	rl := ratelog.New(log, NotReadyLogEvery)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				reason := ReadyReason(err)
				rl.Warn("readyz:"+reason, "not ready", "reason", reason, "err", err)
				writeText(w, http.StatusServiceUnavailable, "not ready: "+reason)
				return
			}
		}
		writeText(w, http.StatusOK, "ready")
	})
	if reg != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	}
	return mux
}

// NotReadyLogEvery is how often /readyz logs one reason of not being ready.
const NotReadyLogEvery = 10 * time.Second

// ReadyReason is what /readyz shows of a readiness error: the Msg of the
// first *sequencer.Error in its chain (a fixed domain text), else "not
// ready". Never the cause below it.
func ReadyReason(err error) string {
	var se *sequencer.Error
	if errors.As(err, &se) && se.Msg != "" {
		return se.Msg
	}
	return "not ready"
}

// NewHTTPHandler serves everything on one port with no guards but the
// request size: the RPCs and the admin endpoints (see NewAdminMux). It is
// NewAPIMux(svc, Edge{}) with NewAdminMux mounted at "/".
func NewHTTPHandler(svc *Service, ready func() error, reg *prometheus.Registry) http.Handler {
	mux := NewAPIMux(svc, Edge{})
	mux.Handle("/", NewAdminMux(ready, reg, svc.log))
	return mux
}

// errTooLarge is the answer to a body above the limit: not retryable.
func errTooLarge(limit int64) *connect.Error {
	return connect.NewError(connect.CodeInvalidArgument,
		errors.New("request: larger than the "+strconv.FormatInt(limit, 10)+"-byte limit"))
}

// limitBody answers a request body above limit with invalid_argument, in the
// protocol the client speaks (Connect, gRPC, gRPC-Web), before the Connect
// handler sees it: Connect's own read limit answers resource_exhausted,
// which clients retry. The body is read here whole (the handler would buffer
// it anyway; every RPC is unary) into a pooled buffer and handed on as a
// reader of it; the buffer is reused once the handler returned (the Connect
// handler copies what it keeps: messages are unmarshaled, not aliased).
func limitBody(svc *Service, ew *connect.ErrorWriter, limit int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			svc.refuse(r, connect.CodeInvalidArgument)
			_ = ew.Write(w, r, errTooLarge(limit))
			return
		}
		b := getBody()
		defer putBody(b)
		if r.ContentLength > 0 {
			b.buf.Grow(int(r.ContentLength))
		}
		b.lim = io.LimitedReader{R: r.Body, N: limit + 1}
		n, err := b.buf.ReadFrom(&b.lim)
		b.lim = io.LimitedReader{}
		if err != nil {
			svc.refuse(r, connect.CodeCanceled)
			_ = ew.Write(w, r, connect.NewError(connect.CodeCanceled, errors.New("request body not received")))
			return
		}
		if n > limit {
			svc.refuse(r, connect.CodeInvalidArgument)
			_ = ew.Write(w, r, errTooLarge(limit))
			return
		}
		r.Body = b
		r.ContentLength = n
		next.ServeHTTP(w, r)
	})
}

// body is a request body read whole: the reader limitBody hands on.
type body struct {
	buf bytes.Buffer
	lim io.LimitedReader
	out []byte // sendJSON's answer
}

func (b *body) Read(p []byte) (int, error) { return b.buf.Read(p) }
func (b *body) Close() error               { return nil }

// maxPooledBody is the largest buffer kept for reuse: a Send's (bodies up to
// 64 KiB, base64 in JSON). Larger ones (big SendBatch requests) are left to
// the garbage collector.
const maxPooledBody = 128 << 10

var bodyPool = sync.Pool{New: func() any { return new(body) }}

func getBody() *body { return bodyPool.Get().(*body) }

func putBody(b *body) {
	if b.buf.Cap() > maxPooledBody {
		return
	}
	b.buf.Reset()
	bodyPool.Put(b)
}

// requireToken answers a request without a valid bearer token with
// unauthenticated (HTTP 401), saying nothing about the tokens.
func requireToken(svc *Service, ew *connect.ErrorWriter, tokens *Tokens, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tokens.Check(r.Header.Get("Authorization")) {
			svc.refuse(r, connect.CodeUnauthenticated)
			w.Header().Set("WWW-Authenticate", `Bearer realm="sequencer"`)
			_ = ew.Write(w, r, connect.NewError(connect.CodeUnauthenticated, errNoToken))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// withCORS answers browser preflights from origins and adds the CORS
// response headers Connect, gRPC-Web and the bearer token need.
func withCORS(origins []string, next http.Handler) http.Handler {
	c := cors.New(cors.Options{
		AllowedOrigins: origins,
		AllowedMethods: connectcors.AllowedMethods(),
		AllowedHeaders: append(connectcors.AllowedHeaders(), "Authorization", reqid.Header),
		ExposedHeaders: append(connectcors.ExposedHeaders(), reqid.Header),
		MaxAge:         7200, // seconds
	})
	return c.Handler(next)
}

func writeText(w http.ResponseWriter, status int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(text + "\n"))
}

// Server timeouts (NewServer). With HTTP/2 the read and write timeouts apply
// per stream, i.e. per RPC.
const (
	ReadHeaderTimeout = 10 * time.Second  // slow-loris guard on headers
	ReadTimeout       = 30 * time.Second  // whole request, body included
	WriteTimeout      = 60 * time.Second  // whole RPC, handler included
	IdleTimeout       = 120 * time.Second // keep-alive connections
	MaxHeaderBytes    = 64 << 10

	// MaxConcurrentStreams is how many streams a client may have open
	// at once on one HTTP/2 connection (SETTINGS_MAX_CONCURRENT_STREAMS;
	// net/http's default is 250). A push gateway's SDK puts up to this
	// many Subscribe streams on one connection, so the deliveries of one
	// commit to many of them share the connection's writes and the
	// client's reads, instead of a write and a read per delivery on up
	// to 40 connections (docs/BENCHMARKS.md). It bounds nothing a client
	// could not get with more connections: --max-subscriptions bounds
	// the node's streams.
	MaxConcurrentStreams = 10_000
)

// NewServer returns an http.Server for addr serving h over HTTP/1.1 and
// HTTP/2 cleartext (h2c with prior knowledge, as gRPC clients speak it) and,
// when served with TLS (ServeTLS, or TLSConfig with certificates), HTTP/2
// negotiated by ALPN and HTTP/1.1. Timeouts are the constants above; the
// caller may change the returned server's fields before serving, TLSConfig
// included.
//
// HTTP/2 is golang.org/x/net/http2's server (the upstream of the copy
// net/http bundles) for one setting net/http does not expose: the write
// scheduler. net/http's round robin walks every open stream of a
// connection for each frame it writes; with the change feed's many streams
// per connection (a subscriber's SDK multiplexes up to
// MaxConcurrentStreams), most of them idle, that walk was 13% of the
// server's CPU (docs/BENCHMARKS.md). The random scheduler holds only the
// streams that have frames queued. Under either, each stream's frames go
// out in the order they were written.
func NewServer(addr string, h http.Handler) *http.Server {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Addr:              addr,
		Handler:           h,
		Protocols:         &protocols,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
	// ConfigureServer registers x/net's server for "h2" (TLS, by ALPN) and
	// for net/http's "unencrypted_http2" hand-off (h2c with prior
	// knowledge). It fails only on a TLSConfig whose cipher suites lack
	// HTTP/2's; srv has none yet.
	if err := http2.ConfigureServer(srv, &http2.Server{NewWriteScheduler: newWriteScheduler, MaxConcurrentStreams: MaxConcurrentStreams}); err != nil {
		panic("api: " + err.Error())
	}
	return srv
}

func newWriteScheduler() http2.WriteScheduler { return http2.NewRandomWriteScheduler() }
