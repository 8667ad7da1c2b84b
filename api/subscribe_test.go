package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/feed"
	"github.com/sequencer-im/sequencer/persist"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// feedHarness is a harness whose Service has a feed hub; write stores
// messages and publishes them, as a conversation actor does after the
// commit.
func feedHarness(t *testing.T, cfg feed.Config) (*harness, *feed.Hub) {
	hub := feed.NewHub(cfg, nil)
	h := newHarness(t, func(c *Config) { c.Feed = hub })
	return h, hub
}

func (h *harness) write(hub *feed.Hub, conv string, base uint64, seqs ...uint64) {
	ms := convMsgs(conv, base, seqs...)
	h.reader.put(seqs[len(seqs)-1], ms...)
	hub.Publish(conv, ms)
}

// recv reads events until pred says stop, or fails at the deadline.
func recvUntil(t *testing.T, st *connect.ServerStreamForClient[sequencerv1.SubscribeResponse], stop func(got []string) bool) []string {
	t.Helper()
	var got []string
	for !stop(got) {
		if !st.Receive() {
			t.Fatalf("stream ended: %v (got %v)", st.Err(), got)
		}
		switch e := st.Msg().GetEvent().(type) {
		case *sequencerv1.SubscribeResponse_Message:
			got = append(got, e.Message.GetConvId()+":"+itoa(e.Message.GetSeq()))
		case *sequencerv1.SubscribeResponse_Truncated:
			got = append(got, "T("+e.Truncated.GetConvId()+","+itoa(e.Truncated.GetOldestSeq())+")")
		case *sequencerv1.SubscribeResponse_Heartbeat:
			got = append(got, "♥")
		}
	}
	return got
}

func itoa(u uint64) string { return uintString(u) }

func uintString(u uint64) string {
	b, _ := json.Marshal(u)
	return string(b)
}

func lenIs(n int) func([]string) bool { return func(g []string) bool { return len(g) >= n } }

// Backlog then live, over each protocol: every stored seq of each
// conversation once, in order; a trimmed prefix shows as Truncated.
func TestSubscribeBacklogThenLive(t *testing.T) {
	for name, opts := range protocols() {
		t.Run(name, func(t *testing.T) {
			h, hub := feedHarness(t, feed.Config{})
			h.write(hub, "a", 0, 1, 2, 3)
			h.write(hub, "t", 100, 5, 6) // 1..4 trimmed
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := sequencerv1connectClient(t, h, opts...)
			st, err := c.Subscribe(ctx, connect.NewRequest(&sequencerv1.SubscribeRequest{Cursors: cursors("a", 1, "t", 0)}))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			got := recvUntil(t, st, lenIs(5))
			h.write(hub, "a", 0, 4, 5)
			got = append(got, recvUntil(t, st, lenIs(2))...)
			want := "a:2 a:3 T(t,5) t:5 t:6 a:4 a:5"
			if g := strings.Join(sortedPerConv(got), " "); g != sortedPerConvS(want) {
				t.Fatalf("got %v, want %s (order within a conversation)", got, want)
			}
		})
	}
}

// sortedPerConv keeps each conversation's events in their order and lists
// conversations by name: interleaving across conversations is free.
func sortedPerConv(evs []string) []string {
	by := map[string][]string{}
	var names []string
	for _, e := range evs {
		k := e
		if i := strings.IndexAny(e, ":,"); i >= 0 {
			k = strings.TrimPrefix(e[:i], "T(")
		}
		if _, ok := by[k]; !ok {
			names = append(names, k)
		}
		by[k] = append(by[k], e)
	}
	sortStrings(names)
	var out []string
	for _, n := range names {
		out = append(out, by[n]...)
	}
	return out
}

func sortedPerConvS(s string) string { return strings.Join(sortedPerConv(strings.Fields(s)), " ") }

func sortStrings(s []string) {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
}

func sequencerv1connectClient(t *testing.T, h *harness, opts ...connect.ClientOption) sequencerv1connectSubscriber {
	return newClientOn(h2cClient(t), h.url, opts...)
}

