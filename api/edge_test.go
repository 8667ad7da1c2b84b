package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

func writeTokens(t *testing.T, dir, text string) string {
	t.Helper()
	p := filepath.Join(dir, "tokens")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	p := writeTokens(t, dir, "# the logic layer\n\n  alpha-token-1  \n#beta-token-2\nbeta-token-3\n")
	tk, err := LoadTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	if tk.Len() != 2 {
		t.Fatalf("%d tokens, want 2", tk.Len())
	}
	for h, want := range map[string]bool{
		"Bearer alpha-token-1": true,
		"bearer beta-token-3":  true,
		"Bearer beta-token-2":  false, // commented out
		"Bearer alpha-token":   false,
		"Bearer ":              false,
		"alpha-token-1":        false,
		"Basic alpha-token-1":  false,
		"":                     false,
	} {
		if got := tk.Check(h); got != want {
			t.Errorf("Check(%q) = %v, want %v", h, got, want)
		}
	}

	// A reload picks up a rotated file; a bad reload keeps the old set.
	writeTokens(t, dir, "gamma-token\n")
	if err := tk.Reload(); err != nil {
		t.Fatal(err)
	}
	if tk.Check("Bearer alpha-token-1") || !tk.Check("Bearer gamma-token") {
		t.Fatal("reload did not replace the set")
	}
	writeTokens(t, dir, "# nothing left\n")
	if err := tk.Reload(); err == nil {
		t.Fatal("a file without tokens reloaded")
	}
	if !tk.Check("Bearer gamma-token") {
		t.Fatal("a failed reload dropped the tokens in force")
	}
	os.Remove(p)
	if err := tk.Reload(); err == nil || !tk.Check("Bearer gamma-token") {
		t.Fatalf("reload of a missing file: %v", err)
	}
	if _, err := LoadTokens(filepath.Join(dir, "nope")); err == nil {
		t.Fatal("LoadTokens of a missing file succeeded")
	}
	writeTokens(t, dir, "two words\n")
	if _, err := LoadTokens(p); err == nil || strings.Contains(err.Error(), "words") {
		t.Fatalf("a token with a space: %v (the error must not echo it)", err)
	}
}

// edgeServer serves NewAPIMux(svc, edge) with the admin mux on the same
// port, as a node without --admin-listen does.
func edgeServer(t *testing.T, edge Edge, cfgs ...func(*Config)) (string, *fakeSender, *counter) {
	t.Helper()
	sender := &fakeSender{}
	sender.set(answer(1, 1, false))
	cfg := Config{Sender: sender, Reader: newFakeReader(), Logger: slog.New(slog.DiscardHandler)}
	for _, f := range cfgs {
		f(&cfg)
	}
	svc := NewService(cfg)
	mux := NewAPIMux(svc, edge)
	mux.Handle("/", NewAdminMux(nil, nil, nil))
	cnt := &counter{next: mux}
	ts := httptest.NewUnstartedServer(cnt)
	ts.Config = NewServer("127.0.0.1:0", cnt)
	ts.Start()
	t.Cleanup(ts.Close)
	return ts.URL, sender, cnt
}

// counter counts the requests that reached the server.
type counter struct {
	next http.Handler
	n    atomic.Int64
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	c.next.ServeHTTP(w, r)
}

// protocols are the three wire protocols of the API, each over the
// transport its clients use (gRPC over h2c).
func protocols() map[string][]connect.ClientOption {
	return map[string][]connect.ClientOption{
		"connect":  nil,
		"grpc":     {connect.WithGRPC()},
		"grpc-web": {connect.WithGRPCWeb()},
	}
}

func h2cClient(t *testing.T) *http.Client {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func withToken(token string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}))
}

