package feed

import (
	"context"
	"testing"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// BenchmarkServeLiveMessage is the feed's own work for one live message to
// one stream: Publish, the stream's wake, its queue, its Tail and the
// event handed to Send (no transport). Run:
//
//	go test ./feed/ -run '^$' -bench ServeLive -benchmem
func BenchmarkServeLiveMessage(b *testing.B) {
	h := NewHub(Config{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- h.Serve(ctx, Subscription{Cursors: []persist.Cursor{{ConvID: "c"}}, Store: memstore.New(), Send: func(e Event) error {
			if e.Kind == KindMessage {
				got <- struct{}{}
			}
			return nil
		}})
	}()
	for h.Totals().BacklogReads == 0 {
		select {
		case err := <-done:
			b.Fatal(err)
		default:
		}
	}
	batches := make([][]sequencer.Message, b.N)
	for i := range batches {
		batches[i] = []sequencer.Message{{ConvID: "c", Seq: uint64(i + 1), MsgID: uint64(i + 1), FromUID: 1, Body: []byte{}}}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		h.Publish("c", batches[i])
		<-got
	}
}
