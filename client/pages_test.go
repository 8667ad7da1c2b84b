package client_test

import (
	"bytes"
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
