package cluster

import (
	"context"
	"testing"
	"time"
)

// The per-send costs of the cluster's hot path that no end-to-end bench
// isolates (docs/BENCHMARKS.md): the node's own bound on every Send and
// SendBatch (a 10 s ForwardTimeout context), and the local writer's context
// that the cut signal also cancels (writerCtx). Both in parallel over all
// CPUs, as the API's senders call them.

func BenchmarkSendBound(b *testing.B) {
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c, cancel := context.WithTimeout(ctx, DefaultConfig().ForwardTimeout)
			_ = c
			cancel()
		}
	})
}

func BenchmarkWriterCtx(b *testing.B) {
	m := &member{}
	m.cut.Store(newCutSignal())
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour) // a send's ctx: it has the node's bound
	defer cancel()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w, stop := m.writerCtx(ctx)
			_ = writerCut(ctx, w)
			stop()
		}
	})
}
