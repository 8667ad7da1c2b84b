package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/feed"
	"github.com/sequencer-im/sequencer/internal/testwait"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

const (
	receiptsPath  = sequencerv1connect.SequencerServiceGetReadReceiptsProcedure
	positionsPath = sequencerv1connect.SequencerServiceListReadPositionsProcedure
)

// GetReadReceipts and ListReadPositions as curl posts them.
func TestReadReceiptsJSON(t *testing.T) {
	h := newHarness(t)
	h.reader.put(5, msgs("g:1", 1, 2, 3, 4, 5)...)
	for uid, seq := range map[string]string{"7": "3", "8": "5", "9": "1", "10": "5"} {
		if status, _, raw := h.post(t, markReadPath, `{"convId":"g:1","uid":"`+uid+`","seq":"`+seq+`"}`); status != 200 {
			t.Fatalf("MarkRead: %d %s", status, raw)
		}
	}
	for _, tc := range []struct{ path, body, want string }{
		{receiptsPath, `{"convId":"g:1","seqs":["5","1","3","4","6"]}`, `{"readBy":["2","4","3","2","0"]}`},
		{receiptsPath, `{"convId":"g:none","seqs":["1"]}`, `{"readBy":["0"]}`},
		{positionsPath, `{"convId":"g:1"}`, `{"positions":[{"uid":"7","readSeq":"3"},{"uid":"8","readSeq":"5"},{"uid":"9","readSeq":"1"},{"uid":"10","readSeq":"5"}]}`},
		{positionsPath, `{"convId":"g:1","limit":2}`, `{"positions":[{"uid":"7","readSeq":"3"},{"uid":"8","readSeq":"5"}],"hasMore":true}`},
		{positionsPath, `{"convId":"g:1","afterUid":"8","limit":2}`, `{"positions":[{"uid":"9","readSeq":"1"},{"uid":"10","readSeq":"5"}]}`},
		{positionsPath, `{"convId":"g:none"}`, `{}`},
	} {
		status, _, raw := h.post(t, tc.path, tc.body)
		if status != 200 || !sameJSON(t, raw, tc.want) {
			t.Fatalf("%s %s: %d %s, want %s", tc.path, tc.body, status, raw, tc.want)
		}
	}
	if got := counterValue(t, h.metrics.Requests.WithLabelValues(methodReceipts, "ok")); got != 2 {
		t.Fatalf("requests{GetReadReceipts,ok} = %v, want 2", got)
	}
	// A limit above 1,000 is clamped, not refused.
	if status, _, raw := h.post(t, positionsPath, `{"convId":"g:1","limit":100000}`); status != 200 {
		t.Fatalf("limit 100000: %d %s", status, raw)
	}
}

// Bad requests are invalid_argument and never reach the store; a node
// without read positions answers unimplemented.
func TestReadReceiptsValidation(t *testing.T) {
	h := newHarness(t)
	seqs := make([]string, 101)
	for i := range seqs {
		seqs[i] = fmt.Sprint(i + 1)
	}
	many, _ := json.Marshal(seqs)
	for _, tc := range []struct{ path, body, wantMsg string }{
		{receiptsPath, `{"seqs":["1"]}`, "conv_id: must be 1..64 bytes, got 0"},
		{receiptsPath, `{"convId":"g:1"}`, "seqs: must hold 1..100 seqs, got 0"},
		{receiptsPath, `{"convId":"g:1","seqs":` + string(many) + `}`, "seqs: must hold 1..100 seqs, got 101"},
		{receiptsPath, `{"convId":"g:1","seqs":["1","0"]}`, "seqs[1]: must be > 0 and < 2^63, got 0"},
		{receiptsPath, `{"convId":"g:1","seqs":["9223372036854775808"]}`, "seqs[0]: must be > 0 and < 2^63"},
		{positionsPath, `{}`, "conv_id: must be 1..64 bytes, got 0"},
		{positionsPath, `{"convId":"g:1","afterUid":"9223372036854775808"}`, "after_uid: must be < 2^63"},
	} {
		status, m, raw := h.post(t, tc.path, tc.body)
		if status != http.StatusBadRequest || m["code"] != "invalid_argument" {
			t.Fatalf("%s %s: %d %s, want 400 invalid_argument", tc.path, tc.body, status, raw)
		}
		if msg, _ := m["message"].(string); !strings.Contains(msg, tc.wantMsg) {
			t.Fatalf("%s %s: message %q does not contain %q", tc.path, tc.body, msg, tc.wantMsg)
		}
	}
	if n := h.reads.count(); n != 0 {
		t.Fatalf("the store was called %d times by invalid requests", n)
	}
	none := newHarness(t, func(c *Config) { c.Positions = nil })
	for _, path := range []string{receiptsPath, positionsPath} {
		status, m, raw := none.post(t, path, `{"convId":"g:1","seqs":["1"]}`)
		if status != http.StatusNotImplemented || m["code"] != "unimplemented" {
			t.Fatalf("%s without read positions: %d %s", path, status, raw)
		}
	}
}

