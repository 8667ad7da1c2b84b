package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/testcert"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

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

func start(t *testing.T, cfg Config, log *slog.Logger) *Server {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Store == "" {
		cfg.Store = "sqlite:" + filepath.Join(t.TempDir(), "sequencer.db")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s, err := Start(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestAdminListenMovesHealthAndMetrics(t *testing.T) {
	s := start(t, Config{AdminListen: "127.0.0.1:0"}, nil)
	if s.AdminAddr() == s.Addr() {
		t.Fatal("admin address is the API's")
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if code, _ := get(t, "http://"+s.Addr()+p); code != http.StatusNotFound {
			t.Errorf("API port still serves %s: %d", p, code)
		}
		if code, _ := get(t, "http://"+s.AdminAddr()+p); code != 200 {
			t.Errorf("admin port %s: %d", p, code)
		}
	}
	// Without --admin-listen they stay on the API port.
	one := start(t, Config{}, nil)
	if code, body := get(t, "http://"+one.Addr()+"/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("single port /readyz: %d %q", code, body)
	}
}

// The embedded store's file is owned by one node: a second node on it fails
// to start and names the holder.
func TestSecondNodeOnTheSameStoreIsRefused(t *testing.T) {
	store := "sqlite:" + filepath.Join(t.TempDir(), "sequencer.db")
	start(t, Config{Store: store, NodeID: "first"}, nil)
	_, err := Start(context.Background(), Config{Listen: "127.0.0.1:0", Store: store, NodeID: "second"}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "node first") || !strings.Contains(err.Error(), "locked by pid") {
		t.Fatalf("second node: %v, want a refusal naming node first", err)
	}
}

// No form of the store's password is logged, at any level, from start to
// stop, nor is the user/database shown by /readyz.
func TestStorePasswordNeverLogged(t *testing.T) {
	dsn := pgtest.NewDatabase(t) // postgres://postgres@host:port/db?...
	const pw = "Pw-Never-Logged-42"
	withPW := strings.Replace(dsn, "://postgres@", "://postgres:"+pw+"@", 1)
	if withPW == dsn {
		t.Fatalf("cannot put a password into %s", Redact(dsn))
	}
	var out syncBuf
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := start(t, Config{Store: withPW}, log)
	if code, _ := get(t, "http://"+s.Addr()+"/readyz"); code != 200 {
		t.Fatalf("/readyz: %d", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "xxxxx") {
		t.Fatalf("the store was not logged redacted:\n%s", out.String())
	}
	if strings.Contains(out.String(), pw) {
		t.Fatalf("the password is in the log:\n%s", out.String())
	}
}

// Reload re-reads the token file; a bad file keeps the tokens in force.
func TestReloadTokens(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	write := func(s string) {
		t.Helper()
		if err := writeFile(file, s); err != nil {
			t.Fatal(err)
		}
	}
	write("old-token\n")
	var out syncBuf
	s := start(t, Config{AuthTokenFile: file}, slog.New(slog.NewTextHandler(&out, nil)))
	call := func(token string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+s.Addr()+"/sequencer.v1.SequencerService/GetHead", strings.NewReader(`{"convId":"g:1"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if call("old-token") != 200 || call("new-token") != 401 {
		t.Fatal("initial tokens")
	}
	write("new-token\n")
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if call("old-token") != 401 || call("new-token") != 200 {
		t.Fatal("tokens after reload")
	}
	write("# emptied by mistake\n")
	if err := s.Reload(); err == nil {
		t.Fatal("a file without tokens reloaded")
	}
	if call("new-token") != 200 {
		t.Fatal("a bad reload dropped the tokens in force")
	}
	if !strings.Contains(out.String(), "level=ERROR") || !strings.Contains(out.String(), "reload failed") {
		t.Fatalf("a bad reload was not logged at ERROR:\n%s", out.String())
	}
	// Health is not behind the token.
	if code, _ := get(t, "http://"+s.Addr()+"/healthz"); code != 200 {
		t.Fatalf("/healthz behind the token: %d", code)
	}
}

func writeFile(name, s string) error { return os.WriteFile(name, []byte(s), 0o600) }

// With --tls-cert the API speaks HTTP/2 (ALPN) and HTTP/1.1 over TLS, and
// nothing in cleartext.
func TestTLSServesHTTP2AndHTTP1(t *testing.T) {
	ca := testcert.NewCA(t, "ca")
	dir := t.TempDir()
	pair := ca.Server(t)
	s := start(t, Config{
		TLSCert: testcert.Write(t, dir, "c.pem", pair.CertPEM),
		TLSKey:  testcert.Write(t, dir, "k.pem", pair.KeyPEM),
	}, nil)
	for _, h2 := range []bool{true, false} {
		var p http.Protocols
		p.SetHTTP1(!h2)
		p.SetHTTP2(h2)
		tr := &http.Transport{Protocols: &p, TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}
		resp, err := (&http.Client{Transport: tr}).Post("https://"+s.Addr()+"/sequencer.v1.SequencerService/GetHead",
			"application/json", strings.NewReader(`{"convId":"g:1"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := map[bool]string{true: "HTTP/2.0", false: "HTTP/1.1"}[h2]
		if resp.StatusCode != 200 || resp.Proto != want {
			t.Fatalf("TLS %s: %d %s", want, resp.StatusCode, resp.Proto)
		}
		tr.CloseIdleConnections()
	}
	// A TLS server answers a cleartext request with 400; it never serves it.
	if resp, err := http.Get("http://" + s.Addr() + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("cleartext served next to TLS")
		}
	}
}

// Reload swaps the client CAs (and the certificate) for new handshakes.
func TestReloadClientCA(t *testing.T) {
	caA, caB := testcert.NewCA(t, "a"), testcert.NewCA(t, "b")
	dir := t.TempDir()
	pair := caA.Server(t)
	caFile := testcert.Write(t, dir, "clients.pem", caA.PEM)
	s := start(t, Config{
		TLSCert:  testcert.Write(t, dir, "c.pem", pair.CertPEM),
		TLSKey:   testcert.Write(t, dir, "k.pem", pair.KeyPEM),
		ClientCA: caFile,
	}, nil)
	served := func(clientCA *testcert.CA) bool {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: caA.Pool(),
			Certificates: []tls.Certificate{clientCA.Client(t, "logic").TLS}}}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Post("https://"+s.Addr()+"/sequencer.v1.SequencerService/GetHead",
			"application/json", strings.NewReader(`{"convId":"g:1"}`))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	if !served(caA) || served(caB) {
		t.Fatal("before reload: want clients of CA a only")
	}
	testcert.Write(t, dir, "clients.pem", caB.PEM)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if served(caA) || !served(caB) {
		t.Fatal("after reload: want clients of CA b only")
	}
	testcert.Write(t, dir, "clients.pem", []byte("not a certificate"))
	if err := s.Reload(); err == nil || !served(caB) {
		t.Fatalf("a bad CA file: reload %v; the CAs in force must stay", err)
	}
}

// --pprof serves Go's profiles on the admin mux, and only then.
func TestPprofOnlyWhenAsked(t *testing.T) {
	on := start(t, Config{AdminListen: "127.0.0.1:0", Pprof: true}, nil)
	if code, body := get(t, "http://"+on.AdminAddr()+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("--pprof: /debug/pprof/ %d", code)
	}
	if code, _ := get(t, "http://"+on.Addr()+"/debug/pprof/"); code == 200 {
		t.Fatal("--pprof with --admin-listen: profiles on the API port")
	}
	off := start(t, Config{AdminListen: "127.0.0.1:0"}, nil)
	if code, _ := get(t, "http://"+off.AdminAddr()+"/debug/pprof/"); code == 200 {
		t.Fatal("profiles served without --pprof")
	}
}

type leaseStarter func(context.Context) error

func (f leaseStarter) Start(ctx context.Context) error { return f(ctx) }

// A lease the store did not answer in time at start is retried by its loop
// (the node serves not ready meanwhile); a refusal stops the start.
func TestStartLeaseRetriesOnlyAnUnansweredStore(t *testing.T) {
	var buf strings.Builder
	log := slog.New(slog.NewTextHandler(&buf, nil))
	slow := leaseStarter(func(context.Context) error {
		return fmt.Errorf("idgen: first reservation failed: %w (timeout)", sequencer.ErrStoreUnavailable)
	})
	if err := startLease(context.Background(), slow, log); err != nil {
		t.Fatalf("unanswered store: %v, want the start to go on", err)
	}
	if !strings.Contains(buf.String(), "worker-id lease not taken at start") {
		t.Fatalf("no warning logged:\n%s", buf.String())
	}
	full := leaseStarter(func(context.Context) error {
		return &sequencer.Error{Code: sequencer.CodeUnavailable, Msg: "store out of disk space"}
	})
	if err := startLease(context.Background(), full, log); err == nil || !strings.Contains(err.Error(), "disk space") {
		t.Fatalf("disk full: %v, want the start to fail naming it", err)
	}
}
