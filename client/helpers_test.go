package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sequencer-im/sequencer/client"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/server"
)

var quiet = slog.New(slog.DiscardHandler)

// startNode runs a single sequencer node in process on the embedded store
// under dir, listening on listen (e.g. "127.0.0.1:0"); it is shut down when
// the test ends (a second Shutdown is harmless).
func startNode(t *testing.T, dir, listen string) *server.Server {
	t.Helper()
	s, err := tryStartNode(dir, listen)
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() { shutdown(t, s) })
	return s
}

// startNodeTB is startNode for benchmarks, on 127.0.0.1:0.
func startNodeTB(tb testing.TB, dir string) *server.Server {
	tb.Helper()
	s, err := tryStartNode(dir, "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("start node: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s
}

func tryStartNode(dir, listen string) (*server.Server, error) {
	return server.Start(context.Background(), server.Config{
		Listen: listen, Store: "sqlite:" + filepath.Join(dir, "sequencer.db"), NodeID: "node-1",
	}, quiet)
}

func shutdown(t *testing.T, s *server.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.Shutdown(ctx)
}

// deadAddr returns an address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// h2cTransport is an HTTP/2-only cleartext transport, like the client's default.
func h2cTransport() *http.Transport {
	var p http.Protocols
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Transport{Protocols: &p}
}

// attempt is one RPC request as the transport saw it.
type attempt struct {
	host        string
	method      string // "Send", "Route", ...
	clientMsgID string // Send (or a SendBatch of one item) only, when the body is plain protobuf (Connect protocol)
	err         error  // the transport's error, nil if a response came back
}

// recorder is an http.RoundTripper that records every RPC request and can
// inject failures. With the Connect protocol a unary request body is the
// plain protobuf message, so Send's client_msg_id can be read from it.
type recorder struct {
	base http.RoundTripper
	// loseAnswer, if set, is asked before each request; true means: deliver
	// the request, then drop the answer and report a connection reset.
	loseAnswer func(a attempt) bool

	mu       sync.Mutex
	attempts []attempt
	changed  chan struct{} // closed and replaced on every new attempt
}

// newRecorder returns a recorder over an h2c transport whose connections are
// closed when the test ends (before the nodes it started earlier stop, so
// their graceful shutdown does not wait for them).
func newRecorder(t *testing.T) *recorder {
	base := h2cTransport()
	t.Cleanup(base.CloseIdleConnections)
	return &recorder{base: base, changed: make(chan struct{})}
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	a := attempt{host: req.URL.Host, method: req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]}
	if (a.method == "Send" || a.method == "SendBatch") && req.Header.Get("Content-Type") == "application/proto" {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		var m sequencerv1.SendRequest
		var b sequencerv1.SendBatchRequest
		switch {
		case a.method == "Send" && proto.Unmarshal(body, &m) == nil:
			a.clientMsgID = m.GetClientMsgId()
		case a.method == "SendBatch" && proto.Unmarshal(body, &b) == nil && len(b.GetItems()) == 1:
			a.clientMsgID = b.GetItems()[0].GetClientMsgId()
		}
	}
	if a.method == "SendBatch" {
		// The client batches by default; these tests send one message at a
		// time, so a batch is one send attempt and the retry tests hold on
		// both paths.
		a.method = "Send"
	}
	lose := r.loseAnswer != nil && r.loseAnswer(a)
	resp, err := r.base.RoundTrip(req)
	if err == nil && lose {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		resp, err = nil, &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer (injected)")}
	}
	a.err = err
	r.mu.Lock()
	r.attempts = append(r.attempts, a)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
	return resp, err
}

// of returns the recorded attempts of one RPC method.
func (r *recorder) of(method string) []attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []attempt
	for _, a := range r.attempts {
		if a.method == method {
			out = append(out, a)
		}
	}
	return out
}

func (r *recorder) all() []attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.attempts)
}

// waitFor blocks until cond holds on the recorded attempts, or fails the
// test after a deadline.
func (r *recorder) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func newClient(t *testing.T, cfg client.Config) *client.Client {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