// subscribeFrom0 opens a Subscribe to conv from seq 0 on h, over gRPC, for at
// most timeout; the stream is closed when the test ends.
func subscribeFrom0(t *testing.T, h *harness, conv string, timeout time.Duration) *connect.ServerStreamForClient[sequencerv1.SubscribeResponse] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	st, err := sequencerv1connectClient(t, h).Subscribe(ctx, connect.NewRequest(&sequencerv1.SubscribeRequest{Cursors: cursors(conv, 0)}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// Bad requests are invalid_argument before any event.
func TestSubscribeInvalid(t *testing.T) {
	h, _ := feedHarness(t, feed.Config{})
	many := make([]*sequencerv1.Cursor, MaxSubscribeCursors+1)
	for i := range many {
		many[i] = &sequencerv1.Cursor{ConvId: "c" + uintString(uint64(i))}
	}
	for _, tt := range []struct {
		name string
		cs   []*sequencerv1.Cursor
		want string
	}{
		{"none", nil, "cursors: must hold 1..10000 cursors, got 0"},
		{"too many", many, "got 10001"},
		{"bad conv_id", cursors("a", 0, "", 0), "cursors[1]: conv_id"},
		{"twice", cursors("a", 0, "a", 3), `conversation "a" is already cursors[0]`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st, err := sequencerv1connectClient(t, h).Subscribe(context.Background(), connect.NewRequest(&sequencerv1.SubscribeRequest{Cursors: tt.cs}))
			if err == nil {
				if st.Receive() {
					t.Fatalf("an event before the error: %v", st.Msg())
				}
				err = st.Err()
			}
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument || !strings.Contains(ce.Message(), tt.want) {
				t.Fatalf("err %v, want invalid_argument %q", err, tt.want)
			}
		})
	}
}

// A subscriber that stops reading is cut with resource_exhausted, however
// its transport blocks; the writer never waits.
func TestSubscribeSlowConsumerCut(t *testing.T) {
	h, hub := feedHarness(t, feed.Config{MaxQueue: 16})
	st := subscribeFrom0(t, h, "a", 30*time.Second)
	h.write(hub, "a", 0, 1)
	recvUntil(t, st, lenIs(1))
	// 64 KiB bodies fill the transport's windows long before 2,000 are
	// published: the stream's queue overflows while the client reads
	// nothing.
	body := make([]byte, 64<<10)
	for s := uint64(2); s < 2000; s++ {
		ms := convMsgs("a", 0, s)
		ms[0].Body = body
		hub.Publish("a", ms)
	}
	for st.Receive() {
	}
	if connect.CodeOf(st.Err()) != connect.CodeResourceExhausted || !strings.Contains(st.Err().Error(), "subscribe again") {
		t.Fatalf("slow consumer ended with %v, want resource_exhausted saying to resume", st.Err())
	}
}

// Connect streaming with JSON, as curl speaks it: enveloped JSON messages
// with the contract's names, ending with an end-of-stream frame.
func TestSubscribeConnectJSON(t *testing.T) {
	h, hub := feedHarness(t, feed.Config{})
	h.write(hub, "g:1", 0, 1, 2)
	req := []byte(`{"cursors":[{"convId":"g:1","afterSeq":"1"}]}`)
	frame := make([]byte, 5+len(req))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(req)))
	copy(frame[5:], req)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"/sequencer.v1.SequencerService/Subscribe", strings.NewReader(string(frame)))
	r.Header.Set("Content-Type", "application/connect+json")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	var head [5]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, binary.BigEndian.Uint32(head[1:]))
	if _, err := io.ReadFull(br, msg); err != nil {
		t.Fatal(err)
	}
	if s := string(msg); !strings.Contains(s, `"message":{`) || !strings.Contains(s, `"convId":"g:1"`) || !strings.Contains(s, `"seq":"2"`) {
		t.Fatalf("first event %s", s)
	}
}

// A quiet stream gets heartbeats.
func TestSubscribeHeartbeat(t *testing.T) {
	h, _ := feedHarness(t, feed.Config{Heartbeat: 20 * time.Millisecond})
	st := subscribeFrom0(t, h, "quiet", 10*time.Second)
	if got := recvUntil(t, st, lenIs(2)); strings.Join(got, " ") != "♥ ♥" {
		t.Fatalf("got %v, want two heartbeats", got)
	}
}

