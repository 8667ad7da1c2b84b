package cluster

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/proto/cluster/v1/clusterv1connect"
)

// A Send forwarded from a to its owner b over the real connect transport is
// one trace: the caller's span on a is the parent of a's client span, which
// is the parent of b's server span.
func TestInProcessForwardCarriesTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	pc := newProcCluster(t)
	a := pc.startInProcess("a", ipOptions{tp: tp})
	b := pc.startInProcess("b", ipOptions{tp: tp})
	pc.waitInProcess(a, b)

	conv := convsOwnedBy(t, a, "b", "traced", 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx, caller := tp.Tracer("test").Start(ctx, "api Send")
	_, err := a.cn.Send(ctx, sequencer.SendRequest{ConvID: conv, FromUID: 1, ClientMsgID: "t1", MsgType: 1, Body: []byte("x")})
	caller.End()
	if err != nil {
		t.Fatal(err)
	}

	forward := clusterv1connect.ClusterServiceForwardProcedure
	var client, server sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if "/"+s.Name() != forward || s.SpanContext().TraceID() != caller.SpanContext().TraceID() {
			continue
		}
		switch s.SpanKind() {
		case trace.SpanKindClient:
			client = s
		case trace.SpanKindServer:
			server = s
		}
	}
	if client == nil || server == nil {
		t.Fatalf("spans of the forward in the caller's trace: client %v, server %v (of %d ended spans)", client != nil, server != nil, len(rec.Ended()))
	}
	if client.Parent().SpanID() != caller.SpanContext().SpanID() {
		t.Errorf("a's client span's parent %s, want the caller's span %s", client.Parent().SpanID(), caller.SpanContext().SpanID())
	}
	if server.Parent().SpanID() != client.SpanContext().SpanID() || !server.Parent().IsRemote() {
		t.Errorf("b's server span's parent %s (remote %v), want a's client span %s", server.Parent().SpanID(), server.Parent().IsRemote(), client.SpanContext().SpanID())
	}
}

func TestSnapshotMoving(t *testing.T) {
	s := Snapshot{Partitions: []PartitionOwner{
		{Owner: "a", RingOwner: "a"}, {Owner: "a", RingOwner: "b"}, {Owner: "", RingOwner: "b"}, {Owner: "b", RingOwner: "b"},
	}}
	if got := s.Moving(); got != 2 {
		t.Fatalf("Moving() = %d, want 2 (one held by another node, one free)", got)
	}
}
