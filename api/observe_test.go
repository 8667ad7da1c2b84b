package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sequencer-im/sequencer/internal/reqid"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// postSend posts a Connect JSON Send with the extra headers and returns the
// response's X-Request-Id.
func postSend(t *testing.T, h *harness, header http.Header) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.url+sendPath,
		strings.NewReader(`{"convId":"c1","fromUid":"1","clientMsgId":"k1","msgType":1,"body":"aGk="}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.Header.Get(reqid.Header)
}

// A failing request logs (through reqid.Handler, as cmd/sequencer sets the
// logger up) a line with the request_id its response header carried: a sane
// X-Request-Id from the caller is kept, anything else is replaced.
func TestRequestIDInLogsAndHeader(t *testing.T) {
	logs := &syncBuffer{}
	h := newHarness(t, func(c *Config) {
		c.Logger = slog.New(reqid.Handler(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	})
	h.sender.set(fail(errors.New("disk on fire"))) // internal: logged at ERROR
	loggedWith := func(id string) bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "rpc failed" && rec["request_id"] == id {
				return true
			}
		}
		return false
	}
	generated := postSend(t, h, nil)
	if !reqid.Sane(generated) {
		t.Fatalf("response X-Request-Id %q", generated)
	}
	if !loggedWith(generated) {
		t.Fatalf("no \"rpc failed\" line with request_id %q in:\n%s", generated, logs.String())
	}
	if got := postSend(t, h, http.Header{reqid.Header: {"client-id-42"}}); got != "client-id-42" || !loggedWith(got) {
		t.Fatalf("caller's id: answered %q, logged %v", got, loggedWith("client-id-42"))
	}
	for _, bad := range []string{"has space", "quote\"", strings.Repeat("x", reqid.MaxLen+1)} {
		if got := postSend(t, h, http.Header{reqid.Header: {bad}}); got == bad || !reqid.Sane(got) || !loggedWith(got) {
			t.Fatalf("caller's id %q: answered %q (want a new one), logged %v", bad, got, loggedWith(got))
		}
	}
	if h.sender.Calls()[0].ConvID != "c1" {
		t.Fatal("the sends did not reach the sender")
	}
}

// With a tracer provider every RPC gets a server span; a caller's trace
// context is linked, not taken as parent (API clients are not trusted).
// otelconnect records no metrics: the RPCs are counted once, by
// sequencer_rpc_requests_total, even when a global OpenTelemetry meter
// provider exists.
func TestTracingSpansWithoutDuplicateMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	t.Cleanup(func() { otel.SetMeterProvider(prev) })

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	h := newHarness(t, func(c *Config) { c.TracerProvider = tp })
	h.sender.set(answer(1, 1, false))
	const remote = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	postSend(t, h, http.Header{"Traceparent": {remote}})

	var span sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if "/"+s.Name() == sequencerv1connect.SequencerServiceSendProcedure && s.SpanKind() == trace.SpanKindServer {
			span = s
		}
	}
	if span == nil {
		t.Fatalf("no server span for Send among %d spans", len(rec.Ended()))
	}
	if span.Parent().IsValid() || len(span.Links()) != 1 || span.Links()[0].SpanContext.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("span parent %v, links %v: want a new root linked to the caller's span", span.Parent(), span.Links())
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		if len(sm.Metrics) > 0 {
			t.Fatalf("otelconnect recorded metrics (%s: %s): they would duplicate sequencer_rpc_requests_total", sm.Scope.Name, sm.Metrics[0].Name)
		}
	}
	mfs, err := h.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "rpc_") || strings.HasPrefix(mf.GetName(), "otel") {
			t.Fatalf("registry has %s next to sequencer_rpc_requests_total", mf.GetName())
		}
	}
	if got := counterValue(t, h.metrics.Requests.WithLabelValues(methodSend, "ok")); got != 1 {
		t.Fatalf("sequencer_rpc_requests_total{Send,ok} = %v, want 1", got)
	}
}
