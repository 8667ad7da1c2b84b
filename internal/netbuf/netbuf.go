// Package netbuf buffers the reads of plaintext server connections (the API
// port and the inter-node port without TLS).
package netbuf

import (
	"bufio"
	"io"
	"net"
)

// Listener returns ln with every accepted connection reading through
// a 4 KiB buffer. HTTP/2's framer (h2c: gRPC without TLS) reads each frame's
// 9-byte header and its payload with separate reads, two system calls per
// frame on a bare socket; through the buffer the frames that arrived
// together cost one. Reads of 4 KiB or more with the buffer empty (net/http's
// HTTP/1.1 reader) go straight to the socket. Use it for plaintext
// listeners; TLS connections already read whole records.
func Listener(ln net.Listener) net.Listener { return bufferedListener{ln} }

type bufferedListener struct{ net.Listener }

func (l bufferedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, 4096)}, nil
}

// bufferedConn is a net.Conn whose reads go through r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes a TCP connection (net/http uses it to finish an
// HTTP/1.1 connection it refuses).
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// ReadFrom keeps the socket's own ReadFrom (sendfile, splice) for writes.
func (c *bufferedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}
