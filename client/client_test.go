package client_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
)

func TestSendResendReturnsFirstIDs(t *testing.T) {
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	for _, proto := range []client.Protocol{client.ProtocolGRPC, client.ProtocolConnect, client.ProtocolGRPCWeb} {
		t.Run(proto.String(), func(t *testing.T) {
			ctx := ctxT(t)
			c := newClient(t, client.Config{Addrs: []string{node.Addr()}, Protocol: proto})
			conv := "g:" + proto.String()
			req := client.SendRequest{ConvID: conv, FromUID: 1001, ClientMsgID: "k-" + proto.String(), MsgType: 7, Body: []byte("hi")}
			first, err := c.Send(ctx, req)
			if err != nil {
				t.Fatalf("send: %v", err)
			}
			if first.Seq != 1 || first.MsgID == 0 || first.Duplicate || first.ServerAt.IsZero() || first.ClientMsgID != req.ClientMsgID {
				t.Fatalf("first send = %+v", first)
			}
			again, err := c.Send(ctx, req)
			if err != nil {
				t.Fatalf("resend: %v", err)
			}
			if !again.Duplicate || again.MsgID != first.MsgID || again.Seq != first.Seq || !again.ServerAt.Equal(first.ServerAt) {
				t.Fatalf("resend = %+v, want the first send's ids %+v with duplicate", again, first)
			}
			next, err := c.Send(ctx, client.SendRequest{ConvID: conv, FromUID: 1001, Body: []byte("second")})
			if err != nil {
				t.Fatalf("send 2: %v", err)
			}
			if next.Seq != 2 || next.Duplicate || next.MsgID == first.MsgID {
				t.Fatalf("second message = %+v", next)
			}
			if _, err := uuid.Parse(next.ClientMsgID); err != nil {
				t.Fatalf("generated client_msg_id %q is not a UUID: %v", next.ClientMsgID, err)
			}

			page, err := c.Pull(ctx, conv, 0, 0)
			if err != nil {
				t.Fatalf("pull: %v", err)
			}
			if page.HeadSeq != 2 || page.HasMore || len(page.Messages) != 2 {
				t.Fatalf("pull = %+v", page)
			}
			m := page.Messages[0]
			if m.Seq != 1 || m.MsgID != first.MsgID || m.ConvID != conv || m.FromUID != 1001 || m.MsgType != 7 ||
				string(m.Body) != "hi" || m.ClientMsgID != req.ClientMsgID || !m.ServerAt.Equal(first.ServerAt) {
				t.Fatalf("pulled message 1 = %+v", m)
			}
			if m := page.Messages[1]; m.Seq != 2 || m.ClientMsgID != next.ClientMsgID || m.MsgType != sequencer.DefaultMsgType {
				t.Fatalf("pulled message 2 = %+v", m)
			}
			if page, err := c.Pull(ctx, conv, 1, 1); err != nil || len(page.Messages) != 1 || page.Messages[0].Seq != 2 || page.HasMore {
				t.Fatalf("pull after 1 = %+v, %v", page, err)
			}
			if head, err := c.GetHead(ctx, conv); err != nil || head != 2 {
				t.Fatalf("head = %d, %v; want 2", head, err)
			}
			got, err := c.GetMessage(ctx, next.MsgID)
			if err != nil || got.Seq != 2 || string(got.Body) != "second" {
				t.Fatalf("get message = %+v, %v", got, err)
			}
			r, err := c.Route(ctx, conv)
			if err != nil || r.Address != node.Addr() || r.NodeID != "node-1" {
				t.Fatalf("route = %+v, %v", r, err)
			}
		})
	}
}

// A Send whose answer is lost after the node stored it is retried with the
// same generated client_msg_id: the caller gets the first attempt's ids
// (duplicate), and the conversation holds the message once.
func TestLostAnswerRetriedWithSameGeneratedKey(t *testing.T) {
	ctx := ctxT(t)
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	rec := newRecorder(t)
	var lost atomic.Bool
	rec.loseAnswer = func(a attempt) bool { return a.method == "Send" && lost.CompareAndSwap(false, true) }
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}, Protocol: client.ProtocolConnect,
		HTTPClient: &http.Client{Transport: rec}})

	res, err := c.Send(ctx, client.SendRequest{ConvID: "g:lost", FromUID: 7, Body: []byte("once")})
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	if !res.Duplicate || res.Seq != 1 {
		t.Fatalf("send = %+v, want seq 1 reported as duplicate (the first attempt was stored)", res)
	}
	sends := rec.of("Send")
	if len(sends) != 2 || sends[0].err == nil || sends[1].err != nil {
		t.Fatalf("send attempts = %+v, want a failed one then a good one", sends)
	}
	for _, a := range sends {
		if a.clientMsgID != res.ClientMsgID || a.clientMsgID == "" {
			t.Fatalf("attempt carried client_msg_id %q, result says %q", a.clientMsgID, res.ClientMsgID)
		}
	}
	page, err := c.Pull(ctx, "g:lost", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if page.HeadSeq != 1 || len(page.Messages) != 1 || page.Messages[0].MsgID != res.MsgID {
		t.Fatalf("conversation = %+v, want exactly the one message %d", page, res.MsgID)
	}
}

