package client_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
)

// A user's own Send moves their read position (own messages are read);
// another user's MarkRead clears their unread, never goes backwards, clamps
// to the head; ReadState answers many conversations in order, in every
// protocol.
func TestMarkReadAndReadState(t *testing.T) {
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	for _, proto := range []client.Protocol{client.ProtocolGRPC, client.ProtocolConnect, client.ProtocolGRPCWeb} {
		t.Run(proto.String(), func(t *testing.T) {
			ctx := ctxT(t)
			c := newClient(t, client.Config{Addrs: []string{node.Addr()}, Protocol: proto})
			conv, other := "g:read-"+proto.String(), "g:other-"+proto.String()
			var last client.SendResult
			for i := 0; i < 3; i++ {
				r, err := c.Send(ctx, client.SendRequest{ConvID: conv, FromUID: 1001, Body: []byte("x")})
				if err != nil {
					t.Fatal(err)
				}
				last = r
			}
			states, err := c.GetReadState(ctx, 1001, []string{conv, other, conv})
			if err != nil {
				t.Fatal(err)
			}
			want := []client.ReadState{{ConvID: conv, ReadSeq: 3, Head: 3}, {ConvID: other}, {ConvID: conv, ReadSeq: 3, Head: 3}}
			for i := range want {
				if states[i] != want[i] {
					t.Fatalf("state %d = %+v, want %+v (own sends are read)", i, states[i], want[i])
				}
			}
			if states[0].Unread() != 0 {
				t.Fatalf("unread of the sender = %d, want 0", states[0].Unread())
			}
			// Another reader marks the last message: nothing unread.
			st, err := c.MarkRead(ctx, conv, 1003, last.Seq)
			if err != nil || st != (client.ReadState{ConvID: conv, ReadSeq: 3, Head: 3}) || st.Unread() != 0 {
				t.Fatalf("MarkRead(last seq) = %+v, %v", st, err)
			}
			if st, err = c.MarkRead(ctx, conv, 1003, 1); err != nil || st.ReadSeq != 3 {
				t.Fatalf("MarkRead(1) after 3 = %+v, %v: went backwards", st, err)
			}
			if st, err = c.Mark(ctx, client.MarkReadRequest{ConvID: conv, UID: 1002, Seq: 50}); err != nil || st.ReadSeq != 3 || st.HeadSeq() != 3 {
				t.Fatalf("Mark(uid 1002, seq 50) = %+v, %v: want clamped to head 3", st, err)
			}
		})
	}
}

// Invalid input is invalid_argument, not retried, and stores nothing.
func TestReadPositionInvalidIsNotRetried(t *testing.T) {
	ctx := ctxT(t)
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	rec := newRecorder(t)
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}, HTTPClient: &http.Client{Transport: rec}})
	if _, err := c.Send(ctx, client.SendRequest{ConvID: "g:1", FromUID: 1, Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		conv     string
		uid, seq uint64
	}{{"g:1", 0, 1}, {"g:1", sequencer.MaxID, 1}, {"", 1, 1}, {"g:1", 1, sequencer.MaxID}} {
		if _, err := c.MarkRead(ctx, tc.conv, tc.uid, tc.seq); sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
			t.Fatalf("MarkRead(%q, %d, %d): %v, want invalid_argument", tc.conv, tc.uid, tc.seq, err)
		}
	}
	if n := len(rec.of("MarkRead")); n != 4 {
		t.Fatalf("4 invalid marks made %d attempts, want 4", n)
	}
	if _, err := c.GetReadState(ctx, 1, nil); sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
		t.Fatalf("ReadState of no conversations: %v, want invalid_argument", err)
	}
	many := make([]string, sequencer.MaxReadStateConvs+1)
	for i := range many {
		many[i] = fmt.Sprintf("g:%d", i)
	}
	if _, err := c.GetReadState(ctx, 1, many); sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
		t.Fatalf("ReadState of 1001 conversations: %v, want invalid_argument", err)
	}
	states, err := c.GetReadState(ctx, 1, many[:sequencer.MaxReadStateConvs])
	if err != nil || len(states) != sequencer.MaxReadStateConvs || states[1].Head != 1 || states[1].ReadSeq != 1 { // uid 1 sent g:1 seq 1: read
		t.Fatalf("ReadState of 1,000 conversations: %d states, %v", len(states), err)
	}
}

// A MarkRead whose answer was lost is retried, and the retry is harmless:
// the position is the one asked for, once.
func TestMarkReadLostAnswerIsRetried(t *testing.T) {
	ctx := ctxT(t)
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	rec := newRecorder(t)
	var lost atomic.Int32
	rec.loseAnswer = func(a attempt) bool { return a.method == "MarkRead" && lost.Add(1) == 1 }
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}, HTTPClient: &http.Client{Transport: rec}})
	for i := 0; i < 4; i++ {
		if _, err := c.Send(ctx, client.SendRequest{ConvID: "g:1", FromUID: 1, Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := c.MarkRead(ctx, "g:1", 9, 2)
	if err != nil || st.ReadSeq != 2 || st.Head != 4 || st.Unread() != 2 {
		t.Fatalf("MarkRead after a lost answer = %+v, %v", st, err)
	}
	if n := len(rec.of("MarkRead")); n != 2 {
		t.Fatalf("MarkRead made %d attempts, want 2 (one lost answer, one retry)", n)
	}
}
