// Package netbuf wraps the connections of the API port: plaintext ones read
// through a buffer, and every one lets the goroutines that are ready to run
// go first before it writes a small piece, so that their frames join the write.
package netbuf

import (
	"bufio"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"time"
)

// Listener returns ln with every accepted connection reading through
// a 4 KiB buffer and yielding before small writes (see Yielding).
// HTTP/2's framer (h2c: gRPC without TLS) reads each frame's
// 9-byte header and its payload with separate reads, two system calls per
// frame on a bare socket; through the buffer the frames that arrived
// together cost one. Reads of 4 KiB or more with the buffer empty (net/http's
// HTTP/1.1 reader) go straight to the socket. Use it for plaintext
// listeners; TLS connections already read whole records.
func Listener(ln net.Listener) net.Listener { return listener{ln, true} }

// Yielding returns ln with every accepted connection yielding the processor
// (runtime.Gosched) before a write shorter than yieldBelow that follows the
// connection's previous write within burstGap, for a TLS listener
// (tls.NewListener over it; http.Server.ServeTLS does that).
//
// Why: an HTTP/2 server connection flushes its buffered frames with one
// write whenever it has no frame left to write, and takes the frames that
// arrive during that write into the next one. When a message goes to many
// streams of one connection (a hot conversation's subscribers), each stream's
// goroutine hands its frame over in turn, and without the yield nearly every
// frame costs a write system call of its own (on loopback about 7 µs, a
// quarter of the server's CPU in `sequencer-bench fanout`). The yield lets
// the goroutines that are ready run first, so their frames join this write
// or the next one: the same run made about 0.035 writes per delivery instead
// of 0.25 (docs/BENCHMARKS.md). When nothing else is ready, Gosched returns
// at once and the write is not delayed. A full buffer (4 KiB: x/net's and
// net/http's write buffers) is written without yielding.
func Yielding(ln net.Listener) net.Listener { return listener{ln, false} }

// yieldBelow is the size from which a write goes out without yielding: a
// full 4 KiB buffer, or more, gains nothing by waiting for company.
const yieldBelow = 4096

// burstGap: a write yields only when the connection's previous write ended
// less than this long ago, in a burst of writes that more frames may join. A
// connection written to now and then (one stream, a unary caller) writes at
// once: there the yield found nothing to take along and only queued the
// write behind every other goroutine (one stream per connection in
// `sequencer-bench fanout`: 30% fewer deliveries).
const burstGap = 500 * time.Microsecond

type listener struct {
	net.Listener
	buffered bool
}

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if !l.buffered {
		return &conn{Conn: c}, nil
	}
	return &conn{Conn: c, r: bufio.NewReaderSize(c, 4096)}, nil
}

// conn is a net.Conn whose reads go through r, when it is set, and whose
// small writes yield first.
type conn struct {
	net.Conn
	r    *bufio.Reader
	last atomic.Int64 // when the previous write returned (Unix ns)
}

func (c *conn) Read(p []byte) (int, error) {
	if c.r == nil {
		return c.Conn.Read(p)
	}
	return c.r.Read(p)
}

func (c *conn) Write(p []byte) (int, error) {
	now := time.Now().UnixNano()
	if len(p) < yieldBelow && now-c.last.Load() < int64(burstGap) {
		runtime.Gosched()
	}
	n, err := c.Conn.Write(p)
	c.last.Store(time.Now().UnixNano())
	return n, err
}

// CloseWrite half-closes a TCP connection (net/http uses it to finish an
// HTTP/1.1 connection it refuses).
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// ReadFrom keeps the socket's own ReadFrom (sendfile, splice) for writes.
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}
