package client_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
	"github.com/sequencer-im/sequencer/internal/testcert"
	"github.com/sequencer-im/sequencer/server"
)

// secureNode runs a node serving the API with TLS, client certificates from
// ca and the bearer token "tok-123".
func secureNode(t *testing.T, ca *testcert.CA) *server.Server {
	t.Helper()
	dir := t.TempDir()
	srv := ca.Server(t)
	s, err := server.Start(context.Background(), server.Config{
		Listen: "127.0.0.1:0", Store: "sqlite:" + filepath.Join(dir, "sequencer.db"), NodeID: "secure-1",
		TLSCert:       testcert.Write(t, dir, "server.pem", srv.CertPEM),
		TLSKey:        testcert.Write(t, dir, "server.key", srv.KeyPEM),
		ClientCA:      testcert.Write(t, dir, "ca.pem", ca.PEM),
		AuthTokenFile: testcert.Write(t, dir, "tokens", []byte("# logic layer\ntok-123\n")),
	}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, s) })
	return s
}

// requests reads sequencer_rpc_requests_total{method,code} of s.
func requests(t *testing.T, s *server.Server, method, code string) float64 {
	t.Helper()
	var m dto.Metric
	if err := s.Metrics().Requests.WithLabelValues(method, code).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// sendRequests counts the Send and SendBatch requests (the SDK batches by
// default) that s answered with code.
func sendRequests(t *testing.T, s *server.Server, code string) float64 {
	t.Helper()
	return requests(t, s, "Send", code) + requests(t, s, "SendBatch", code)
}

// retries counts the client's "retrying" debug lines.
type retries struct{ buf syncBuf }

func (r *retries) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&r.buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
func (r *retries) count() int { return strings.Count(r.buf.String(), "sequencer client: retrying") }

func TestTLSAndToken(t *testing.T) {
	ca := testcert.NewCA(t, "api ca")
	s := secureNode(t, ca)
	good := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "logic-layer").TLS}}
	ctx := context.Background()

	for _, p := range []client.Protocol{client.ProtocolGRPC, client.ProtocolConnect, client.ProtocolGRPCWeb} {
		c, err := client.New(client.Config{Addrs: []string{s.Addr()}, TLSConfig: good, Token: "tok-123", Protocol: p, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Send(ctx, client.SendRequest{ConvID: "g:tls", FromUID: 7, Body: []byte("hi")})
		if err != nil {
			t.Fatalf("%v: send over TLS with a token: %v", p, err)
		}
		msgs, err := c.Pull(ctx, "g:tls", res.Seq-1, 10)
		if err != nil || len(msgs.Messages) != 1 {
			t.Fatalf("%v: pull: %v %v", p, msgs, err)
		}
		c.Close()
	}

	// A wrong or missing token: unauthenticated, one attempt, not retried.
	for _, token := range []string{"", "tok-124"} {
		var r retries
		before := sendRequests(t, s, "unauthenticated")
		c, err := client.New(client.Config{Addrs: []string{s.Addr()}, TLSConfig: good, Token: token, Logger: r.logger()})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Send(ctx, client.SendRequest{ConvID: "g:tls", FromUID: 7})
		c.Close()
		if connect.CodeOf(err) != connect.CodeUnauthenticated || client.ErrorCode(err) != client.CodeUnauthenticated ||
			client.ErrorCode(err).String() != "unauthenticated" {
			t.Fatalf("token %q: %v (client.ErrorCode %v), want unauthenticated", token, err, client.ErrorCode(err))
		}
		if got := sendRequests(t, s, "unauthenticated") - before; got != 1 || r.count() != 0 {
			t.Fatalf("token %q: %v requests reached the node, %d retries; want 1 and 0", token, got, r.count())
		}
	}

	// A server certificate from an unknown CA fails the client's own
	// verification: not retried (it would fail again).
	other := testcert.NewCA(t, "other ca")
	{
		var r retries
		c, err := client.New(client.Config{Addrs: []string{s.Addr()}, Token: "tok-123", Logger: r.logger(),
			TLSConfig: &tls.Config{RootCAs: other.Pool(), Certificates: []tls.Certificate{ca.Client(t, "logic-layer").TLS}}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Send(ctx, client.SendRequest{ConvID: "g:tls", FromUID: 7})
		c.Close()
		if err == nil || r.count() != 0 {
			t.Fatalf("unknown server CA: %v after %d retries, want a failure and no retry\n%s", err, r.count(), r.buf.String())
		}
	}
	// No client certificate, or one from another CA: the node refuses the
	// handshake and no request reaches the service. (With TLS 1.3 the client
	// may see the refusal as a reset connection, which the SDK retries until
	// its deadline: keep the deadline short here.)
	before := requests(t, s, "Send", "ok")
	for name, conf := range map[string]*tls.Config{
		"no client certificate": {RootCAs: ca.Pool()},
		"foreign client cert":   {RootCAs: ca.Pool(), Certificates: []tls.Certificate{other.Client(t, "intruder").TLS}},
	} {
		c, err := client.New(client.Config{Addrs: []string{s.Addr()}, TLSConfig: conf, Token: "tok-123", Logger: quiet,
			Retry: client.RetryPolicy{MaxAttempts: 3}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Send(ctx, client.SendRequest{ConvID: "g:tls", FromUID: 7})
		c.Close()
		if err == nil {
			t.Fatalf("%s: send succeeded", name)
		}
	}
	if got := requests(t, s, "Send", "ok") - before; got != 0 {
		t.Fatalf("%v sends without a valid client certificate were served", got)
	}
}

// A request above the node's read limit is invalid_argument: the SDK does
// not retry it, and exactly one request reaches the node.
func TestTooLargeRequestIsNotRetried(t *testing.T) {
	s := startNode(t, t.TempDir(), "127.0.0.1:0")
	var r retries
	c, err := client.New(client.Config{Addrs: []string{s.Addr()}, Logger: r.logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Route first so the Send below is the only request left.
	if _, err := c.Send(context.Background(), client.SendRequest{ConvID: "g:big", FromUID: 1}); err != nil {
		t.Fatal(err)
	}
	before := sendRequests(t, s, "invalid_argument")
	_, err = c.Send(context.Background(), client.SendRequest{ConvID: "g:big", FromUID: 1, Body: bytes.Repeat([]byte{'x'}, 9<<20)})
	if connect.CodeOf(err) != connect.CodeInvalidArgument || sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
		t.Fatalf("9 MiB body: %v, want invalid_argument", err)
	}
	if got := sendRequests(t, s, "invalid_argument") - before; got != 1 || r.count() != 0 {
		t.Fatalf("%v requests reached the node, %d retries; want 1 and 0", got, r.count())
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
