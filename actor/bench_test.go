package actor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

var benchRun atomic.Int64

// benchNode measures Conversations.Send throughput with many concurrent senders over
// many conversations: msgs/s and the mean rows per store transaction.
func benchNode(b *testing.B, st persist.Store, convs, senders int) {
	m := metrics.New()
	run := benchRun.Add(1)
	ids := &counterIDs{}
	ids.n.Store(uint64(run) << 40) // msg_ids never repeat across runs on one store
	n, err := NewConversations(Config{Store: st, IDs: ids, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close(context.Background())
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				_, err := n.Send(context.Background(), sequencer.SendRequest{ConvID: fmt.Sprintf("b%d:%d", run, i%int64(convs)),
					FromUID: uint64(s + 1), ClientMsgID: fmt.Sprintf("r%d-%d", run, i), MsgType: 1, Body: make([]byte, 100)})
				if err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d sends failed", f, b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(meanBatch(b, m), "rows/tx")
}

// benchShapes are the load shapes of the Send benchmarks: many
// conversations with few messages each in flight, and few hot ones.
var benchShapes = []struct{ convs, senders int }{{1000, 512}, {10000, 2048}, {50, 512}}

// benchStores runs benchNode for every shape on a fresh store from open.
func benchStores(b *testing.B, open func(testing.TB) persist.Store) {
	for _, sh := range benchShapes {
		b.Run(fmt.Sprintf("convs=%d/senders=%d", sh.convs, sh.senders), func(b *testing.B) {
			benchNode(b, open(b), sh.convs, sh.senders)
		})
	}
}

func BenchmarkSendMemStore(b *testing.B) {
	benchStores(b, func(testing.TB) persist.Store { return memstore.New() })
}
