package e2e

import (
	"bufio"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func dialFrom(t *testing.T, src, addr string) *net.TCPConn {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// roundTrip writes a line and reads it back within d.
func roundTrip(c *net.TCPConn, d time.Duration) (time.Duration, error) {
	start := time.Now()
	c.SetDeadline(start.Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, err
	}
	if line != "ping\n" {
		return 0, errors.New("garbled: " + line)
	}
	return time.Since(start), nil
}

func TestNemesisProxyFaults(t *testing.T) {
	p, err := newProxy("echo", echoServer(t), true)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a, b := nodeSource(1), nodeSource(2)
	ca := dialFrom(t, a, p.Addr())
	cb := dialFrom(t, b, p.Addr())
	if _, err := roundTrip(ca, 2*time.Second); err != nil {
		t.Fatalf("pass: %v", err)
	}

	// Blackhole a's link: a's connection stays open and gets nothing; b's works.
	p.from(a).set(blackhole, blackhole)
	if _, err := roundTrip(ca, 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackholed link answered: %v", err)
	}
	if _, err := roundTrip(cb, 2*time.Second); err != nil {
		t.Fatalf("the other source's link is cut too: %v", err)
	}
	p.from(a).set(pass, pass)
	ca = dialFrom(t, a, p.Addr()) // the old one lost bytes: a fresh one
	if _, err := roundTrip(ca, 2*time.Second); err != nil {
		t.Fatalf("healed: %v", err)
	}

	// One way: a's requests arrive, the answers do not.
	p.from(a).set(pass, blackhole)
	if _, err := roundTrip(ca, 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("one-way cut answered: %v", err)
	}
	p.from(a).set(pass, pass)
	ca = dialFrom(t, a, p.Addr())

	// Delay: each direction adds 150 ms.
	p.from(a).delay.Store(int64(150 * time.Millisecond))
	if d, err := roundTrip(ca, 3*time.Second); err != nil || d < 300*time.Millisecond {
		t.Fatalf("delayed round trip took %v (%v), want >= 300ms", d, err)
	}
	p.from(a).delay.Store(0)

	// Reset: the open connection is reset, new ones too, until healed.
	p.from(a).set(reset, reset)
	if _, err := roundTrip(ca, 2*time.Second); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("reset link: %v", err)
	}
	// The proxy resets a new connection as soon as it accepts it, which on
	// a busy machine can be before the dial has returned: the dial fails
	// with the reset then, or the first round trip does.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(a)}, Timeout: 2 * time.Second}
	c2, err := d.Dial("tcp", p.Addr())
	if err == nil {
		defer c2.Close()
		_, err = roundTrip(c2.(*net.TCPConn), 2*time.Second)
	}
	if err == nil || isTimeout(err) {
		t.Fatalf("new connection on a reset link: %v", err)
	}
	if _, err := roundTrip(cb, 2*time.Second); err != nil {
		t.Fatalf("reset of a's link cut b: %v", err)
	}
	p.from(a).set(pass, pass)
	if _, err := roundTrip(dialFrom(t, a, p.Addr()), 2*time.Second); err != nil {
		t.Fatalf("healed after reset: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