// A node without a feed answers unimplemented (after validation).
func TestSubscribeWithoutFeed(t *testing.T) {
	h := newHarness(t)
	st, err := sequencerv1connectClient(t, h).Subscribe(context.Background(), connect.NewRequest(&sequencerv1.SubscribeRequest{Cursors: cursors("a", 0)}))
	if err == nil {
		st.Receive()
		err = st.Err()
	}
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("err %v, want unimplemented", err)
	}
}

func newClientOn(hc *http.Client, url string, opts ...connect.ClientOption) sequencerv1connectSubscriber {
	return sequencerv1connect.NewSequencerServiceClient(hc, url, opts...)
}

type sequencerv1connectSubscriber interface {
	Subscribe(context.Context, *connect.Request[sequencerv1.SubscribeRequest]) (*connect.ServerStreamForClient[sequencerv1.SubscribeResponse], error)
}

// Encode once: 60 streams on one conversation (gRPC, Connect and gRPC-Web
// in binary, and Connect JSON) receive each live message, which was
// encoded once per encoding (2), not once per stream; what they receive is
// the message as stored. The backlog (read per stream) is not shared.
func TestSubscribeEncodesLiveMessagesOnce(t *testing.T) {
	h, hub := feedHarness(t, feed.Config{})
	h.write(hub, "hot", 0, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var streams []*connect.ServerStreamForClient[sequencerv1.SubscribeResponse]
	kinds := [][]connect.ClientOption{nil, {connect.WithGRPC()}, {connect.WithGRPCWeb()}, {connect.WithProtoJSON()}}
	for i := 0; i < 60; i++ {
		st, err := sequencerv1connectClient(t, h, kinds[i%len(kinds)]...).Subscribe(ctx, connect.NewRequest(&sequencerv1.SubscribeRequest{Cursors: cursors("hot", 0)}))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		// Seq 1 comes from the backlog: the stream is attached.
		if got := recvUntil(t, st, lenIs(1)); got[0] != "hot:1" {
			t.Fatalf("stream %d: %v", i, got)
		}
		streams = append(streams, st)
	}
	before := feedEncodings.Load()
	h.write(hub, "hot", 0, 2, 3)
	want := convMsgs("hot", 0, 2, 3)
	for i, st := range streams {
		for _, w := range want {
			if !st.Receive() {
				t.Fatalf("stream %d ended: %v", i, st.Err())
			}
			m := st.Msg().GetMessage()
			if m.GetSeq() != w.Seq || m.GetMsgId() != w.MsgID || m.GetClientMsgId() != w.ClientMsgID || string(m.GetBody()) != string(w.Body) || m.GetConvId() != "hot" {
				t.Fatalf("stream %d received %v, want %+v", i, m, w)
			}
		}
	}
	if n := feedEncodings.Load() - before; n != 2*2 {
		t.Fatalf("2 live messages to 60 streams were encoded %d times, want 4 (once per message and encoding: binary, JSON)", n)
	}
}

// flushCounter counts the flushes that reach the transport.
type flushCounter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w flushCounter) Flush() {
	w.n.Add(1)
	w.ResponseWriter.(http.Flusher).Flush()
}

