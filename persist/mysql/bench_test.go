package mysql

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/storetest"
)

// BenchmarkCommit100Convs commits one message (128-byte body) to each of
// 100 conversations per transaction (the group commit of the
// many-conversations scenario). When the server runs on this machine and
// its pid file is readable, it also reports the server's CPU time per
// message (server-µs/msg, from /proc/PID/stat, all of the server's threads:
// run it on a server nobody else uses, e.g. SEQUENCER_TEST_MYSQL_URL of a
// throwaway mariadbd).
func BenchmarkCommit100Convs(b *testing.B) {
	s, _ := newStore(b)
	ctx := context.Background()
	const convs = 100
	heads := make([]uint64, convs)
	id := uint64(1)
	body := make([]byte, 128)
	for i := range body {
		body[i] = byte(i * 37)
	}
	commit := func() {
		bs := make([]persist.ConvBatch, convs)
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
	commit() // the conversations exist: every later commit moves existing heads
	cpu0, cpuOK := serverCPU(ctx, s)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		commit()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*convs)/b.Elapsed().Seconds(), "msg/s")
	if cpu1, ok := serverCPU(ctx, s); ok && cpuOK {
		b.ReportMetric(float64(cpu1-cpu0)*1e6/float64(clockTicks)/float64(b.N*convs), "server-µs/msg")
	}
}

// clockTicks is the kernel's USER_HZ (getconf CLK_TCK), 100 on Linux.
const clockTicks = 100

// serverCPU returns the server process's user+system CPU time in clock
// ticks, when it runs here and its pid file is readable.
func serverCPU(ctx context.Context, s *Store) (int64, bool) {
	var pidFile string
	if err := s.read.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&pidFile); err != nil {
		return 0, false
	}
	pid, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, false
	}
	stat, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/stat")
	if err != nil {
		return 0, false
	}
	// Fields after the command name (which may hold spaces): utime and
	// stime are the 14th and 15th fields of the line.
	rest := string(stat)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return u + st, true
}

// BenchmarkReadReceipts10k: GetReadReceipts' store side, 100 seqs over
// 10,000 readers at distinct positions (storetest.BenchReadReceipts;
// docs/BENCHMARKS.md, "Read receipts").
//
//	go test -run '^$' -bench ReadReceipts10k -benchtime 200x ./persist/mysql/
func BenchmarkReadReceipts10k(b *testing.B) {
	s, _ := newStore(b)
	storetest.BenchReadReceipts(b, s)
}
