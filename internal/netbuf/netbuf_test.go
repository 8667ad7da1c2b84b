package netbuf

import (
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// Accept errors pass through; a closed listener stops Serve.
func TestListenerClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := Listener(ln)
	done := make(chan error, 1)
	go func() {
		_, err := bl.Accept()
		done <- err
	}()
	bl.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Accept on a closed listener returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept did not return after Close")
	}
}

// Bytes come through in order whatever the sizes of the writes and reads,
// around the buffer's 4 KiB.
func TestListenerReadsInOrder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := Listener(ln)
	defer bl.Close()
	want := make([]byte, 100_000)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return
		}
		defer c.Close()
		for off, n := 0, 1; off < len(want); off, n = off+n, n*3%5000+1 {
			_, _ = c.Write(want[off:min(off+n, len(want))])
		}
	}()
	c, err := bl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 0, len(want))
	for n := 9; len(got) < len(want); n = n*5%9000 + 1 {
		buf := make([]byte, n)
		k, err := c.Read(buf)
		got = append(got, buf[:k]...)
		if err != nil {
			break
		}
	}
	if string(got) != string(want) {
		t.Fatalf("read %d bytes, not the %d written in order", len(got), len(want))
	}
}

// orderConn records its writes in a shared log.
type orderConn struct {
	net.Conn
	mu  *sync.Mutex
	log *[]string
}

func (c orderConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	*c.log = append(*c.log, "write")
	c.mu.Unlock()
	return len(p), nil
}

// A small write in a burst (the connection's previous write ended less than
// burstGap ago) lets a goroutine that is ready to run go first (so that, in an
// HTTP/2 server, the frames it is about to queue join the write); a full
// buffer, or the first write after a pause, goes out at once. One P, so that
// "ready" means waiting for this one. Gosched now and then takes the yielding
// goroutine itself back first (the scheduler's turn on its global queue),
// hence counts, not every trial.
func TestSmallWritesInABurstYieldToReadyGoroutines(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const trials = 50
	for _, tc := range []struct {
		size      int
		pause     bool // the previous write ended more than burstGap ago
		wantFirst string
	}{
		{100, false, "ready"},
		{yieldBelow - 1, false, "ready"},
		{yieldBelow, false, "write"},
		{64 << 10, false, "write"},
		{100, true, "write"},
	} {
		first := 0
		for range trials {
			var mu sync.Mutex
			var log []string
			c := &conn{Conn: orderConn{mu: &mu, log: &log}}
			if _, err := c.Write([]byte("previous")); err != nil {
				t.Fatal(err)
			}
			if tc.pause {
				time.Sleep(burstGap + time.Millisecond)
			}
			mu.Lock()
			log = log[:0]
			mu.Unlock()
			done := make(chan struct{})
			go func() {
				mu.Lock()
				log = append(log, "ready")
				mu.Unlock()
				close(done)
			}()
			if _, err := c.Write(make([]byte, tc.size)); err != nil {
				t.Fatal(err)
			}
			<-done
			if log[0] == tc.wantFirst {
				first++
			}
		}
		if first < trials*4/5 {
			t.Errorf("a write of %d bytes (after a pause: %v): %q came first in %d of %d trials, want most",
				tc.size, tc.pause, tc.wantFirst, first, trials)
		}
	}
}
