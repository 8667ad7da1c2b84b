package netbuf

import (
	"net"
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
