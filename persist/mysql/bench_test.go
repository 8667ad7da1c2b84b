package mysql

import (
	"context"
	"fmt"
	"testing"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// BenchmarkCommit100Convs commits one message to each of 100 conversations
// per transaction (the group commit of the many-conversations scenario).
func BenchmarkCommit100Convs(b *testing.B) {
	s, _ := newStore(b)
	ctx := context.Background()
	heads := make([]uint64, 100)
	id := uint64(1)
	body := make([]byte, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		bs := make([]persist.ConvBatch, 100)
		for c := range bs {
			conv := fmt.Sprint("g:", c)
			m := sequencer.Message{MsgID: id, ConvID: conv, Seq: heads[c] + 1, FromUID: 1, MsgType: 1, Body: body, ClientMsgID: fmt.Sprint("k", id)}
			id++
			bs[c] = persist.ConvBatch{ConvID: conv, PrevHead: heads[c], Messages: []sequencer.Message{m}}
		}
		if err := s.Commit(ctx, bs); err != nil {
			b.Fatal(err)
		}
		for c := range heads {
			heads[c]++
		}
	}
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "msg/s")
}