// Subscribe with read_positions: a MarkRead on this node and a sender's
// own message come as read_position events; a stream without it gets
// none.
func TestSubscribeReadPositions(t *testing.T) {
	h, hub := feedHarness(t, feed.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := sequencerv1connectClient(t, h)
	st, err := c.Subscribe(ctx, connect.NewRequest(&sequencerv1.SubscribeRequest{Cursors: cursors("a", 0), ReadPositions: true}))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := c.Subscribe(ctx, connect.NewRequest(&sequencerv1.SubscribeRequest{Cursors: cursors("a", 0)}))
	if err != nil {
		t.Fatal(err)
	}
	// A message through both streams, once both are attached: the
	// sender's read tick is live only (a stream attached after the write
	// would get m1 from the backlog but never the tick; a CI run on a
	// loaded machine wrote before the attach and waited out the deadline).
	testwait.For(t, 5*time.Second, time.Millisecond, "both streams attached", func() bool {
		streams, _ := hub.Stats()
		return streams == 2
	})
	h.write(hub, "a", 0, 1)
	receive := func(st *connect.ServerStreamForClient[sequencerv1.SubscribeResponse], n int) (got []string) {
		t.Helper()
		for len(got) < n {
			if !st.Receive() {
				t.Fatalf("stream ended: %v (got %v)", st.Err(), got)
			}
			switch e := st.Msg().GetEvent().(type) {
			case *sequencerv1.SubscribeResponse_Message:
				got = append(got, "m"+itoa(e.Message.GetSeq()))
			case *sequencerv1.SubscribeResponse_ReadPosition:
				r := e.ReadPosition
				got = append(got, r.GetConvId()+"/"+itoa(r.GetUid())+"@"+itoa(r.GetReadSeq()))
			}
		}
		return got
	}
	// The sender's tick may come before or after the message.
	if got := receive(st, 2); !slices.Contains(got, "m1") || !slices.Contains(got, "a/1@1") {
		t.Fatalf("first events %v, want m1 and the sender's tick a/1@1", got)
	}
	if got := receive(plain, 1); !slices.Equal(got, []string{"m1"}) {
		t.Fatalf("plain stream: %v", got)
	}
	if status, _, raw := h.post(t, markReadPath, `{"convId":"a","uid":"7","seq":"1"}`); status != 200 {
		t.Fatalf("MarkRead: %d %s", status, raw)
	}
	if got := receive(st, 1); !slices.Equal(got, []string{"a/7@1"}) {
		t.Fatalf("after MarkRead: %v, want a/7@1", got)
	}
	h.write(hub, "a", 0, 2)
	if got := receive(plain, 1); !slices.Equal(got, []string{"m2"}) {
		t.Fatalf("plain stream got %v, want only m2 (no ticks)", got)
	}
}
