package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// BenchReadReceipts measures GetReadReceipts' store side
// (persist.ReadReceipts) for 100 seqs in a conversation with 10,000
// readers, all at different positions (the worst case: one row per
// reader): 10,000 messages, each from its own sender, committed with the
// own-send rule, so reader i has read up to seq i. The 100 seqs are
// 100, 200, ..., 10,000, so the query reads the positions of 9,901
// readers. It reports the latency's p50 and p99 in ms per call.
func BenchReadReceipts(b *testing.B, s persist.Store) {
	ctx := context.Background()
	const readers, per = 10_000, 1000
	conv := fmt.Sprintf("g:receipts-%d", time.Now().UnixNano())
	for prev := uint64(0); prev < readers; prev += per {
		batch := persist.ConvBatch{ConvID: conv, PrevHead: prev, MarkSendersRead: true}
		for i := uint64(1); i <= per; i++ {
			m := msg(conv, prev+i)
			m.FromUID = 1_000_000 + prev + i
			batch.Messages = append(batch.Messages, m)
		}
		if err := s.Commit(ctx, []persist.ConvBatch{batch}); err != nil {
			b.Fatal(err)
		}
	}
	seqs := make([]uint64, sequencer.MaxReceiptSeqs)
	for i := range seqs {
		seqs[i] = uint64(i+1) * readers / uint64(len(seqs))
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		got, err := persist.ReadReceipts(ctx, s, conv, seqs)
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		if got[0] != readers-seqs[0]+1 || got[len(got)-1] != 1 {
			b.Fatalf("receipts %d .. %d, want %d .. 1", got[0], got[len(got)-1], readers-seqs[0]+1)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	ms := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(ms(0.50), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
}