func TestBearerTokenRequired(t *testing.T) {
	tk, err := LoadTokens(writeTokens(t, t.TempDir(), "s3cret-token-value\n"))
	if err != nil {
		t.Fatal(err)
	}
	url, sender, _ := edgeServer(t, Edge{Tokens: tk})
	req := &sequencerv1.SendRequest{ConvId: "g:1", FromUid: 1, ClientMsgId: "k"}
	for name, opts := range protocols() {
		t.Run(name, func(t *testing.T) {
			for _, tc := range []struct {
				name string
				opts []connect.ClientOption
			}{
				{"no token", nil},
				{"wrong token", []connect.ClientOption{withToken("s3cret-token-valuX")}},
			} {
				c := sequencerv1connect.NewSequencerServiceClient(h2cClient(t), url, append(append([]connect.ClientOption{}, opts...), tc.opts...)...)
				_, err := c.Send(context.Background(), connect.NewRequest(req))
				if connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Fatalf("%s: %v, want unauthenticated", tc.name, err)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("%s: the error leaks a token: %v", tc.name, err)
				}
			}
			before := len(sender.Calls())
			c := sequencerv1connect.NewSequencerServiceClient(h2cClient(t), url, append(append([]connect.ClientOption{}, opts...), withToken("s3cret-token-value"))...)
			if _, err := c.Send(context.Background(), connect.NewRequest(req)); err != nil {
				t.Fatalf("with the token: %v", err)
			}
			if len(sender.Calls()) != before+1 {
				t.Fatal("refused calls reached the sender")
			}
		})
	}

	// Plain HTTP: 401, a Connect JSON error; health stays open.
	resp, err := http.Post(url+sendPath, "application/json", strings.NewReader(`{"convId":"g:1","fromUid":"1","clientMsgId":"k"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `"unauthenticated"`) {
		t.Fatalf("JSON without a token: %d %s", resp.StatusCode, body)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(url + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s behind the token: %d", p, resp.StatusCode)
		}
	}
}

// A request above the read limit is invalid_argument in every protocol
// (Connect's own limit would answer resource_exhausted, which clients
// retry), and never reaches the Sender.
func TestTooLargeRequestIsInvalidArgument(t *testing.T) {
	url, sender, _ := edgeServer(t, Edge{MaxRequestBytes: 4096})
	big := &sequencerv1.SendRequest{ConvId: "g:1", FromUid: 1, ClientMsgId: "k", Body: make([]byte, 8192)}
	for name, opts := range protocols() {
		t.Run(name, func(t *testing.T) {
			c := sequencerv1connect.NewSequencerServiceClient(h2cClient(t), url, opts...)
			_, err := c.Send(context.Background(), connect.NewRequest(big))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "4096-byte limit") {
				t.Fatalf("too large: %v, want invalid_argument", err)
			}
			// Just under the limit still works.
			ok := &sequencerv1.SendRequest{ConvId: "g:1", FromUid: 1, ClientMsgId: "k", Body: make([]byte, 1000)}
			if _, err := c.Send(context.Background(), connect.NewRequest(ok)); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, c := range sender.Calls() {
		if len(c.Body) > 4096 {
			t.Fatal("a too-large request reached the sender")
		}
	}
	// Chunked JSON without Content-Length.
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte(`{"convId":"g:1","fromUid":"1","clientMsgId":"k","body":"`))
		pw.Write([]byte(strings.Repeat("QUFB", 2000)))
		pw.Write([]byte(`"}`))
		pw.Close()
	}()
	resp, err := http.Post(url+sendPath, "application/json", pr)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "invalid_argument") {
		t.Fatalf("chunked too-large JSON: %d %s", resp.StatusCode, body)
	}
}

