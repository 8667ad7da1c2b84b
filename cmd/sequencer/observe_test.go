package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer/internal/reqid"
)

// The serve logger adds request_id to records logged with a request's
// context, in both formats, and nothing to the others.
func TestLoggerAddsRequestID(t *testing.T) {
	var buf bytes.Buffer
	l, err := newLogger(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	l.ErrorContext(reqid.With(context.Background(), "req-7"), "rpc failed", "code", "internal")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil || rec["request_id"] != "req-7" || rec["code"] != "internal" {
		t.Fatalf("json record %q (%v), want request_id req-7", buf.String(), err)
	}
	buf.Reset()
	l.InfoContext(context.Background(), "serving")
	if strings.Contains(buf.String(), "request_id") {
		t.Fatalf("a record without a request has a request_id: %q", buf.String())
	}
	buf.Reset()
	if l, err = newLogger(&buf, "info", "text"); err != nil {
		t.Fatal(err)
	}
	l.With("node", "n1").WarnContext(reqid.With(context.Background(), "req-8"), "slow")
	if !strings.Contains(buf.String(), "node=n1 request_id=req-8") {
		t.Fatalf("text record %q, want node=n1 request_id=req-8", buf.String())
	}
}

// Tracing is on only with an OTLP endpoint, and off when the SDK or the
// exporter is disabled; without it no provider is built.
func TestTracerProviderFromEnvironment(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	ctx := context.Background()
	for _, c := range []struct {
		env  func(string) string
		want bool
	}{
		{env(), false},
		{env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), true},
		{env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces"), true},
		{env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318", "OTEL_SDK_DISABLED", "true"), false},
		{env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER", "none"), false},
	} {
		tp, shutdown, err := newTracerProvider(ctx, c.env)
		if err != nil {
			t.Fatal(err)
		}
		if (tp != nil) != c.want {
			t.Errorf("provider %v, want %v", tp != nil, c.want)
		}
		if err := shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}
	if _, _, err := newTracerProvider(ctx, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")); err == nil {
		t.Error("OTEL_EXPORTER_OTLP_PROTOCOL=grpc accepted: only http/protobuf is built in")
	}
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set, spans reach the endpoint over
// OTLP/HTTP (POST /v1/traces, protobuf) by the time shutdown returns.
func TestTracerProviderExportsOverOTLPHTTP(t *testing.T) {
	got := make(chan string, 16)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- r.Method + " " + r.URL.Path + " " + r.Header.Get("Content-Type") + " " + strconv.Itoa(len(body))
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_SERVICE_NAME", "sequencer-test")
	ctx := context.Background()
	tp, shutdown, err := newTracerProvider(ctx, os.Getenv)
	if err != nil || tp == nil {
		t.Fatalf("provider %v: %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(ctx, "one")
	span.End()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case req := <-got:
		if !strings.HasPrefix(req, "POST /v1/traces application/x-protobuf ") || strings.HasSuffix(req, " 0") {
			t.Fatalf("collector got %q", req)
		}
	default:
		t.Fatal("no export reached the collector before shutdown returned")
	}
}
