package sqlite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/storetest"
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
	el := commitAll(b, s, build)
	b.ReportMetric(float64(b.N*convs*perConv)/el.Seconds(), "rows/s")
	b.ReportMetric(float64(el.Milliseconds())/float64(b.N), "ms/commit")
}

// BenchmarkCommitMany commits transactions shaped like the bench's "many"
// scenario: each row in its own conversation out of 10,000, from one of
// 1,024 senders whose client_msg_ids count up, 128-byte bodies; rows per
// transaction as in the sub-benchmark's name. It first stores 50,000 rows,
// then reports rows/s, and per row the bytes and write system calls the
// process made (/proc/self/io: WAL frames, checkpoints).
//
//	go test -run '^$' -bench CommitMany -benchtime 200x ./persist/sqlite/
func BenchmarkCommitMany(b *testing.B) {
	for _, rows := range []int{192, 768} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) { benchCommitMany(b, rows) })
	}
}

func benchCommitMany(b *testing.B, rowsPerCommit int) {
	const convs, senders = 10000, 1024
	s := newStore(b)
	ctx := context.Background()
	body := make([]byte, 128)
	heads := make([]uint64, convs)
	sent := make([]int, senders)
	rng := rand.New(rand.NewPCG(1, 2))
	var id uint64
	build := func() []persist.ConvBatch {
		bs := make([]persist.ConvBatch, 0, rowsPerCommit)
		picked := map[int]bool{}
		for len(bs) < rowsPerCommit {
			c := rng.IntN(convs)
			if picked[c] {
				continue
			}
			picked[c] = true
			u := rng.IntN(senders)
			sent[u]++
			id++
			conv := fmt.Sprintf("bench-conv-%d", c)
			heads[c]++
			bs = append(bs, persist.ConvBatch{ConvID: conv, PrevHead: heads[c] - 1, Messages: []sequencer.Message{{
				MsgID: id, ConvID: conv, Seq: heads[c], FromUID: uint64(u + 1), MsgType: 1, Body: body,
				ClientMsgID: fmt.Sprintf("bench-%d-%d", u, sent[u]), ServerAt: time.Now()}}})
		}
		return bs
	}
	for range 50000 / rowsPerCommit {
		if err := s.Commit(ctx, build()); err != nil {
			b.Fatal(err)
		}
	}
	work := make([][]persist.ConvBatch, b.N)
	for i := range work {
		work[i] = build()
	}
	io0, cpu0 := procIO(b), cpuTime()
	b.ResetTimer()
	start := time.Now()
	for _, bs := range work {
		if err := s.Commit(ctx, bs); err != nil {
			b.Fatal(err)
		}
	}
	el := time.Since(start)
	b.StopTimer()
	io1, cpu1 := procIO(b), cpuTime()
	n := float64(b.N * rowsPerCommit)
	b.ReportMetric(float64((cpu1-cpu0).Microseconds())/n, "cpu-µs/row")
	b.ReportMetric(n/el.Seconds(), "rows/s")
	b.ReportMetric(float64(io1["wchar"]-io0["wchar"])/n, "wbytes/row")
	b.ReportMetric(float64(io1["syscw"]-io0["syscw"])/n, "writes/row")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procIO reads this process's I/O counters (Linux); nil elsewhere.
func procIO(b *testing.B) map[string]int64 {
	raw, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return map[string]int64{}
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		out[k] = n
	}
	return out
}

// BenchmarkReadReceipts10k: GetReadReceipts' store side, 100 seqs over
// 10,000 readers at distinct positions (storetest.BenchReadReceipts;
// docs/BENCHMARKS.md, "Read receipts").
//
//	go test -run '^$' -bench ReadReceipts10k -benchtime 200x ./persist/sqlite/
func BenchmarkReadReceipts10k(b *testing.B) {
	s := newStore(b)
	storetest.BenchReadReceipts(b, s)
}

// BenchmarkOwnSendMarks commits 110 one-message conversations at a time,
// each picked at random among 10,000 and sent by one of 1,024 users (the
// bench's `many`), with the own-send rule off and on, and reports rows/s:
// what the rule's marks cost the store (marklog.go).
//
//	go test -run '^$' -bench OwnSendMarks -benchtime 3000x ./persist/sqlite/
func BenchmarkOwnSendMarks(b *testing.B) {
	for _, mark := range []bool{false, true} {
		b.Run(fmt.Sprint("rule=", mark), func(b *testing.B) {
			const convs, per = 10_000, 110
			s := newStore(b)
			body := make([]byte, 100)
			heads := make([]uint64, convs)
			var id uint64
			r := rand.New(rand.NewPCG(1, 2))
			build := func() []persist.ConvBatch {
				seen := map[int]bool{}
				var bs []persist.ConvBatch
				for len(bs) < per {
					c := r.IntN(convs)
					if seen[c] {
						continue
					}
					seen[c] = true
					conv := fmt.Sprintf("g:%d", c)
					id++
					heads[c]++
					bs = append(bs, persist.ConvBatch{ConvID: conv, PrevHead: heads[c] - 1, MarkSendersRead: mark, Messages: []sequencer.Message{{
						MsgID: id, ConvID: conv, Seq: heads[c], FromUID: 1 + uint64(r.IntN(1024)), MsgType: 1, Body: body,
						ClientMsgID: fmt.Sprintf("bench-%d", id), ServerAt: time.Now()}}})
				}
				return bs
			}
			b.ReportMetric(float64(b.N*per)/commitAll(b, s, build).Seconds(), "rows/s")
		})
	}
}

// commitAll builds b.N commits, then times committing them in turn.
func commitAll(b *testing.B, s *Store, build func() []persist.ConvBatch) time.Duration {
	work := make([][]persist.ConvBatch, b.N)
	for i := range work {
		work[i] = build()
	}
	b.ResetTimer()
	start := time.Now()
	for _, bs := range work {
		if err := s.Commit(context.Background(), bs); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}