// A POST without Content-Type, or with one the API does not speak (curl -d
// sends application/x-www-form-urlencoded), is answered 415 with a Connect
// JSON error body that says what to send, and reaches no sender; the types
// it speaks still work.
func TestUnsupportedContentTypeIs415WithBody(t *testing.T) {
	url, sender, _ := edgeServer(t, Edge{})
	post := func(ct string) (*http.Response, struct{ Code, Message string }) {
		req, _ := http.NewRequest(http.MethodPost, url+sendPath, strings.NewReader(`{"convId":"g:1","fromUid":"1","clientMsgId":"k"}`))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct{ Code, Message string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp, body
	}
	for _, ct := range []string{"", "application/x-www-form-urlencoded", "text/plain"} {
		resp, body := post(ct)
		if resp.StatusCode != http.StatusUnsupportedMediaType || body.Code != "invalid_argument" ||
			!strings.Contains(body.Message, "application/json") || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("Content-Type %q: %d %s %+v", ct, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
	if n := len(sender.Calls()); n != 0 {
		t.Fatalf("%d sends reached the sender", n)
	}
	for _, ct := range []string{"application/json", "application/json; charset=utf-8"} {
		if resp, body := post(ct); resp.StatusCode != http.StatusOK {
			t.Fatalf("Content-Type %q: %d %+v, want 200", ct, resp.StatusCode, body)
		}
	}
}

func TestCORSPreflight(t *testing.T) {
	url, _, _ := edgeServer(t, Edge{CORSOrigins: []string{"https://app.example.com"}})
	preflight := func(origin string) http.Header {
		t.Helper()
		req, _ := http.NewRequest(http.MethodOptions, url+sendPath, nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization,connect-protocol-version,content-type") // sorted, as browsers send it
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header
	}
	h := preflight("https://app.example.com")
	if h.Get("Access-Control-Allow-Origin") != "https://app.example.com" {
		t.Fatalf("allowed origin: %v", h)
	}
	allowed := strings.ToLower(h.Get("Access-Control-Allow-Headers"))
	for _, want := range []string{"content-type", "connect-protocol-version", "authorization"} {
		if !strings.Contains(allowed, want) {
			t.Fatalf("Access-Control-Allow-Headers %q lacks %s", allowed, want)
		}
	}
	if !strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") {
		t.Fatalf("Access-Control-Allow-Methods: %q", h.Get("Access-Control-Allow-Methods"))
	}
	h = preflight("https://evil.example.net")
	for k := range h {
		if strings.HasPrefix(k, "Access-Control-Allow") {
			t.Fatalf("another origin got %s: %v", k, h)
		}
	}
	// An actual call from the allowed origin exposes the gRPC-Web headers.
	req, _ := http.NewRequest(http.MethodPost, url+sendPath, strings.NewReader(`{"convId":"g:1","fromUid":"1","clientMsgId":"k"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", "https://app.example.com")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
		!strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "Grpc-Status") {
		t.Fatalf("call from the allowed origin: %d %v", resp.StatusCode, resp.Header)
	}

	// Without --cors-origins no CORS header at all.
	plain, _, _ := edgeServer(t, Edge{})
	url = plain
	if h := preflight("https://app.example.com"); h.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("CORS headers without origins: %v", h)
	}
}

// With --admin-listen the API mux serves no health or metrics, and the admin
// mux takes extra handlers (the web console's /console/).
func TestAdminMuxApart(t *testing.T) {
	svc := NewService(Config{Sender: &fakeSender{}, Reader: newFakeReader(), Logger: slog.New(slog.DiscardHandler)})
	apiSrv := httptest.NewServer(NewAPIMux(svc, Edge{}))
	t.Cleanup(apiSrv.Close)
	admin := NewAdminMux(nil, nil, nil)
	admin.Handle("/console/", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "console") }))
	adminSrv := httptest.NewServer(admin)
	t.Cleanup(adminSrv.Close)
	status := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if code, _ := status(apiSrv.URL + p); code != http.StatusNotFound {
			t.Errorf("API port serves %s: %d", p, code)
		}
	}
	if code, _ := status(adminSrv.URL + "/healthz"); code != 200 {
		t.Errorf("admin /healthz: %d", code)
	}
	if code, body := status(adminSrv.URL + "/console/x"); code != 200 || body != "console" {
		t.Errorf("admin /console/: %d %q", code, body)
	}
}
