package api

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

func seqsOf(ms []*sequencerv1.Message) []uint64 {
	var out []uint64
	for _, m := range ms {
		out = append(out, m.GetSeq())
	}
	return out
}

func seqRange(lo, hi uint64) []uint64 {
	var out []uint64
	for s := lo; s <= hi; s++ {
		out = append(out, s)
	}
	return out
}

// Pull with before_seq: the newest page first, ascending, paging backwards.
func TestPullBeforeSeq(t *testing.T) {
	tests := []struct {
		name      string
		stored    []uint64
		head      uint64
		after     uint64
		before    uint64
		limit     uint32
		maxBytes  uint32
		wantSeqs  []uint64
		wantMore  bool
		wantHeadS uint64
	}{
		{name: "newest 3 from the head", stored: seqRange(1, 10), head: 10, before: 11, limit: 3, wantSeqs: []uint64{8, 9, 10}, wantMore: true},
		{name: "before far above the head", stored: seqRange(1, 10), head: 10, before: ^uint64(0), limit: 3, wantSeqs: []uint64{8, 9, 10}, wantMore: true},
		{name: "next page back", stored: seqRange(1, 10), head: 10, before: 8, limit: 3, wantSeqs: []uint64{5, 6, 7}, wantMore: true},
		{name: "last page back", stored: seqRange(1, 10), head: 10, before: 4, limit: 3, wantSeqs: []uint64{1, 2, 3}, wantMore: false},
		{name: "short last page", stored: seqRange(1, 10), head: 10, before: 3, limit: 3, wantSeqs: []uint64{1, 2}, wantMore: false},
		{name: "bounded below by after_seq", stored: seqRange(1, 10), head: 10, after: 6, before: 11, limit: 3, wantSeqs: []uint64{8, 9, 10}, wantMore: true},
		{name: "exactly the range", stored: seqRange(1, 10), head: 10, after: 7, before: 11, limit: 3, wantSeqs: []uint64{8, 9, 10}, wantMore: false},
		{name: "empty range", stored: seqRange(1, 10), head: 10, after: 5, before: 6, limit: 3},
		{name: "before 1", stored: seqRange(1, 10), head: 10, before: 1, limit: 3},
		{name: "empty conversation", before: 100, limit: 3},
		{name: "trimmed prefix", stored: seqRange(4, 10), head: 10, before: 6, limit: 3, wantSeqs: []uint64{4, 5}, wantMore: false},
		{name: "max_bytes keeps the newest", stored: seqRange(1, 10), head: 10, before: 11, limit: 5, maxBytes: 67 + 68, wantSeqs: []uint64{9, 10}, wantMore: true},
		{name: "max_bytes 1 still one", stored: seqRange(1, 10), head: 10, before: 11, limit: 5, maxBytes: 1, wantSeqs: []uint64{10}, wantMore: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			if len(tt.stored) > 0 {
				h.reader.put(tt.head, msgs("c", tt.stored...)...)
			}
			resp, err := h.client().Pull(context.Background(), connect.NewRequest(&sequencerv1.PullRequest{
				ConvId: "c", AfterSeq: tt.after, BeforeSeq: tt.before, Limit: tt.limit, MaxBytes: tt.maxBytes}))
			if err != nil {
				t.Fatal(err)
			}
			got := seqsOf(resp.Msg.GetMessages())
			if fmt.Sprint(got) != fmt.Sprint(tt.wantSeqs) || resp.Msg.GetHasMore() != tt.wantMore || resp.Msg.GetHeadSeq() != tt.head {
				t.Fatalf("got seqs %v has_more %v head %d, want %v %v %d", got, resp.Msg.GetHasMore(), resp.Msg.GetHeadSeq(), tt.wantSeqs, tt.wantMore, tt.head)
			}
		})
	}
}

// Paging backwards with before_seq = the first seq of the previous page
// walks the whole conversation once, newest first.
func TestPullBeforeSeqWalk(t *testing.T) {
	h := newHarness(t)
	h.reader.put(95, msgs("c", seqRange(1, 95)...)...)
	var all []uint64
	before := ^uint64(0)
	for pages := 0; ; pages++ {
		if pages > 20 {
			t.Fatal("more than 20 pages of 10 for 95 messages")
		}
		resp, err := h.client().Pull(context.Background(), connect.NewRequest(&sequencerv1.PullRequest{ConvId: "c", BeforeSeq: before, Limit: 10}))
		if err != nil {
			t.Fatal(err)
		}
		got := seqsOf(resp.Msg.GetMessages())
		all = append(got, all...)
		if !resp.Msg.GetHasMore() {
			break
		}
		before = got[0]
	}
	if fmt.Sprint(all) != fmt.Sprint(seqRange(1, 95)) {
		t.Fatalf("walked %v", all)
	}
}

// convMsgs is msgs with msg_ids and resend keys unique to conv.
func convMsgs(conv string, base uint64, seqs ...uint64) []sequencer.Message {
	out := msgs(conv, seqs...)
	for i := range out {
		out[i].MsgID += base
		out[i].ClientMsgID = fmt.Sprint(conv, out[i].ClientMsgID)
	}
	return out
}

func cursors(kv ...any) []*sequencerv1.Cursor {
	var out []*sequencerv1.Cursor
	for i := 0; i < len(kv); i += 2 {
		out = append(out, &sequencerv1.Cursor{ConvId: kv[i].(string), AfterSeq: uint64(kv[i+1].(int))})
	}
	return out
}

