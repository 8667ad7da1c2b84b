package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
)

// Subscribe resumes by itself: across a node that stops and starts again
// the caller sees every stored message once, in order.
func TestSubscribeResumesAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	s := startNode(t, dir, "127.0.0.1:0")
	addr := s.Addr()
	c := newClient(t, client.Config{Addrs: []string{addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	send := func(conv string, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if _, err := c.Send(ctx, client.SendRequest{ConvID: conv, FromUID: 1, Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	send("a", 3)
	events := make(chan client.Event, 100)
	errs := make(chan error, 1)
	go func() {
		for ev, err := range c.Subscribe(ctx, []client.Cursor{{ConvID: "a", AfterSeq: 1}, {ConvID: "b"}}) {
			if err != nil {
				errs <- err
				return
			}
			events <- ev
		}
	}()
	got := map[string][]uint64{}
	expect := func(conv string, upTo uint64) {
		t.Helper()
		for {
			if l := got[conv]; len(l) > 0 && l[len(l)-1] >= upTo {
				return
			}
			select {
			case ev := <-events:
				got[ev.Message.ConvID] = append(got[ev.Message.ConvID], ev.Message.Seq)
			case err := <-errs:
				t.Fatalf("Subscribe: %v", err)
			case <-ctx.Done():
				t.Fatalf("got %v, want %s up to %d", got, conv, upTo)
			}
		}
	}
	expect("a", 3)
	send("b", 2)
	expect("b", 2)
	shutdown(t, s) // ends the stream: unavailable
	startNode(t, dir, addr)
	send("a", 2)
	send("b", 1)
	expect("a", 5)
	expect("b", 3)
	if fmt.Sprint(got["a"]) != "[2 3 4 5]" || fmt.Sprint(got["b"]) != "[1 2 3]" {
		t.Fatalf("got %v", got)
	}
}

// A bad request is a final error, not a loop.
func TestSubscribeInvalidIsFinal(t *testing.T) {
	s := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, client.Config{Addrs: []string{s.Addr()}})
	for _, err := range c.Subscribe(ctxT(t), []client.Cursor{{ConvID: "a"}, {ConvID: "a"}}) {
		if sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
			t.Fatalf("err %v, want invalid_argument", err)
		}
		return
	}
	t.Fatal("no error")
}

// PullLatest pages backwards; PullMany answers many conversations at once.
func TestPullLatestAndPullMany(t *testing.T) {
	s := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, client.Config{Addrs: []string{s.Addr()}})
	ctx := ctxT(t)
	for i := 0; i < 7; i++ {
		if _, err := c.Send(ctx, client.SendRequest{ConvID: "a", FromUID: 1, Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := c.PullLatest(ctx, "a", 0, 3)
	if err != nil || len(p.Messages) != 3 || p.Messages[0].Seq != 5 || !p.HasMore || p.HeadSeq != 7 {
		t.Fatalf("PullLatest: %+v %v", p, err)
	}
	p, err = c.PullLatest(ctx, "a", p.Messages[0].Seq, 10)
	if err != nil || len(p.Messages) != 4 || p.Messages[0].Seq != 1 || p.HasMore {
		t.Fatalf("PullLatest page 2: %+v %v", p, err)
	}
	pages, err := c.PullMany(ctx, []client.Cursor{{ConvID: "nobody"}, {ConvID: "a", AfterSeq: 5}}, 0, 0)
	if err != nil || len(pages) != 2 || len(pages[0].Messages) != 0 || len(pages[1].Messages) != 2 || pages[1].HeadSeq != 7 {
		t.Fatalf("PullMany: %+v %v", pages, err)
	}
}
