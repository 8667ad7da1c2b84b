package console

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/feed"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// The live view's stream: what is stored above after_seq, then what is
// committed while it is open, as server-sent events in seq order; from a
// real feed hub on a store, as the server wires it.
func TestTailStreamsStoredThenLive(t *testing.T) {
	st := memstore.New()
	hub := feed.NewHub(feed.Config{}, nil)
	commit := func(prev uint64, seqs ...uint64) []sequencer.Message {
		b := persist.ConvBatch{ConvID: "g:1", PrevHead: prev}
		for _, s := range seqs {
			b.Messages = append(b.Messages, sequencer.Message{ConvID: "g:1", Seq: s, MsgID: 100 + s, FromUID: 7, ClientMsgID: "k" + string(rune('0'+s)), Body: []byte("hello"), ServerAt: time.Unix(1, 0).UTC()})
		}
		if err := st.Commit(context.Background(), []persist.ConvBatch{b}); err != nil {
			t.Fatal(err)
		}
		return b.Messages
	}
	commit(0, 1, 2, 3)
	tail := func(ctx context.Context, conv string, after uint64, send func(*sequencer.Message) error) error {
		return hub.Serve(ctx, feed.Subscription{Cursors: []persist.Cursor{{ConvID: conv, AfterSeq: after}}, Store: st,
			Send: func(e feed.Event) error {
				if e.Kind != feed.KindMessage {
					return nil
				}
				return send(e.Msg)
			}})
	}
	c := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{}, Tail: tail})
	defer c.Close()
	srv := httptest.NewServer(c)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/console/api/tail?conv_id=g:1&after_seq=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
	}
	sc := bufio.NewScanner(resp.Body)
	next := func() string {
		t.Helper()
		var ev []string
		for sc.Scan() {
			if sc.Text() == "" {
				return strings.Join(ev, "|")
			}
			ev = append(ev, sc.Text())
		}
		t.Fatalf("stream ended: %v", sc.Err())
		return ""
	}
	for _, seq := range []string{"2", "3"} {
		if ev := next(); !strings.HasPrefix(ev, "event: message|data: ") || !strings.Contains(ev, `"seq":"`+seq+`"`) || !strings.Contains(ev, `"bodyBytes":5`) {
			t.Fatalf("stored event: %q, want seq %s", ev, seq)
		}
	}
	hub.Publish("g:1", commit(3, 4)) // committed while the view is open
	if ev := next(); !strings.Contains(ev, `"seq":"4"`) || !strings.Contains(ev, `"msgId":"104"`) {
		t.Fatalf("live event: %q, want seq 4", ev)
	}
}

// Refusals: the lookup's token, a node without a feed, bad input.
func TestTailRefusals(t *testing.T) {
	noop := func(context.Context, string, uint64, func(*sequencer.Message) error) error { return nil }
	for _, tc := range []struct {
		name string
		cfg  Config
		path string
		want int
	}{
		{"token", Config{Tail: noop, Authorize: func(*http.Request) bool { return false }}, "tail?conv_id=a&after_seq=0", 401},
		{"no feed", Config{}, "tail?conv_id=a&after_seq=0", 501},
		{"bad conv", Config{Tail: noop}, "tail?conv_id=&after_seq=0", 400},
		{"bad seq", Config{Tail: noop}, "tail?conv_id=a&after_seq=x", 400},
	} {
		tc.cfg.NodeID, tc.cfg.Cluster, tc.cfg.Reader = "n1", fakeView{}, fakeReader{}
		c := New(tc.cfg)
		if code, body := get(t, c, "/console/api/"+tc.path); code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, code, body, tc.want)
		}
		c.Close()
	}
}
