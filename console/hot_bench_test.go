package console

import (
	"context"
	"strconv"
	"testing"

	"github.com/sequencer-im/sequencer"
)

// BenchmarkSendCounter is the console's cost on every API send (its mutex
// and map), one sender and all senders at once (-cpu), over 1,000
// conversations (docs/BENCHMARKS.md).
func BenchmarkSendCounter(b *testing.B) {
	convs := make([]string, 1000)
	for i := range convs {
		convs[i] = "conv-" + strconv.Itoa(i)
	}
	s := NewSendCounter().Wrap(nopSender{})
	ctx := context.Background()
	b.Run("Send", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				_, _ = s.Send(ctx, sequencer.SendRequest{ConvID: convs[i%len(convs)]})
				i++
			}
		})
	})
	b.Run("SendBatch64", func(b *testing.B) {
		reqs := make([]sequencer.SendRequest, 64)
		for i := range reqs {
			reqs[i].ConvID = convs[i*7%len(convs)]
		}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s.SendBatch(ctx, reqs, nil)
			}
		})
	})
}
