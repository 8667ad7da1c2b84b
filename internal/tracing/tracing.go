// Package tracing sets up OpenTelemetry tracing for a node from the standard
// OTEL_* environment variables, and builds the connect interceptor
// (connectrpc.com/otelconnect) the API and the inter-node ClusterService
// use.
//
// Tracing is off unless an OTLP endpoint is configured (Enabled): the
// provider is then nil, and a nil provider means no interceptor at all, so a
// node without tracing pays nothing per RPC. The provider itself (the SDK
// and the OTLP exporter) is built by the command (cmd/sequencer), so the
// packages that trace do not link the exporter.
package tracing

import (
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"connectrpc.com/otelconnect"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Enabled reports whether getenv configures a trace exporter: an OTLP
// endpoint (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT)
// is set, OTEL_TRACES_EXPORTER is unset or "otlp", and OTEL_SDK_DISABLED is
// not "true".
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	if e := getenv("OTEL_TRACES_EXPORTER"); e != "" && e != "otlp" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

// Interceptor returns the connect option that traces every RPC with tp
// (W3C trace context in the headers), or nil when tp is nil. trustRemote
// makes a server span the child of the caller's span (for peers
// authenticated by mutual TLS); otherwise the caller's span is only linked.
// RPC metrics are off: sequencer_rpc_requests_total and the other
// Prometheus series already count RPCs.
func Interceptor(tp trace.TracerProvider, trustRemote bool) connect.Option {
	if tp == nil {
		return nil
	}
	opts := []otelconnect.Option{
		otelconnect.WithTracerProvider(tp),
		otelconnect.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
		otelconnect.WithoutMetrics(),
	}
	if trustRemote {
		opts = append(opts, otelconnect.WithTrustRemote())
	}
	ic, err := otelconnect.NewInterceptor(opts...)
	if err != nil { // only from creating metric instruments, which are off
		panic(fmt.Sprintf("otelconnect: %v", err))
	}
	return connect.WithInterceptors(ic)
}
