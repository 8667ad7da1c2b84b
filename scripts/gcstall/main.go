// Command gcstall measures how late a sleeping goroutine wakes in a Go
// process whose heap grows the way the soak's test process grows (48
// goroutines appending operations with their key strings to one slice and
// one map): docs/TESTING.md "Soak", run 8. It prints a line each time the
// worst lateness grows.
//
//	GOMAXPROCS=2 go run ./scripts/gcstall            # the collector on
//	GOGC=off GOMAXPROCS=2 go run ./scripts/gcstall   # off (memory grows to ~9 GB)
package main

import (
	"flag"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"time"
)

type Op struct {
	Kind             int
	Conv, Node, Key  string
	Client           int
	AfterSeq         uint64
	Call, Return     time.Duration
	Outcome          int
	Code             string
	Seq, MsgID, Head uint64
	Dup, Final       bool
	Keys             []string
	Seqs             []uint64
}

func main() {
	length := flag.Duration("duration", 45*time.Second, "how long to run")
	flag.Parse()
	var mu sync.Mutex
	var ops []Op
	keys := map[string]uint64{}
	stop := make(chan struct{})
	// "clients": allocate ops steadily
	for c := 0; c < 48; c++ {
		go func(c int) {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := strconv.Itoa(c) + "/c" + strconv.Itoa(i)
				op := Op{Conv: "conv-" + strconv.Itoa(i%120), Key: k, Seq: uint64(i)}
				if i%50 == 0 {
					op.Keys = make([]string, 20)
					for j := range op.Keys {
						op.Keys[j] = k + strconv.Itoa(j)
					}
				}
				mu.Lock()
				ops = append(ops, op)
				keys[k] = uint64(i)
				mu.Unlock()
				if i%64 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}(c)
	}
	// "main goroutine": sleeps 100 ms, reports lateness
	start := time.Now()
	var worst time.Duration
	for time.Since(start) < *length {
		t := time.Now()
		time.Sleep(100 * time.Millisecond)
		late := time.Since(t) - 100*time.Millisecond
		if late > worst {
			worst = late
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			mu.Lock()
			n := len(ops)
			mu.Unlock()
			fmt.Printf("%6.1fs ops=%d heap=%dMB numgc=%d worst late %v\n", time.Since(start).Seconds(), n, ms.HeapAlloc>>20, ms.NumGC, late)
		}
	}
	close(stop)
}
