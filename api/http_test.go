package api

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestNewServerServesHTTP2WithXNet: NewServer's HTTP/2, cleartext (h2c
// with prior knowledge, as gRPC clients speak it) and over TLS (ALPN), is
// golang.org/x/net/http2's server, the one whose write scheduler can be
// chosen (NewServer), and HTTP/1.1 still works beside it.
func TestNewServerServesHTTP2WithXNet(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %T", r.Proto, w)
	})
	get := func(t *testing.T, c *http.Client, url string) string {
		t.Helper()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	const xnet = "HTTP/2.0 *http2.responseWriter" // net/http's own would be *http.http2responseWriter

	t.Run("h2c", func(t *testing.T) {
		ts := httptest.NewUnstartedServer(handler)
		ts.Config = NewServer("", handler)
		ts.Start()
		defer ts.Close()
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		if got := get(t, &http.Client{Transport: &http.Transport{Protocols: &p}}, ts.URL); got != xnet {
			t.Errorf("h2c: handler saw %q, want %q", got, xnet)
		}
		if got := get(t, &http.Client{}, ts.URL); got != "HTTP/1.1 *http.response" {
			t.Errorf("HTTP/1.1: handler saw %q", got)
		}
	})
	t.Run("tls", func(t *testing.T) {
		ts := httptest.NewUnstartedServer(handler)
		ts.Config = NewServer("", handler)
		ts.EnableHTTP2 = true
		ts.StartTLS()
		defer ts.Close()
		if got := get(t, ts.Client(), ts.URL); got != xnet {
			t.Errorf("TLS: handler saw %q, want %q", got, xnet)
		}
	})
}