func TestPullMany(t *testing.T) {
	h := newHarness(t)
	h.reader.put(10, convMsgs("a", 0, seqRange(1, 10)...)...)
	h.reader.put(3, convMsgs("b", 100, seqRange(1, 3)...)...)
	h.reader.put(8, convMsgs("t", 200, seqRange(6, 8)...)...) // 1..5 trimmed
	pull := func(limit, maxBytes uint32, cs ...*sequencerv1.Cursor) []*sequencerv1.PullResponse {
		t.Helper()
		resp, err := h.client().PullMany(context.Background(), connect.NewRequest(&sequencerv1.PullManyRequest{Cursors: cs, Limit: limit, MaxBytes: maxBytes}))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Msg.GetPages()) != len(cs) {
			t.Fatalf("%d pages for %d cursors", len(resp.Msg.GetPages()), len(cs))
		}
		return resp.Msg.GetPages()
	}
	type want struct {
		seqs []uint64
		head uint64
		more bool
	}
	check := func(pages []*sequencerv1.PullResponse, ws ...want) {
		t.Helper()
		for i, w := range ws {
			p := pages[i]
			if fmt.Sprint(seqsOf(p.GetMessages())) != fmt.Sprint(w.seqs) || p.GetHeadSeq() != w.head || p.GetHasMore() != w.more {
				t.Fatalf("page %d: seqs %v head %d has_more %v, want %v %d %v", i, seqsOf(p.GetMessages()), p.GetHeadSeq(), p.GetHasMore(), w.seqs, w.head, w.more)
			}
		}
	}
	// In request order, a limit per conversation, unknown conversations as
	// empty pages, a trimmed prefix visible as the first seq.
	check(pull(4, 0, cursors("b", 0, "a", 2, "nobody", 0, "t", 0, "a2", 7)...),
		want{[]uint64{1, 2, 3}, 3, false},
		want{[]uint64{3, 4, 5, 6}, 10, true},
		want{nil, 0, false},
		want{[]uint64{6, 7, 8}, 8, false},
		want{nil, 0, false})
	// max_bytes over the whole answer: a cut page and the pages after it
	// say has_more; at least one message overall.
	per := uint32(messageSize(&convMsgs("a", 0, 1)[0]))
	check(pull(100, 4*per, cursors("b", 0, "a", 0, "t", 5)...),
		want{[]uint64{1, 2, 3}, 3, false},
		want{[]uint64{1}, 10, true},
		want{nil, 8, true})
	check(pull(100, 1, cursors("a", 8, "b", 0)...),
		want{[]uint64{9}, 10, true},
		want{nil, 3, true})
	// At or past the head: nothing, no more.
	check(pull(100, 0, cursors("a", 10, "b", 99)...),
		want{nil, 10, false},
		want{nil, 3, false})
	if h.reader.manys != 4 {
		t.Fatalf("%d ReadMany calls for 4 PullMany calls, want one each", h.reader.manys)
	}
}

func TestPullManyInvalid(t *testing.T) {
	h := newHarness(t)
	many := make([]*sequencerv1.Cursor, MaxPullManyCursors+1)
	for i := range many {
		many[i] = &sequencerv1.Cursor{ConvId: fmt.Sprint("c", i)}
	}
	for _, tt := range []struct {
		name string
		cs   []*sequencerv1.Cursor
		want string
	}{
		{"no cursors", nil, "cursors: must hold 1..1000 cursors, got 0"},
		{"too many", many, "cursors: must hold 1..1000 cursors, got 1001"},
		{"bad conv_id", cursors("ok", 0, "", 0), "cursors[1]: conv_id: must be 1..64 bytes, got 0"},
		{"control char", cursors("a\nb", 0), "cursors[0]: conv_id: must not contain control characters"},
		{"twice", cursors("a", 0, "b", 0, "a", 5), `cursors[2]: conversation "a" is already cursors[0]`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.client().PullMany(context.Background(), connect.NewRequest(&sequencerv1.PullManyRequest{Cursors: tt.cs}))
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument || !strings.Contains(ce.Message(), tt.want) {
				t.Fatalf("err %v, want invalid_argument %q", err, tt.want)
			}
		})
	}
	if h.reader.manys != 0 {
		t.Fatalf("an invalid PullMany reached the store")
	}
}

// A store failure is the store's code, not a partial answer.
func TestPullManyStoreDown(t *testing.T) {
	h := newHarness(t)
	h.reader.setErr(fmt.Errorf("dial: %w", sequencer.ErrStoreUnavailable))
	_, err := h.client().PullMany(context.Background(), connect.NewRequest(&sequencerv1.PullManyRequest{Cursors: cursors("a", 0)}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("err %v, want unavailable", err)
	}
}

// PullMany's JSON names, as curl sends them.
func TestPullManyJSON(t *testing.T) {
	h := newHarness(t)
	h.reader.put(2, msgs("a", 1, 2)...)
	code, body, raw := h.post(t, "/sequencer.v1.SequencerService/PullMany", `{"cursors":[{"convId":"a","afterSeq":"1"},{"convId":"z"}],"limit":10}`)
	if code != 200 {
		t.Fatalf("status %d: %s", code, raw)
	}
	pages, _ := body["pages"].([]any)
	if len(pages) != 2 || !strings.Contains(raw, `"seq":"2"`) || !strings.Contains(raw, `"headSeq":"2"`) {
		t.Fatalf("answer %s", raw)
	}
}
