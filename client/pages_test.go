package client_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/sequencer-im/sequencer/client"
)

// PullPages walks a conversation page by page, MaxBytes bounds a page, and
// the walk ends at the head with every seq once, in order.
func TestPullPagesAndMaxBytes(t *testing.T) {
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := ctxT(t)
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}})
	const n = 25
	body := bytes.Repeat([]byte("b"), 1000)
	for range n {
		if _, err := c.Send(ctx, client.SendRequest{ConvID: "g:pages", FromUID: 7, Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	// 2,500 bytes hold two 1,000-byte bodies: pages of 2 (the limit is 10).
	page, err := c.PullPage(ctx, client.PullRequest{ConvID: "g:pages", Limit: 10, MaxBytes: 2500})
	if err != nil || len(page.Messages) != 2 || !page.HasMore || page.HeadSeq != n {
		t.Fatalf("MaxBytes 2500: %d messages, more %v, head %d, %v; want 2, true, %d", len(page.Messages), page.HasMore, page.HeadSeq, err, n)
	}
	var seqs []uint64
	pages := 0
	for page, err := range c.PullPages(ctx, client.PullRequest{ConvID: "g:pages", AfterSeq: 3, Limit: 4}) {
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, m := range page.Messages {
			seqs = append(seqs, m.Seq)
		}
	}
	if len(seqs) != n-3 || pages != 6 {
		t.Fatalf("PullPages after 3 by 4: %d seqs in %d pages, want %d in 6", len(seqs), pages, n-3)
	}
	for i, s := range seqs {
		if s != uint64(i+4) {
			t.Fatalf("seq %d at %d: want %d (contiguous, ascending)", s, i, i+4)
		}
	}
	// A negative limit is invalid_argument, read with the client package alone.
	if _, err := c.PullPage(ctx, client.PullRequest{ConvID: "g:pages", MaxBytes: -1}); client.ErrorCode(err) != client.CodeInvalidArgument {
		t.Fatalf("MaxBytes -1: %v (code %v)", err, client.ErrorCode(err))
	}
}

// ErrorCode(nil) is "ok": a SendMany item that succeeded does not print
// "internal".
func TestErrorCodeOfNil(t *testing.T) {
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}})
	_, errs := c.SendMany(ctxT(t), []client.SendRequest{{ConvID: "g:many", FromUID: 1}, {ConvID: "g:many", FromUID: 0}})
	if got := [2]string{client.ErrorCode(errs[0]).String(), client.ErrorCode(errs[1]).String()}; got != [2]string{"ok", "invalid_argument"} {
		t.Fatalf("SendMany codes %v, want [ok invalid_argument]", got)
	}
}

// A PullMany answer large enough to be encoded and decoded in halves
// (client/codec.go, api/pagecodec.go: 700 messages, about 200 KB) answers each cursor as
// its own Pull does, over gRPC and over Connect.
func TestPullManyLargeAnswer(t *testing.T) {
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := ctxT(t)
	const convs, each = 70, 10
	var reqs []client.SendRequest
	for k := range convs {
		for s := range each {
			reqs = append(reqs, client.SendRequest{ConvID: fmt.Sprintf("g:large-%d", k), FromUID: uint64(k + 1),
				Body: bytes.Repeat([]byte{byte(k + s)}, 200), ClientMsgID: fmt.Sprintf("large-%d-%d", k, s)})
		}
	}
	seed := newClient(t, client.Config{Addrs: []string{node.Addr()}})
	if _, errs := seed.SendMany(ctx, reqs); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	cursors := make([]client.Cursor, convs)
	for k := range cursors {
		cursors[k] = client.Cursor{ConvID: fmt.Sprintf("g:large-%d", k), AfterSeq: uint64(k % 3)}
	}
	for _, p := range []client.Protocol{client.ProtocolGRPC, client.ProtocolConnect} {
		c := newClient(t, client.Config{Addrs: []string{node.Addr()}, Protocol: p})
		pages, err := c.PullMany(ctx, cursors, 100, 4<<20)
		if err != nil || len(pages) != convs {
			t.Fatalf("%v: %d pages, %v", p, len(pages), err)
		}
		for k, page := range pages {
			want, err := c.PullPage(ctx, client.PullRequest{ConvID: cursors[k].ConvID, AfterSeq: cursors[k].AfterSeq, Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			if page.HeadSeq != each || page.HasMore || len(page.Messages) != each-k%3 || len(page.Messages) != len(want.Messages) {
				t.Fatalf("%v: page %d: head %d, more %v, %d messages; its Pull: %d", p, k, page.HeadSeq, page.HasMore, len(page.Messages), len(want.Messages))
			}
			for i, m := range page.Messages {
				w := want.Messages[i]
				if m.MsgID != w.MsgID || m.ConvID != w.ConvID || m.Seq != w.Seq || !bytes.Equal(m.Body, w.Body) || m.ClientMsgID != w.ClientMsgID || !m.ServerAt.Equal(w.ServerAt) {
					t.Fatalf("%v: page %d message %d: %+v, its Pull: %+v", p, k, i, m, w)
				}
			}
		}
	}
}
