package main

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sequencer-im/sequencer/buildinfo"
	"github.com/sequencer-im/sequencer/internal/tracing"
)

// newTracerProvider returns a tracer provider exporting spans over OTLP/HTTP (protobuf)
// in batches, configured by the standard variables (endpoint, headers,
// timeout, OTEL_TRACES_SAMPLER, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES;
// the service name defaults to "sequencer"), and its shutdown, which flushes
// the spans not yet sent. When tracing.Enabled(getenv) is false it returns nil and
// a shutdown that does nothing. getenv decides whether to trace; the
// exporter reads the process environment itself (serve passes os.Getenv).
func newTracerProvider(ctx context.Context, getenv func(string) string) (*sdktrace.TracerProvider, func(context.Context) error, error) {
	if !tracing.Enabled(getenv) {
		return nil, func(context.Context) error { return nil }, nil
	}
	if e := getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); e != "" && e != "http/protobuf" {
		return nil, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: only http/protobuf is supported", e)
	}
	exp, err := otlptracehttp.New(ctx) // reads OTEL_EXPORTER_OTLP_*
	if err != nil {
		return nil, nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	bi := buildinfo.Get()
	res, err := resource.Merge(
		resource.NewSchemaless(attribute.String("service.name", "sequencer"), attribute.String("service.version", bi.Version)),
		resource.Environment(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return nil, nil, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)) // sampler: OTEL_TRACES_SAMPLER
	return tp, tp.Shutdown, nil
}
