package postgres

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/storetest"
)

// benchBatches builds one commit of convs conversations x perConv rows after
// the given heads (heads[i] is conversation i's head, advanced here).
func benchBatches(prefix string, heads []uint64, perConv int, nextID *atomic.Uint64, body []byte, at time.Time) []persist.ConvBatch {
	bs := make([]persist.ConvBatch, len(heads))
	for i := range heads {
		conv := fmt.Sprintf("%s:%d", prefix, i)
		b := persist.ConvBatch{ConvID: conv, PrevHead: heads[i], Messages: make([]sequencer.Message, perConv)}
		for j := range b.Messages {
			id := nextID.Add(1)
			b.Messages[j] = sequencer.Message{MsgID: id, ConvID: conv, Seq: heads[i] + uint64(j) + 1,
				FromUID: 1 + id%1000, MsgType: 1, Body: body, ClientMsgID: fmt.Sprintf("bench-%d", id), ServerAt: at}
		}
		heads[i] += uint64(perConv)
		bs[i] = b
	}
	return bs
}

// BenchmarkCommit4000 commits 4,000-row transactions spread over 500
// conversations (8 rows each, 100-byte bodies) with the default insert path,
// from 1 and from 4 concurrent writers. It reports rows/s and the mean
// latency of one Commit.
//
//	go test -run '^$' -bench Commit4000 -benchtime 40x ./persist/postgres/
func BenchmarkCommit4000(b *testing.B) { benchCommit(b, 500, 8, false) }

// BenchmarkCommitSmall is the same with 100-row transactions (20
// conversations x 5 rows), where a round trip weighs more.
//
//	go test -run '^$' -bench CommitSmall -benchtime 200x ./persist/postgres/
func BenchmarkCommitSmall(b *testing.B) { benchCommit(b, 20, 5, false) }

// BenchmarkCommitMany is the shape of the bench's many scenario: 95
// conversations with one row each per commit, where a round trip weighs most.
//
//	go test -run '^$' -bench CommitMany -benchtime 400x ./persist/postgres/
func BenchmarkCommitMany(b *testing.B) { benchCommit(b, 95, 1, false) }

// BenchmarkCommitManyMarks is BenchmarkCommitMany with the own-send rule on
// (every batch MarkSendersRead, as the server commits by default): the
// cost of the senders' read positions in the commit's transaction
// (docs/BENCHMARKS.md, "Own messages are read").
//
//	go test -run '^$' -bench 'CommitMany(Marks)?$' -benchtime 400x -count 5 ./persist/postgres/
func BenchmarkCommitManyMarks(b *testing.B) { benchCommit(b, 95, 1, true) }

// BenchmarkCommitManyEdits and BenchmarkCommitManyRecalls are
// BenchmarkCommitMany with every row an event: an edit (a 100-byte body) or
// a recall of a message of the conversation that no event of the run
// targeted before (issue 32: an event costs no more than a send), the
// batches saying so (RecallsOfUnedited), as the writer does. The targets
// are seeded before the timer starts.
//
//	go test -run '^$' -bench 'CommitMany(Edits|Recalls)?$' -benchtime 400x -count 5 ./persist/postgres/
func BenchmarkCommitManyEdits(b *testing.B) {
	benchCommitKind(b, 95, 1, false, sequencer.KindEdit)
}

func BenchmarkCommitManyRecalls(b *testing.B) {
	benchCommitKind(b, 95, 1, false, sequencer.KindRecall)
}

// BenchmarkCommitManyRecallsUnflagged is BenchmarkCommitManyRecalls with
// the batches not saying RecallsOfUnedited (as if the writer did not know
// its targets unedited): the store also looks for the targets' edit events.
func BenchmarkCommitManyRecallsUnflagged(b *testing.B) {
	benchCommitKind(b, 95, 1, false, -sequencer.KindRecall)
}

func benchCommit(b *testing.B, convs, perConv int, marks bool) {
	benchCommitKind(b, convs, perConv, marks, sequencer.KindMessage)
}

// asEvents turns the rows of bs into events of kind, each on the next
// message of targets[i] (conversation i's seeded messages, taken in turn);
// recalls carry no body.
func asEvents(bs []persist.ConvBatch, kind sequencer.Kind, targets [][]uint64) {
	if kind == sequencer.KindMessage {
		return
	}
	flagged := kind > 0 // -KindRecall: recalls without RecallsOfUnedited
	kind = max(kind, -kind)
	for i := range bs {
		bs[i].RecallsOfUnedited = flagged
		for j := range bs[i].Messages {
			m := &bs[i].Messages[j]
			m.Kind, m.TargetMsgID = kind, targets[i][0]
			targets[i] = targets[i][1:]
			if kind == sequencer.KindRecall {
				m.Body = nil
			}
		}
	}
}