func (w flushCounter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flushed once per turn: a stream's 200 pending messages (a backlog page)
// go out in a few flushes, not one per message (connect flushes after each
// streamed message; Subscribe holds those and the feed flushes per turn).
func TestSubscribeFlushesPerTurnNotPerMessage(t *testing.T) {
	hub := feed.NewHub(feed.Config{}, nil)
	reader := newFakeReader()
	reader.put(200, convMsgs("burst", 0, seqRange(1, 200)...)...)
	svc := NewService(Config{Sender: &fakeSender{}, Reader: reader, Feed: hub})
	handler := NewHTTPHandler(svc, func() error { return nil }, nil)
	var flushes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler.ServeHTTP(flushCounter{w, &flushes}, r)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := newClientOn(http.DefaultClient, srv.URL).Subscribe(ctx, connect.NewRequest(&sequencerv1.SubscribeRequest{Cursors: cursors("burst", 0)}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := recvUntil(t, st, lenIs(200)); got[199] != "burst:200" {
		t.Fatalf("last event %s", got[199])
	}
	if n := flushes.Load(); n < 1 || n > 5 {
		t.Fatalf("200 messages of one backlog page took %d flushes, want a few (one per turn)", n)
	}
	t.Logf("200 messages, %d flushes", flushes.Load())
}

// freshBodies hands out every page's messages with new 128-byte bodies and keeps
// a weak pointer to each, to see whether anything still holds them.
type freshBodies struct {
	Reader
	mu   sync.Mutex
	weak []weak.Pointer[byte]
}

func (f *freshBodies) ReadMany(ctx context.Context, cursors []persist.Cursor, limit, total int) ([]persist.Page, error) {
	pages, err := f.Reader.ReadMany(ctx, cursors, limit, total)
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range pages {
		ms := slices.Clone(pages[i].Messages)
		for j := range ms {
			ms[j].Body = bytes.Repeat([]byte{'b'}, 128) // a body of its own
			f.weak = append(f.weak, weak.Make(&ms[j].Body[0]))
		}
		pages[i].Messages = ms
	}
	return pages, err
}

// A stream keeps no message it has sent: one that goes quiet after the
// message of its backlog read holds neither its body nor the memory of
// the read it came from (issue 33: each of 10,000 streams held the 64 KiB
// block of its one backlog message, 625 MB on the node).
func TestSubscribeKeepsNoSentMessage(t *testing.T) {
	hub := feed.NewHub(feed.Config{}, nil)
	var fresh *freshBodies
	h := newHarness(t, func(c *Config) {
		c.Feed = hub
		fresh = &freshBodies{Reader: c.Reader}
		c.Reader = fresh
	})
	h.write(hub, "a", 0, 1)
	st := subscribeFrom0(t, h, "a", 10*time.Second)
	if got := recvUntil(t, st, lenIs(1)); got[0] != "a:1" {
		t.Fatalf("got %v, want a:1", got)
	}
	fresh.mu.Lock()
	ws := slices.Clone(fresh.weak)
	fresh.mu.Unlock()
	if len(ws) != 1 {
		t.Fatalf("%d backlog bodies read, want 1", len(ws))
	}
	// The stream is open and idle; its handler is parked on its next event.
	deadline := time.Now().Add(5 * time.Second)
	for ws[0].Value() != nil {
		if time.Now().After(deadline) {
			t.Fatal("an open stream still holds the body of the backlog message it sent")
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}

// One connection for a gateway's streams: 600 Subscribe streams of one
// HTTP/2 client (more than net/http's default of 250 per connection) all
// open on one connection, so a commit's deliveries to many of them can
// share its writes (MaxConcurrentStreams).
func TestSubscribeStreamsShareOneConnection(t *testing.T) {
	h, hub := feedHarness(t, feed.Config{})
	const n = 600
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true) // as the Go SDK's transport: h2c only
	tr := &http.Transport{Protocols: &p}
	defer tr.CloseIdleConnections()
	c := newClientOn(&http.Client{Transport: tr}, h.url, connect.WithGRPC())
	streams := make([]*connect.ServerStreamForClient[sequencerv1.SubscribeResponse], n)
	for i := range streams {
		st, err := c.Subscribe(ctx, connect.NewRequest(&sequencerv1.SubscribeRequest{Cursors: cursors("c"+itoa(uint64(i)), 0)}))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		streams[i] = st
	}
	// Every stream is open at once: each gets the live message written
	// after all of them were opened.
	for i := range streams {
		h.write(hub, "c"+itoa(uint64(i)), uint64(i)*10, 1) // distinct msg_ids
	}
	for i, st := range streams {
		if got := recvUntil(t, st, lenIs(1)); got[0] != "c"+itoa(uint64(i))+":1" {
			t.Fatalf("stream %d: %v", i, got)
		}
	}
	if got := h.conns.Load(); got != 1 {
		t.Fatalf("%d streams of one client took %d connections, want 1 (MaxConcurrentStreams %d)", n, got, MaxConcurrentStreams)
	}
}