// A node that goes away while a Send is retrying, and comes back on the
// same address: the Send succeeds once, with the key it generated at the
// start, and the conversation's seqs stay contiguous.
func TestSendRetriesAcrossNodeRestart(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	first := startNode(t, dir, "127.0.0.1:0")
	addr := first.Addr()
	rec := newRecorder(t)
	c := newClient(t, client.Config{Addrs: []string{addr}, Protocol: client.ProtocolConnect,
		HTTPClient: &http.Client{Transport: rec}})
	before, err := c.Send(ctx, client.SendRequest{ConvID: "g:restart", FromUID: 1, Body: []byte("before")})
	if err != nil || before.Seq != 1 {
		t.Fatalf("send before restart = %+v, %v", before, err)
	}
	shutdown(t, first)

	type outcome struct {
		res client.SendResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := c.Send(ctx, client.SendRequest{ConvID: "g:restart", FromUID: 1, Body: []byte("during")})
		done <- outcome{res, err}
	}()
	failed := func() int {
		n := 0
		for _, a := range rec.of("Send") {
			if a.err != nil {
				n++
			}
		}
		return n
	}
	rec.waitFor(t, "two failed send attempts", func() bool { return failed() >= 2 })

	restartOn(t, dir, addr)
	got := <-done
	if got.err != nil {
		t.Fatalf("send across restart: %v", got.err)
	}
	if got.res.Seq != 2 || got.res.Duplicate {
		t.Fatalf("send across restart = %+v, want seq 2, not a duplicate", got.res)
	}
	keys := map[string]bool{}
	for _, a := range rec.of("Send")[1:] {
		keys[a.clientMsgID] = true
	}
	if len(keys) != 1 || !keys[got.res.ClientMsgID] {
		t.Fatalf("retries carried client_msg_ids %v, want only %q", keys, got.res.ClientMsgID)
	}
	page, err := c.Pull(ctx, "g:restart", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, m := range page.Messages {
		seqs = append(seqs, m.Seq)
	}
	if !slices.Equal(seqs, []uint64{1, 2}) || page.HeadSeq != 2 || string(page.Messages[1].Body) != "during" {
		t.Fatalf("seqs after restart = %v (head %d), want [1 2]", seqs, page.HeadSeq)
	}
}

// restartOn starts a node on addr, which was just released: until the
// kernel lets it go the listen fails, so poll briefly.
func restartOn(t *testing.T, dir, addr string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := tryStartNode(dir, addr)
		if err == nil {
			t.Cleanup(func() { shutdown(t, s) })
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("restart node on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond) // the port is busy: poll
	}
}

func TestNonRetryableErrorsAreNotRetried(t *testing.T) {
	ctx := ctxT(t)
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	rec := newRecorder(t)
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}, HTTPClient: &http.Client{Transport: rec}})

	_, err := c.Send(ctx, client.SendRequest{ConvID: "g:bad", FromUID: 0, ClientMsgID: "k", Body: []byte("x")})
	if code := sequencer.ErrorCode(err); code != sequencer.CodeInvalidArgument {
		t.Fatalf("from_uid 0: code %v (%v), want invalid_argument", code, err)
	}
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument {
		t.Fatalf("from_uid 0: no connect error in the chain: %v", err)
	}
	if n := len(rec.of("Send")); n != 1 {
		t.Fatalf("invalid send made %d attempts, want 1", n)
	}

	// A bad conv_id fails at Route already; the Send is not even made.
	_, err = c.Send(ctx, client.SendRequest{ConvID: "", FromUID: 1, ClientMsgID: "k", Body: []byte("x")})
	if code := sequencer.ErrorCode(err); code != sequencer.CodeInvalidArgument {
		t.Fatalf("empty conv_id: code %v (%v), want invalid_argument", code, err)
	}
	if n := len(rec.of("Send")); n != 1 {
		t.Fatalf("empty conv_id made %d more send attempts, want 0", n-1)
	}

	if _, err := c.Send(ctx, client.SendRequest{ConvID: "g:a", FromUID: 5, ClientMsgID: "dup", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Send(ctx, client.SendRequest{ConvID: "g:b", FromUID: 5, ClientMsgID: "dup", Body: []byte("x")})
	if code := sequencer.ErrorCode(err); code != sequencer.CodeAlreadyExists {
		t.Fatalf("key reused in another conversation: code %v (%v), want already_exists", code, err)
	}
	if n := len(rec.of("Send")); n != 3 {
		t.Fatalf("sends so far %d, want 3 (already_exists not retried)", n)
	}

	_, err = c.GetMessage(ctx, 12345)
	if code := sequencer.ErrorCode(err); code != sequencer.CodeNotFound {
		t.Fatalf("unknown msg_id: code %v (%v), want not_found", code, err)
	}
	if n := len(rec.of("GetMessage")); n != 1 {
		t.Fatalf("not_found made %d attempts, want 1", n)
	}
	if _, err := c.Pull(ctx, "g:a", 0, -1); sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
		t.Fatalf("negative limit: %v, want invalid_argument", err)
	}
}

