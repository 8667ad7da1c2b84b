package api

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewHTTPHandler serves everything on one port:
//   - the Connect service at /sequencer.v1.SequencerService/ (gRPC, gRPC-Web,
//     Connect binary and JSON);
//   - GET /healthz: 200 "ok" while the process runs;
//   - GET /readyz: 200 "ready" when ready() returns nil, else 503 with the
//     reason (ready nil means always ready);
//   - GET /metrics: reg in the Prometheus text format (not mounted when reg
//     is nil).
func NewHTTPHandler(svc *Service, ready func() error, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	path, h := svc.Handler()
	mux.Handle(path, h)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
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
)

// NewServer returns an http.Server for addr serving h over HTTP/1.1 and
// HTTP/2 cleartext (h2c with prior knowledge, as gRPC clients speak it) and,
// if the caller serves TLS, HTTP/2 over TLS. Timeouts are the constants
// above; the caller may change the returned server's fields before serving.
func NewServer(addr string, h http.Handler) *http.Server {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		Protocols:         &protocols,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}
