package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/sequencer-im/sequencer/client"
)

// proxyCounts are what a countingProxy saw: connections accepted, and
// bytes forwarded from addr to the clients.
type proxyCounts struct{ conns, down atomic.Int64 }

// countingWriter adds what it writes to n.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	k, err := c.w.Write(b)
	c.n.Add(int64(k))
	return k, err
}

// countingProxy forwards each TCP connection it accepts to addr and counts
// them and their bytes; it stops when the test ends.
func countingProxy(t *testing.T, addr string) (string, *proxyCounts) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n proxyCounts
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			n.conns.Add(1)
			out, err := net.Dial("tcp", addr)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			open = append(open, in, out)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(out, in); out.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(countingWriter{in, &n.down}, out); in.Close() }()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String(), &n
}

// The default transport spreads unary calls round robin over
// Config.Connections connections per node and puts Subscribe streams on one
// more: 300 streams (more than net/http's default limit of 250 a
// connection) share that one.
func TestDefaultTransportSpreadsCallsAndPacksStreams(t *testing.T) {
	s := startNode(t, t.TempDir(), "127.0.0.1:0")
	addr, counts := countingProxy(t, s.Addr())
	conns := &counts.conns
	c := newClient(t, client.Config{Addrs: []string{addr}, DisableRouting: true, Connections: 3, Batching: client.BatchPolicy{Disabled: true}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const streams = 300
	for i := range streams { // sequential: call i takes connection i mod 3
		if _, err := c.Send(ctx, client.SendRequest{ConvID: fmt.Sprint("t", i), FromUID: 1, Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if got := conns.Load(); got != 3 {
		t.Fatalf("%d sequential Sends took %d connections, want 3 (Connections)", streams, got)
	}
	first := func(conv string) error { // a stream's first event: it is open
		for ev, err := range c.Subscribe(ctx, []client.Cursor{{ConvID: conv}}) {
			if err != nil {
				return err
			}
			if ev.Message.Seq != 1 {
				return fmt.Errorf("%s: first event seq %d", conv, ev.Message.Seq)
			}
			break
		}
		return nil
	}
	// One stream first, so that the node's settings (its stream limit)
	// are known before the others open at once.
	if err := first("t0"); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	opened := make(chan error, streams)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev, err := range c.Subscribe(sctx, []client.Cursor{{ConvID: fmt.Sprint("t", i)}}) {
				if err != nil {
					opened <- err
					return
				}
				if ev.Message.Seq == 1 {
					opened <- nil
				}
			}
		}()
	}
	for range streams {
		if err := <-opened; err != nil {
			t.Fatal(err)
		}
	}
	if got := conns.Load(); got != 4 {
		t.Fatalf("3 connections for calls and %d open Subscribe streams took %d connections in all, want 4", streams, got)
	}
	stop()
	wg.Wait()
}

// Answers come uncompressed unless Config.Gzip asks for gzip, in every
// protocol: 20 Pulls of 50 messages with 1,000 zero bytes of body each
// (about 1 MB as they are, a few KB gzipped).
func TestGzipOnlyWhenAsked(t *testing.T) {
	s := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := ctxT(t)
	seed := newClient(t, client.Config{Addrs: []string{s.Addr()}})
	reqs := make([]client.SendRequest, 50)
	for i := range reqs {
		reqs[i] = client.SendRequest{ConvID: "g:zip", FromUID: 1, Body: make([]byte, 1000)}
	}
	if _, errs := seed.SendMany(ctx, reqs); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	const pulls, raw = 20, 20 * 50 * 1000
	for _, p := range []client.Protocol{client.ProtocolGRPC, client.ProtocolConnect, client.ProtocolGRPCWeb} {
		for _, gz := range []bool{false, true} {
			addr, counts := countingProxy(t, s.Addr())
			c := newClient(t, client.Config{Addrs: []string{addr}, DisableRouting: true, Protocol: p, Gzip: gz})
			for range pulls {
				page, err := c.PullPage(ctx, client.PullRequest{ConvID: "g:zip", Limit: 50})
				if err != nil || len(page.Messages) != 50 || len(page.Messages[49].Body) != 1000 {
					t.Fatalf("%v gzip %v: pull: %d messages, %v", p, gz, len(page.Messages), err)
				}
			}
			c.Close()
			got := int(counts.down.Load())
			if !gz && got < raw {
				t.Errorf("%v, Gzip false: %d bytes came down for %d bytes of bodies: compressed", p, got, raw)
			}
			if gz && got > raw/10 {
				t.Errorf("%v, Gzip true: %d bytes came down for %d bytes of bodies: not compressed", p, got, raw)
			}
		}
	}
}

// The SDK's connections ask for DATA frames of up to 1 MiB (HTTP/2's
// default is 16 KiB): a node's large answer (a PullMany of 1,000
// conversations is about 2 MB) then takes a few frames instead of about 130,
// each one a write, a read and a hand-over on the two sides
// (docs/BENCHMARKS.md). Read from the client's first SETTINGS frame.
func TestConnectionsAskForLargeFrames(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan uint32, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(conn, preface); err != nil || string(preface) != http2.ClientPreface {
			got <- 0
			return
		}
		f, err := http2.NewFramer(conn, conn).ReadFrame()
		s, ok := f.(*http2.SettingsFrame)
		if err != nil || !ok {
			got <- 0
			return
		}
		v, _ := s.Value(http2.SettingMaxFrameSize)
		got <- v
	}()
	c := newClient(t, client.Config{Addrs: []string{l.Addr().String()}, DisableRouting: true, Batching: client.BatchPolicy{Disabled: true},
		Retry: client.RetryPolicy{MaxAttempts: 1}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	go func() { _, _ = c.Send(ctx, client.SendRequest{ConvID: "frames", FromUID: 1}) }()
	select {
	case v := <-got:
		if v != 1<<20 {
			t.Fatalf("the client's SETTINGS_MAX_FRAME_SIZE is %d, want %d", v, 1<<20)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client sent no SETTINGS")
	}
}