func benchCommitKind(b *testing.B, convs, perConv int, marks bool, kind sequencer.Kind) {
	body := make([]byte, 100)
	for _, writers := range []int{1, 4} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			s, _ := newStore(b)
			ctx := context.Background()
			var nextID atomic.Uint64
			heads := make([][]uint64, writers)
			for w := range heads {
				heads[w] = make([]uint64, convs)
			}
			// Warm up: statements prepared, head rows exist.
			for w := 0; w < writers; w++ {
				if err := s.Commit(ctx, benchBatches(fmt.Sprintf("w%d", w), heads[w], perConv, &nextID, body, time.Now())); err != nil {
					b.Fatal(err)
				}
			}
			per := (b.N + writers - 1) / writers
			// The events' targets: perConv messages per conversation and
			// commit to come.
			targets := make([][][]uint64, writers)
			for w := range targets {
				targets[w] = make([][]uint64, convs)
				if kind == sequencer.KindMessage {
					continue
				}
				seed := benchBatches(fmt.Sprintf("w%d", w), heads[w], per*perConv, &nextID, body, time.Now())
				for i := range seed {
					for _, m := range seed[i].Messages {
						targets[w][i] = append(targets[w][i], m.MsgID)
					}
				}
				if err := s.Commit(ctx, seed); err != nil {
					b.Fatal(err)
				}
			}
			// Pre-build every transaction so the timing is the store's.
			work := make([][][]persist.ConvBatch, writers)
			for w := range work {
				for i := 0; i < per; i++ {
					bs := benchBatches(fmt.Sprintf("w%d", w), heads[w], perConv, &nextID, body, time.Now())
					for i := range bs {
						bs[i].MarkSendersRead = marks
					}
					asEvents(bs, kind, targets[w])
					work[w] = append(work[w], bs)
				}
			}
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			var failed atomic.Value
			var latency atomic.Int64
			for w := 0; w < writers; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for _, bs := range work[w] {
						t0 := time.Now()
						if err := s.Commit(ctx, bs); err != nil {
							failed.Store(err)
							return
						}
						latency.Add(int64(time.Since(t0)))
					}
				}(w)
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			if err, _ := failed.Load().(error); err != nil {
				b.Fatal(err)
			}
			rows := float64(per * writers * convs * perConv)
			b.ReportMetric(rows/el.Seconds(), "rows/s")
			b.ReportMetric(float64(latency.Load())/float64(per*writers)/1e6, "ms/commit")
		})
	}
}

// BenchmarkInsertModes compares the two insert paths fairly on a shared,
// noisy machine: two stores on two fresh databases, one commit of each per
// iteration, alternating, so load from elsewhere hits both alike. Commits of
// 4,000 rows over 500 conversations, 100 rows over 20, 4 rows over 2.
//
//	go test -run '^$' -bench InsertModes -benchtime 60x ./persist/postgres/
func BenchmarkInsertModes(b *testing.B) {
	for _, size := range []struct{ convs, perConv int }{{500, 8}, {250, 8}, {100, 10}, {50, 10}, {20, 5}, {2, 2}} {
		b.Run(fmt.Sprintf("rows=%d", size.convs*size.perConv), func(b *testing.B) {
			benchInsertModes(b, size.convs, size.perConv)
		})
	}
}

func benchInsertModes(b *testing.B, convs, perConv int) {
	body := make([]byte, 100)
	ctx := context.Background()
	stores := [2]*Store{}
	heads := [2][]uint64{}
	var nextID atomic.Uint64
	for i, m := range []insertMode{insertUnnest, insertCopy} {
		stores[i], _ = newStore(b)
		stores[i].mode = m
		heads[i] = make([]uint64, convs)
		if err := stores[i].Commit(ctx, benchBatches("c", heads[i], perConv, &nextID, body, time.Now())); err != nil {
			b.Fatal(err)
		}
	}
	work := make([][2][]persist.ConvBatch, b.N)
	for n := range work {
		for i := range stores {
			work[n][i] = benchBatches("c", heads[i], perConv, &nextID, body, time.Now())
		}
	}
	var spent [2]time.Duration
	b.ResetTimer()
	for n := range work {
		for k := 0; k < 2; k++ {
			i := (n + k) % 2 // alternate which goes first
			t0 := time.Now()
			if err := stores[i].Commit(ctx, work[n][i]); err != nil {
				b.Fatal(err)
			}
			spent[i] += time.Since(t0)
		}
	}
	b.StopTimer()
	rows := float64(b.N * convs * perConv)
	b.ReportMetric(rows/spent[0].Seconds(), "unnest-rows/s")
	b.ReportMetric(rows/spent[1].Seconds(), "copy-rows/s")
}

// BenchmarkReadReceipts10k: GetReadReceipts' store side, 100 seqs over
// 10,000 readers at distinct positions (storetest.BenchReadReceipts;
// docs/BENCHMARKS.md, "Read receipts").
//
//	go test -run '^$' -bench ReadReceipts10k -benchtime 200x ./persist/postgres/
func BenchmarkReadReceipts10k(b *testing.B) {
	s, _ := newStore(b)
	storetest.BenchReadReceipts(b, s)
}