func TestUnreachableFirstAddressFallsBack(t *testing.T) {
	ctx := ctxT(t)
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	dead := deadAddr(t)
	rec := newRecorder(t)
	c := newClient(t, client.Config{Addrs: []string{dead, "http://" + node.Addr()}, HTTPClient: &http.Client{Transport: rec}})
	for i := range 4 {
		res, err := c.Send(ctx, client.SendRequest{ConvID: "g:fallback", FromUID: 3, Body: []byte("x")})
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if res.Seq != uint64(i+1) || res.Duplicate {
			t.Fatalf("send %d = %+v", i, res)
		}
		if head, err := c.GetHead(ctx, "g:fallback"); err != nil || head != uint64(i+1) {
			t.Fatalf("head after send %d = %d, %v", i, head, err)
		}
	}
	if page, err := c.Pull(ctx, "g:fallback", 0, 10); err != nil || len(page.Messages) != 4 {
		t.Fatalf("pull = %+v, %v", page, err)
	}
	reachedDead := 0
	for _, a := range rec.all() {
		if a.host == dead {
			reachedDead++
		}
	}
	if reachedDead == 0 {
		t.Fatalf("the dead address was never tried; the test proves nothing")
	}
}

func TestRetryBudgetAndCallerContext(t *testing.T) {
	dead := deadAddr(t)

	t.Run("max attempts", func(t *testing.T) {
		rec := newRecorder(t)
		c := newClient(t, client.Config{Addrs: []string{dead}, HTTPClient: &http.Client{Transport: rec},
			Retry: client.RetryPolicy{MaxAttempts: 3, BaseBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}})
		res, err := c.Send(ctxT(t), client.SendRequest{ConvID: "g:1", FromUID: 1, Body: []byte("x")})
		if code := sequencer.ErrorCode(err); code != sequencer.CodeUnavailable {
			t.Fatalf("code %v (%v), want unavailable", code, err)
		}
		if res.ClientMsgID == "" {
			t.Fatalf("a failed send must still report its client_msg_id")
		}
		if n := len(rec.of("Send")); n != 3 {
			t.Fatalf("%d send attempts, want 3", n)
		}
	})

	t.Run("caller deadline", func(t *testing.T) {
		c := newClient(t, client.Config{Addrs: []string{dead}})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := c.Send(ctx, client.SendRequest{ConvID: "g:1", FromUID: 1, Body: []byte("x")})
		if code := sequencer.ErrorCode(err); code != sequencer.CodeDeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("code %v (%v), want deadline_exceeded", code, err)
		}
	})

	t.Run("caller cancel", func(t *testing.T) {
		rec := newRecorder(t)
		c := newClient(t, client.Config{Addrs: []string{dead}, HTTPClient: &http.Client{Transport: rec}})
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := c.GetHead(ctx, "g:1")
			errc <- err
		}()
		rec.waitFor(t, "a failed attempt", func() bool { return len(rec.of("GetHead")) >= 1 })
		cancel()
		err := <-errc
		if code := sequencer.ErrorCode(err); code != sequencer.CodeCanceled || !errors.Is(err, context.Canceled) {
			t.Fatalf("code %v (%v), want canceled", code, err)
		}
	})

	t.Run("overall deadline", func(t *testing.T) {
		c := newClient(t, client.Config{Addrs: []string{dead},
			Retry: client.RetryPolicy{Deadline: 100 * time.Millisecond, BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}})
		_, err := c.Pull(ctxT(t), "g:1", 0, 0)
		if code := sequencer.ErrorCode(err); code != sequencer.CodeUnavailable {
			t.Fatalf("code %v (%v), want unavailable (the last attempt's)", code, err)
		}
	})

	t.Run("closed", func(t *testing.T) {
		c := newClient(t, client.Config{Addrs: []string{dead}})
		c.Close()
		_, err := c.GetHead(ctxT(t), "g:1")
		if !errors.Is(err, client.ErrClosed) || sequencer.ErrorCode(err) != sequencer.CodeCanceled {
			t.Fatalf("after Close: %v", err)
		}
	})
}

func TestNewValidatesConfig(t *testing.T) {
	for _, cfg := range []client.Config{
		{},
		{Addrs: []string{"no-port"}},
		{Addrs: []string{"http://"}},
		{Addrs: []string{"127.0.0.1:1"}, Retry: client.RetryPolicy{MaxAttempts: -1}},
		{Addrs: []string{"127.0.0.1:1"}, Retry: client.RetryPolicy{BaseBackoff: 2 * time.Second}},
		{Addrs: []string{"127.0.0.1:1"}, Retry: client.RetryPolicy{RouteCheck: -time.Second}},
		{Addrs: []string{"127.0.0.1:1"}, Protocol: client.Protocol(9)},
		{Addrs: []string{"127.0.0.1:1"}, Batching: client.BatchPolicy{MaxInFlight: -1}},
		{Addrs: []string{"127.0.0.1:1"}, Batching: client.BatchPolicy{MaxInFlight: 65}},
	} {
		if _, err := client.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}
