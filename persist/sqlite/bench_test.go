package sqlite

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// BenchmarkCommit4000 commits 4,000-row transactions spread over 500
// conversations (8 rows each, 100-byte bodies) and reports rows/s.
//
//	go test -run '^$' -bench Commit4000 -benchtime 20x ./persist/sqlite/
func BenchmarkCommit4000(b *testing.B) {
	const convs, perConv = 500, 8
	s := newStore(b)
	ctx := context.Background()
	body := make([]byte, 100)
	heads := make([]uint64, convs)
	var id uint64
	build := func() []persist.ConvBatch {
		bs := make([]persist.ConvBatch, convs)
		for i := range bs {
			conv := fmt.Sprintf("c:%d", i)
			bt := persist.ConvBatch{ConvID: conv, PrevHead: heads[i]}
			for j := 0; j < perConv; j++ {
				id++
				bt.Messages = append(bt.Messages, sequencer.Message{MsgID: id, ConvID: conv, Seq: heads[i] + uint64(j) + 1,
					FromUID: 1 + id%1000, MsgType: 1, Body: body, ClientMsgID: fmt.Sprintf("bench-%d", id), ServerAt: time.Now()})
			}
			heads[i] += perConv
			bs[i] = bt
		}
		return bs
	}
	if err := s.Commit(ctx, build()); err != nil {
		b.Fatal(err)
	}
	work := make([][]persist.ConvBatch, b.N)
	for i := range work {
		work[i] = build()
	}
	b.ResetTimer()
	start := time.Now()
	for _, bs := range work {
		if err := s.Commit(ctx, bs); err != nil {
			b.Fatal(err)
		}
	}
	el := time.Since(start)
	b.ReportMetric(float64(b.N*convs*perConv)/el.Seconds(), "rows/s")
	b.ReportMetric(float64(el.Milliseconds())/float64(b.N), "ms/commit")
}
