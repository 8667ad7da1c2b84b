package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/metrics"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// harness is one API server on 127.0.0.1:0 built exactly as cmd/ builds it:
// NewService -> NewHTTPHandler -> NewServer.
type harness struct {
	url     string
	sender  *fakeSender
	reader  *fakeReader
	reads   *fakePositions
	metrics *metrics.Set

	logs *syncBuffer // what the Service logged

	conns atomic.Int64 // connections the server accepted

	mu     sync.Mutex
	notRdy error
	protos []string // r.Proto of every request that reached the server
}

type harnessOpt func(*Config)

func newHarness(t *testing.T, opts ...harnessOpt) *harness {
	t.Helper()
	h := &harness{sender: &fakeSender{}, reader: newFakeReader(), metrics: metrics.New(), logs: &syncBuffer{}}
	h.reads = &fakePositions{store: h.reader.store}
	cfg := Config{
		Sender:    h.sender,
		Reader:    h.reader,
		Positions: h.reads,
		Metrics:   h.metrics,
		Logger:    slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Router: RouterFunc(func(_ context.Context, convID string) (sequencer.Route, error) {
			if convID == "moving" {
				return sequencer.Route{}, sequencer.ErrOwnershipMoving
			}
			return sequencer.Route{NodeID: "n2", Address: "127.0.0.1:7071", Partition: 17, Epoch: 9007199254740993, MembershipVersion: 4}, nil
		}),
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.Metrics == nil {
		h.metrics = nil
	}
	svc := NewService(cfg)
	reg := h.metricsRegistry()
	handler := NewHTTPHandler(svc, h.ready, reg)
	recording := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.protos = append(h.protos, r.Proto)
		h.mu.Unlock()
		handler.ServeHTTP(w, r)
	})
	ts := httptest.NewUnstartedServer(recording)
	ts.Config = NewServer("127.0.0.1:0", recording)
	ts.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			h.conns.Add(1)
		}
	}
	ts.Start()
	t.Cleanup(ts.Close)
	h.url = ts.URL
	return h
}

func (h *harness) metricsRegistry() *prometheus.Registry {
	if h.metrics == nil {
		return nil
	}
	return h.metrics.Registry
}

func (h *harness) ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.notRdy
}

func (h *harness) setNotReady(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notRdy = err
}

func (h *harness) lastProto() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.protos) == 0 {
		return ""
	}
	return h.protos[len(h.protos)-1]
}

// post sends a Connect JSON request over HTTP/1.1, exactly like curl.
func (h *harness) post(t *testing.T, procedure, body string) (int, map[string]any, string) {
	t.Helper()
	resp, err := http.Post(h.url+procedure, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("%s: response is not JSON (%d): %q", procedure, resp.StatusCode, raw)
	}
	return resp.StatusCode, m, string(raw)
}

func (h *harness) client(opts ...connect.ClientOption) sequencerv1connect.SequencerServiceClient {
	return sequencerv1connect.NewSequencerServiceClient(http.DefaultClient, h.url, opts...)
}

var serverAt = time.Date(2026, 11, 30, 8, 0, 0, 123_000_000, time.UTC)

func answer(msgID, seq uint64, dup bool) func(sequencer.SendRequest) (sequencer.SendResult, error) {
	return func(sequencer.SendRequest) (sequencer.SendResult, error) {
		return sequencer.SendResult{MsgID: msgID, Seq: seq, ServerAt: serverAt, Duplicate: dup}, nil
	}
}

func fail(err error) func(sequencer.SendRequest) (sequencer.SendResult, error) {
	return func(sequencer.SendRequest) (sequencer.SendResult, error) { return sequencer.SendResult{}, err }
}

const sendPath = sequencerv1connect.SequencerServiceSendProcedure

// A Send as curl posts it (docs/API.md, "A session with curl"), byte for byte.
func TestSendJSONLikeCurl(t *testing.T) {
	h := newHarness(t)
	h.sender.set(answer(7401283746512896, 1, false))
	status, m, raw := h.post(t, sendPath, `{"convId":"g:42","fromUid":"1001","clientMsgId":"5f0c...","body":"aGk="}`)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, raw)
	}
	want := map[string]any{"msgId": "7401283746512896", "seq": "1", "serverAt": "2026-11-30T08:00:00.123Z"}
	if len(m) != len(want) {
		t.Fatalf("response %s, want exactly %v", raw, want)
	}
	for k, v := range want {
		if m[k] != v {
			t.Fatalf("%s = %#v (%T), want the string %q; response %s", k, m[k], m[k], v, raw)
		}
	}
	calls := h.sender.Calls()
	if len(calls) != 1 {
		t.Fatalf("sender called %d times, want 1", len(calls))
	}
	got := calls[0]
	if got.ConvID != "g:42" || got.FromUID != 1001 || got.ClientMsgID != "5f0c..." || got.MsgType != 1 || string(got.Body) != "hi" {
		t.Fatalf("sender got %+v", got)
	}

	// A resend: duplicate true, same ids.
	h.sender.set(answer(7401283746512896, 1, true))
	status, m, raw = h.post(t, sendPath, `{"convId":"g:42","fromUid":1001,"clientMsgId":"5f0c...","body":"aGk="}`)
	if status != http.StatusOK || m["duplicate"] != true || m["msgId"] != "7401283746512896" || m["seq"] != "1" {
		t.Fatalf("resend: %d %s", status, raw)
	}
}

// Ids above 2^53 (where float64 JSON numbers lose precision) come back exact.
func TestIDsAbove2p53SurviveJSON(t *testing.T) {
	h := newHarness(t)
	const big = uint64(1)<<53 + 1 // 9007199254740993: not representable as float64
	const biggest = uint64(1)<<63 - 1
	h.sender.set(answer(big, biggest, false))
	status, m, raw := h.post(t, sendPath, `{"convId":"c","fromUid":"9223372036854775807","clientMsgId":"k"}`)
	if status != 200 || m["msgId"] != "9007199254740993" || m["seq"] != "9223372036854775807" {
		t.Fatalf("send: %d %s", status, raw)
	}
	if got := h.sender.Calls()[0].FromUID; got != biggest {
		t.Fatalf("from_uid reached the sender as %d, want %d", got, biggest)
	}

	h.reader.put(1, sequencer.Message{MsgID: big, ConvID: "c", Seq: 1, FromUID: biggest, MsgType: 7, Body: []byte{0, 1, 2}, ClientMsgID: "k", ServerAt: serverAt})
	status, m, raw = h.post(t, sequencerv1connect.SequencerServiceGetMessageProcedure, `{"msgId":"9007199254740993"}`)
	if status != 200 {
		t.Fatalf("get: %d %s", status, raw)
	}
	msg := m["message"].(map[string]any)
	want := map[string]any{"msgId": "9007199254740993", "convId": "c", "seq": "1", "fromUid": "9223372036854775807",
		"msgType": json.Number("7"), "body": base64.StdEncoding.EncodeToString([]byte{0, 1, 2}), "clientMsgId": "k", "serverAt": "2026-11-30T08:00:00.123Z"}
	for k, v := range want {
		if msg[k] != v {
			t.Fatalf("message.%s = %#v, want %#v; response %s", k, msg[k], v, raw)
		}
	}

	// The Connect Go client in JSON mode agrees.
	resp, err := h.client(connect.WithProtoJSON()).GetMessage(context.Background(), connect.NewRequest(&sequencerv1.GetMessageRequest{MsgId: big}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.GetMessage().GetMsgId() != big {
		t.Fatalf("msg_id %d, want %d", resp.Msg.GetMessage().GetMsgId(), big)
	}
}

// Every validation rule, through HTTP: 400, code invalid_argument, and the
// Sender / Reader is never reached.
func TestValidationOverHTTP(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxBody = 16 })
	h.sender.set(answer(1, 1, false))
	b64 := func(n int) string { return base64.StdEncoding.EncodeToString(make([]byte, n)) }
	long := strings.Repeat("x", 65)
	tests := []struct {
		name, procedure, body, wantMsg string
	}{
		{"send conv_id missing", sendPath, `{"fromUid":"1","clientMsgId":"k"}`, "conv_id: must be 1..64 bytes, got 0"},
		{"send conv_id 65 bytes", sendPath, `{"convId":"` + long + `","fromUid":"1","clientMsgId":"k"}`, "conv_id: must be 1..64 bytes, got 65"},
		{"send conv_id control", sendPath, `{"convId":"a\u0001","fromUid":"1","clientMsgId":"k"}`, "conv_id: must not contain control characters"},
		{"send conv_id DEL", sendPath, `{"convId":"a\u007f","fromUid":"1","clientMsgId":"k"}`, "conv_id: must not contain control characters"},
		{"send conv_id C1", sendPath, `{"convId":"a\u0085","fromUid":"1","clientMsgId":"k"}`, "conv_id: must not contain control characters"},
		{"send conv_id invalid UTF-8", sendPath, "{\"convId\":\"a\xff\",\"fromUid\":\"1\",\"clientMsgId\":\"k\"}", ""},
		{"send from_uid missing", sendPath, `{"convId":"c","clientMsgId":"k"}`, "from_uid: must be > 0 and < 2^63, got 0"},
		{"send from_uid 2^63", sendPath, `{"convId":"c","fromUid":"9223372036854775808","clientMsgId":"k"}`, "from_uid: must be > 0 and < 2^63"},
		{"send from_uid negative", sendPath, `{"convId":"c","fromUid":"-1","clientMsgId":"k"}`, ""},
		{"send client_msg_id empty", sendPath, `{"convId":"c","fromUid":"1","clientMsgId":""}`, "client_msg_id: must be 1..64 bytes, got 0"},
		{"send client_msg_id missing", sendPath, `{"convId":"c","fromUid":"1"}`, "client_msg_id: must be 1..64 bytes, got 0"},
		{"send client_msg_id 65", sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"` + long + `"}`, "client_msg_id: must be 1..64 bytes, got 65"},
		{"send client_msg_id control", sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"a\nb"}`, "client_msg_id: must not contain control characters"},
		{"send msg_type 32768", sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"k","msgType":32768}`, "msg_type: must be 0 (default 1) or 1..32767, got 32768"},
		{"send msg_type -1", sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"k","msgType":-1}`, "msg_type: must be 0 (default 1) or 1..32767, got -1"},
		{"send body over max", sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"k","body":"` + b64(17) + `"}`, "body: must be at most 16 bytes, got 17"},
		{"pull conv_id missing", sequencerv1connect.SequencerServicePullProcedure, `{"afterSeq":"0"}`, "conv_id: must be 1..64 bytes, got 0"},
		{"pull conv_id control", sequencerv1connect.SequencerServicePullProcedure, `{"convId":"\u0000"}`, "conv_id: must not contain control characters"},
		{"get_head conv_id 65", sequencerv1connect.SequencerServiceGetHeadProcedure, `{"convId":"` + long + `"}`, "conv_id: must be 1..64 bytes, got 65"},
		{"route conv_id missing", sequencerv1connect.SequencerServiceRouteProcedure, `{}`, "conv_id: must be 1..64 bytes, got 0"},
		{"get_message msg_id 0", sequencerv1connect.SequencerServiceGetMessageProcedure, `{}`, "msg_id: must be > 0 and < 2^63, got 0"},
		{"get_message msg_id 2^63", sequencerv1connect.SequencerServiceGetMessageProcedure, `{"msgId":"9223372036854775808"}`, "msg_id: must be > 0 and < 2^63"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, m, raw := h.post(t, tt.procedure, tt.body)
			if status != http.StatusBadRequest || m["code"] != "invalid_argument" {
				t.Fatalf("got %d %s, want 400 invalid_argument", status, raw)
			}
			if msg, _ := m["message"].(string); !strings.Contains(msg, tt.wantMsg) {
				t.Fatalf("message %q does not contain %q", msg, tt.wantMsg)
			}
		})
	}
	if n := len(h.sender.Calls()); n != 0 {
		t.Fatalf("sender was called %d times by invalid requests", n)
	}
	if loads, ranges, gets := h.reader.calls(); loads+ranges+gets != 0 {
		t.Fatalf("reader was called by invalid requests: loads %d ranges %d gets %d", loads, ranges, gets)
	}
	if got := counterValue(t, h.metrics.Sends.WithLabelValues("invalid_argument")); got != 14 {
		// 16 Send cases, 2 rejected by the JSON decoder before the handler.
		t.Fatalf("sends{invalid_argument} = %v, want 14", got)
	}
	// The boundary passes: a body of exactly MaxBody.
	status, _, raw := h.post(t, sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"k","body":"`+b64(16)+`"}`)
	if status != 200 {
		t.Fatalf("body at the limit: %d %s", status, raw)
	}
}

// Domain errors reach the client with the contract's HTTP status and code.
func TestErrorStatusOverHTTP(t *testing.T) {
	h := newHarness(t)
	const body = `{"convId":"g:1","fromUid":"5","clientMsgId":"k"}`
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantCode   string
		wantMsg    string
	}{
		{"already exists", fmt.Errorf("send: %w", sequencer.ErrAlreadyExists), 409, "already_exists", "send: client_msg_id was already used for different content (another conversation, msg_type or body)"},
		{"store unavailable", sequencer.Wrap(sequencer.CodeUnavailable, errors.New("dial tcp 10.0.0.1:5432"), "store unavailable"), 503, "unavailable", "store unavailable"},
		{"ownership moving", sequencer.ErrOwnershipMoving, 503, "unavailable", "conversation ownership is moving"},
		{"clock moved back", sequencer.ErrClockMovedBackwards, 503, "unavailable", "clock moved backwards"},
		{"overloaded", sequencer.ErrOverloaded, 429, "resource_exhausted", "overloaded"},
		{"internal", errors.New("pq: relation im_message does not exist"), 500, "internal", "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h.sender.set(fail(tt.err))
			status, m, raw := h.post(t, sendPath, body)
			if status != tt.wantStatus || m["code"] != tt.wantCode || m["message"] != tt.wantMsg {
				t.Fatalf("got %d %s, want %d %s %q", status, raw, tt.wantStatus, tt.wantCode, tt.wantMsg)
			}
		})
	}

	logs := h.logs.String()
	if !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, "pq: relation im_message does not exist") {
		t.Fatalf("the internal error was not logged with its cause:\n%s", logs)
	}
	if !strings.Contains(logs, "level=DEBUG") || !strings.Contains(logs, "dial tcp 10.0.0.1:5432") {
		t.Fatalf("the retryable error was not logged at debug with its cause:\n%s", logs)
	}

	status, m, raw := h.post(t, sequencerv1connect.SequencerServiceGetMessageProcedure, `{"msgId":"42"}`)
	if status != 404 || m["code"] != "not_found" || m["message"] != "msg_id 42: not found" {
		t.Fatalf("get unknown msg_id: %d %s", status, raw)
	}
	status, m, raw = h.post(t, sequencerv1connect.SequencerServiceRouteProcedure, `{"convId":"moving"}`)
	if status != 503 || m["code"] != "unavailable" {
		t.Fatalf("route while moving: %d %s", status, raw)
	}
	h.reader.setErr(fmt.Errorf("read: %w", sequencer.ErrStoreUnavailable))
	for _, p := range []string{sequencerv1connect.SequencerServicePullProcedure, sequencerv1connect.SequencerServiceGetHeadProcedure} {
		status, m, raw = h.post(t, p, `{"convId":"c"}`)
		if status != 503 || m["code"] != "unavailable" || m["message"] != "store unavailable" {
			t.Fatalf("%s with the store down: %d %s", p, status, raw)
		}
	}
}

func msgs(convID string, seqs ...uint64) []sequencer.Message {
	out := make([]sequencer.Message, len(seqs))
	for i, s := range seqs {
		out[i] = sequencer.Message{MsgID: 1000 + s, ConvID: convID, Seq: s, FromUID: 1, MsgType: 1, ClientMsgID: fmt.Sprint("k", s), ServerAt: serverAt}
	}
	return out
}

func TestPull(t *testing.T) {
	tests := []struct {
		name      string
		head      uint64
		stored    []uint64 // seqs still stored (retention may have trimmed a prefix)
		afterSeq  uint64
		limit     uint32
		wantSeqs  []uint64
		wantHead  uint64
		wantMore  bool
		wantLimit int // limit the Reader saw; 0 = ReadRange not called
	}{
		{name: "first page", head: 5, stored: []uint64{1, 2, 3, 4, 5}, limit: 2, wantSeqs: []uint64{1, 2}, wantHead: 5, wantMore: true, wantLimit: 2},
		{name: "middle page", head: 5, stored: []uint64{1, 2, 3, 4, 5}, afterSeq: 2, limit: 2, wantSeqs: []uint64{3, 4}, wantHead: 5, wantMore: true, wantLimit: 2},
		{name: "full page ending at head", head: 5, stored: []uint64{1, 2, 3, 4, 5}, afterSeq: 3, limit: 2, wantSeqs: []uint64{4, 5}, wantHead: 5, wantMore: false, wantLimit: 2},
		{name: "short last page", head: 5, stored: []uint64{1, 2, 3, 4, 5}, afterSeq: 4, limit: 2, wantSeqs: []uint64{5}, wantHead: 5, wantMore: false, wantLimit: 2},
		{name: "at head reads nothing", head: 5, stored: []uint64{1, 2, 3, 4, 5}, afterSeq: 5, wantHead: 5},
		{name: "past head reads nothing", head: 5, stored: []uint64{1, 2, 3, 4, 5}, afterSeq: 9, wantHead: 5},
		{name: "after_seq max uint64", head: 5, stored: []uint64{1, 2, 3, 4, 5}, afterSeq: ^uint64(0), wantHead: 5},
		{name: "empty conversation", wantHead: 0},
		{name: "limit 0 means 100", head: 5, stored: []uint64{1, 2, 3, 4, 5}, wantSeqs: []uint64{1, 2, 3, 4, 5}, wantHead: 5, wantLimit: 100},
		// Clamped to 1000, read in chunks of at most pullChunk rows.
		{name: "limit above 1000 clamped", head: 5, stored: []uint64{1, 2, 3, 4, 5}, limit: 5000, wantSeqs: []uint64{1, 2, 3, 4, 5}, wantHead: 5, wantLimit: pullChunk},
		// Retention trimmed 1..3: the client sees the gap (first seq 4) and
		// still pages honestly.
		{name: "trimmed prefix", head: 6, stored: []uint64{4, 5, 6}, limit: 2, wantSeqs: []uint64{4, 5}, wantHead: 6, wantMore: true, wantLimit: 2},
		{name: "trimmed prefix last page", head: 6, stored: []uint64{4, 5, 6}, afterSeq: 5, limit: 2, wantSeqs: []uint64{6}, wantHead: 6, wantLimit: 2},
		// Retention trimmed everything: nothing to return, no promise of more.
		{name: "all trimmed", head: 6, limit: 2, wantHead: 6, wantMore: false, wantLimit: 2},
		// A commit landed between LoadHead (5) and ReadRange: head_seq is raised
		// so no returned seq exceeds it.
		{name: "commit between head and read", head: 5, stored: []uint64{1, 2, 3, 4, 5, 6}, afterSeq: 4, limit: 10, wantSeqs: []uint64{5, 6}, wantHead: 6, wantLimit: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.reader.put(tt.head, msgs("c", tt.stored...)...)
			h.reader.setHead("c", tt.head)
			resp, err := h.client().Pull(context.Background(), connect.NewRequest(&sequencerv1.PullRequest{ConvId: "c", AfterSeq: tt.afterSeq, Limit: tt.limit}))
			if err != nil {
				t.Fatal(err)
			}
			var seqs []uint64
			for _, m := range resp.Msg.GetMessages() {
				seqs = append(seqs, m.GetSeq())
				if m.GetConvId() != "c" || m.GetMsgId() != 1000+m.GetSeq() || m.GetClientMsgId() != fmt.Sprint("k", m.GetSeq()) || !m.GetServerAt().AsTime().Equal(serverAt) {
					t.Fatalf("message fields lost: %v", m)
				}
			}
			if fmt.Sprint(seqs) != fmt.Sprint(tt.wantSeqs) || resp.Msg.GetHeadSeq() != tt.wantHead || resp.Msg.GetHasMore() != tt.wantMore {
				t.Fatalf("got seqs %v head %d has_more %v, want %v %d %v", seqs, resp.Msg.GetHeadSeq(), resp.Msg.GetHasMore(), tt.wantSeqs, tt.wantHead, tt.wantMore)
			}
			rc, called := h.reader.lastRange()
			if tt.wantLimit == 0 && called {
				t.Fatalf("ReadRange called (%+v), want no read", rc)
			}
			if tt.wantLimit != 0 && (!called || rc.Limit != tt.wantLimit || rc.AfterSeq != tt.afterSeq) {
				t.Fatalf("ReadRange %+v (called %v), want after %d limit %d", rc, called, tt.afterSeq, tt.wantLimit)
			}
		})
	}
}

// Pull's max_bytes: a page stops before the message that would pass it, but
// always holds at least one message, and says has_more.
func TestPullMaxBytes(t *testing.T) {
	h := newHarness(t)
	var rows []sequencer.Message
	for i := uint64(1); i <= 300; i++ {
		m := msgs("c", i)[0]
		m.Body = make([]byte, 1000)
		rows = append(rows, m)
	}
	h.reader.put(300, rows...)
	per := messageSize(&rows[0])
	pull := func(after uint64, limit, maxBytes uint32) *sequencerv1.PullResponse {
		t.Helper()
		resp, err := h.client().Pull(context.Background(), connect.NewRequest(&sequencerv1.PullRequest{ConvId: "c", AfterSeq: after, Limit: limit, MaxBytes: maxBytes}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg
	}
	// Room for 2.5 messages: 2 returned.
	if r := pull(0, 100, uint32(per*5/2)); len(r.Messages) != 2 || !r.HasMore || r.Messages[1].Seq != 2 {
		t.Fatalf("2.5 messages of room: got %d messages, has_more %v", len(r.Messages), r.HasMore)
	}
	// Less than one message of room: still one.
	if r := pull(5, 100, 1); len(r.Messages) != 1 || !r.HasMore || r.Messages[0].Seq != 6 {
		t.Fatalf("1 byte of room: got %d messages, has_more %v", len(r.Messages), r.HasMore)
	}
	// Room for everything the limit allows: the limit decides, across chunks.
	if r := pull(0, 1000, 4<<20); len(r.Messages) != 300 || r.HasMore {
		t.Fatalf("whole conversation: got %d messages, has_more %v", len(r.Messages), r.HasMore)
	}
	// The default max_bytes (1 MiB) holds all 300 (about 320 KB).
	if r := pull(0, 1000, 0); len(r.Messages) != 300 {
		t.Fatalf("default max_bytes: %d messages", len(r.Messages))
	}
}

// Pull's JSON shape: 64-bit numbers as strings, bytes as base64.
func TestPullJSON(t *testing.T) {
	h := newHarness(t)
	rows := msgs("g:42", 1, 2)
	rows[0].Body = []byte("hi")
	h.reader.put(2, rows...)
	status, m, raw := h.post(t, sequencerv1connect.SequencerServicePullProcedure, `{"convId":"g:42","limit":1}`)
	if status != 200 || m["headSeq"] != "2" || m["hasMore"] != true {
		t.Fatalf("pull: %d %s", status, raw)
	}
	list := m["messages"].([]any)
	first := list[0].(map[string]any)
	if len(list) != 1 || first["seq"] != "1" || first["msgId"] != "1001" || first["body"] != "aGk=" || first["serverAt"] != "2026-11-30T08:00:00.123Z" {
		t.Fatalf("pull: %s", raw)
	}
	status, m, raw = h.post(t, sequencerv1connect.SequencerServiceGetHeadProcedure, `{"convId":"g:42"}`)
	if status != 200 || m["headSeq"] != "2" {
		t.Fatalf("get head: %d %s", status, raw)
	}
	status, m, raw = h.post(t, sequencerv1connect.SequencerServiceGetHeadProcedure, `{"convId":"never"}`)
	if status != 200 || len(m) != 0 { // head 0 is the proto3 default: omitted
		t.Fatalf("get head of an empty conversation: %d %s", status, raw)
	}
}

func TestRoute(t *testing.T) {
	h := newHarness(t)
	status, m, raw := h.post(t, sequencerv1connect.SequencerServiceRouteProcedure, `{"convId":"g:42"}`)
	want := map[string]any{"nodeId": "n2", "address": "127.0.0.1:7071", "partition": json.Number("17"), "epoch": "9007199254740993", "membershipVersion": "4"}
	if status != 200 || len(m) != len(want) {
		t.Fatalf("route: %d %s", status, raw)
	}
	for k, v := range want {
		if m[k] != v {
			t.Fatalf("route.%s = %#v, want %#v; %s", k, m[k], v, raw)
		}
	}

	noRouter := newHarness(t, func(c *Config) { c.Router = nil })
	status, m, raw = noRouter.post(t, sequencerv1connect.SequencerServiceRouteProcedure, `{"convId":"g:42"}`)
	if status != http.StatusNotImplemented || m["code"] != "unimplemented" {
		t.Fatalf("route without a router: %d %s", status, raw)
	}
}

// viewRouter is a Router with a membership version (as cluster.Node).
type viewRouter struct {
	RouterFunc
	version uint64
}

func (v viewRouter) MembershipVersion() uint64 { return v.version }

// TestSendAnswersCarryTheMembershipVersion: with a Router that knows its
// membership version (cluster mode), every Send and SendBatch answer names
// it in the header Sequencer-Membership-Version (gRPC, Connect, and the
// direct JSON path); a single node's Router has none and sends no header.
func TestSendAnswersCarryTheMembershipVersion(t *testing.T) {
	route := RouterFunc(func(context.Context, string) (sequencer.Route, error) { return sequencer.Route{}, nil })
	h := newHarness(t, func(c *Config) { c.Router = viewRouter{route, 17} })
	h.sender.set(answer(5, 1, false))
	req := &sequencerv1.SendRequest{ConvId: "g:1", FromUid: 9, ClientMsgId: "k", Body: []byte("x")}
	for _, opts := range [][]connect.ClientOption{{connect.WithGRPC()}, nil} {
		c := h.client(opts...)
		resp, err := c.Send(context.Background(), connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		if v := resp.Header().Get(HeaderMembershipVersion); v != "17" {
			t.Fatalf("Send answer's %s = %q, want 17", HeaderMembershipVersion, v)
		}
		bresp, err := c.SendBatch(context.Background(), connect.NewRequest(&sequencerv1.SendBatchRequest{Items: []*sequencerv1.SendRequest{req}}))
		if err != nil {
			t.Fatal(err)
		}
		if v := bresp.Header().Get(HeaderMembershipVersion); v != "17" {
			t.Fatalf("SendBatch answer's %s = %q, want 17", HeaderMembershipVersion, v)
		}
	}
	hr, err := http.Post(h.url+sequencerv1connect.SequencerServiceSendProcedure, "application/json",
		strings.NewReader(`{"convId":"g:1","fromUid":"9","clientMsgId":"k","body":"eA=="}`))
	if err != nil {
		t.Fatal(err)
	}
	hr.Body.Close()
	if v := hr.Header.Get(HeaderMembershipVersion); hr.StatusCode != 200 || v != "17" {
		t.Fatalf("JSON Send: status %d, %s = %q, want 200 and 17", hr.StatusCode, HeaderMembershipVersion, v)
	}

	single := newHarness(t, func(c *Config) { c.Router = route })
	single.sender.set(answer(5, 1, false))
	resp, err := single.client().Send(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := resp.Header()[HeaderMembershipVersion]; ok {
		t.Fatalf("a single node's Send answer has %s %q", HeaderMembershipVersion, v)
	}
}

// gRPC over HTTP/2 cleartext (prior knowledge), as grpc-go clients speak it.
func TestGRPCOverH2C(t *testing.T) {
	h := newHarness(t)
	h.sender.set(answer(1<<53+1, 3, false))
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protocols}
	t.Cleanup(tr.CloseIdleConnections)
	c := sequencerv1connect.NewSequencerServiceClient(&http.Client{Transport: tr}, h.url, connect.WithGRPC())

	resp, err := c.Send(context.Background(), connect.NewRequest(&sequencerv1.SendRequest{ConvId: "g:1", FromUid: 9, ClientMsgId: "k", Body: []byte("x")}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.GetMsgId() != 1<<53+1 || resp.Msg.GetSeq() != 3 || !resp.Msg.GetServerAt().AsTime().Equal(serverAt) {
		t.Fatalf("send: %v", resp.Msg)
	}
	if p := h.lastProto(); p != "HTTP/2.0" {
		t.Fatalf("server saw %s, want HTTP/2.0", p)
	}

	_, err = c.Send(context.Background(), connect.NewRequest(&sequencerv1.SendRequest{ConvId: "g:1", FromUid: 9}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "client_msg_id: must be 1..64 bytes, got 0") {
		t.Fatalf("invalid send over gRPC: %v", err)
	}
	h.sender.set(fail(sequencer.ErrOverloaded))
	_, err = c.Send(context.Background(), connect.NewRequest(&sequencerv1.SendRequest{ConvId: "g:1", FromUid: 9, ClientMsgId: "k2"}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("overloaded send over gRPC: %v", err)
	}
	if n := len(h.sender.Calls()); n != 2 {
		t.Fatalf("sender called %d times, want 2 (the invalid send must not reach it)", n)
	}
}

// gRPC-Web and Connect binary over plain HTTP/1.1 on the same port.
func TestGRPCWebAndConnectBinary(t *testing.T) {
	h := newHarness(t)
	h.sender.set(answer(11, 1, false))
	for name, opts := range map[string][]connect.ClientOption{"grpc-web": {connect.WithGRPCWeb()}, "connect-proto": nil} {
		t.Run(name, func(t *testing.T) {
			resp, err := h.client(opts...).Send(context.Background(), connect.NewRequest(&sequencerv1.SendRequest{ConvId: "g:1", FromUid: 9, ClientMsgId: "k"}))
			if err != nil {
				t.Fatal(err)
			}
			if resp.Msg.GetMsgId() != 11 || resp.Msg.GetSeq() != 1 {
				t.Fatalf("send: %v", resp.Msg)
			}
			if p := h.lastProto(); p != "HTTP/1.1" {
				t.Fatalf("server saw %s, want HTTP/1.1", p)
			}
		})
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	h := newHarness(t)
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(h.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	// The store's address, user and database stay in the server's log.
	h.setNotReady(fmt.Errorf("%w: failed to connect to `user=alice database=prod`: db.internal:5432", sequencer.ErrStoreUnavailable))
	if code, body := get("/readyz"); code != 503 || body != "not ready: store unavailable\n" {
		t.Fatalf("/readyz store down: %d %q", code, body)
	}
	if !strings.Contains(h.logs.String(), "db.internal") {
		t.Fatalf("the detail of not ready was not logged: %q", h.logs.String())
	}
	h.setNotReady(errors.New("cluster: membership not renewed (last error: dial db.internal)"))
	if code, body := get("/readyz"); code != 503 || body != "not ready: not ready\n" {
		t.Fatalf("/readyz with an uncoded error: %d %q", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz while not ready: %d", code)
	}
	h.setNotReady(nil)
	if code, body := get("/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("/readyz ready: %d %q", code, body)
	}

	h.sender.set(answer(1, 1, false))
	h.post(t, sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"a"}`)
	h.sender.set(answer(1, 1, true))
	h.post(t, sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"a"}`)
	h.sender.set(fail(sequencer.ErrStoreUnavailable))
	h.post(t, sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"b"}`)
	h.post(t, sendPath, `{"convId":"c","fromUid":"1","clientMsgId":""}`)
	h.post(t, sequencerv1connect.SequencerServiceGetHeadProcedure, `{"convId":"c"}`)

	m := h.metrics
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"requests{Send,ok}", counterValue(t, m.Requests.WithLabelValues("Send", "ok")), 2},
		{"requests{Send,unavailable}", counterValue(t, m.Requests.WithLabelValues("Send", "unavailable")), 1},
		{"requests{Send,invalid_argument}", counterValue(t, m.Requests.WithLabelValues("Send", "invalid_argument")), 1},
		{"requests{GetHead,ok}", counterValue(t, m.Requests.WithLabelValues("GetHead", "ok")), 1},
		{"sends{ok}", counterValue(t, m.Sends.WithLabelValues("ok")), 1},
		{"sends{duplicate}", counterValue(t, m.Sends.WithLabelValues("duplicate")), 1},
		{"sends{unavailable}", counterValue(t, m.Sends.WithLabelValues("unavailable")), 1},
		{"sends{invalid_argument}", counterValue(t, m.Sends.WithLabelValues("invalid_argument")), 1},
		{"dedup_hits", counterValue(t, m.DedupHits), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}

	code, body := get("/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`sequencer_rpc_requests_total{code="ok",method="Send"} 2`,
		`sequencer_sends_total{code="duplicate"} 1`,
		`sequencer_dedup_hits_total 1`,
		// every Send answered, failures included, by code
		`sequencer_send_seconds_count{code="ok",method="Send"} 1`,
		`sequencer_send_seconds_count{code="duplicate",method="Send"} 1`,
		`sequencer_send_seconds_count{code="unavailable",method="Send"} 1`,
		`sequencer_send_seconds_count{code="invalid_argument",method="Send"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
}

// A Service without metrics works, and /metrics is simply not served.
func TestNilMetrics(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Metrics = nil })
	h.sender.set(answer(1, 1, true))
	if status, _, raw := h.post(t, sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"a"}`); status != 200 {
		t.Fatalf("send: %d %s", status, raw)
	}
	if status, _, _ := h.post(t, sendPath, `{"convId":"c"}`); status != 400 {
		t.Fatalf("invalid send: %d", status)
	}
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("/metrics without a registry: %d, want 404", resp.StatusCode)
	}
}

// A panicking engine answers internal, leaks nothing, and the server lives on.
func TestPanicIsInternal(t *testing.T) {
	h := newHarness(t)
	h.sender.set(func(sequencer.SendRequest) (sequencer.SendResult, error) { panic("engine bug: secret state") })
	status, m, raw := h.post(t, sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"a"}`)
	if status != 500 || m["code"] != "internal" || strings.Contains(raw, "secret") {
		t.Fatalf("panic: %d %s", status, raw)
	}
	if !strings.Contains(h.logs.String(), "engine bug: secret state") {
		t.Fatalf("the panic was not logged:\n%s", h.logs.String())
	}
	if got := counterValue(t, h.metrics.Requests.WithLabelValues("Send", "internal")); got != 1 {
		t.Fatalf("requests{Send,internal} = %v, want 1", got)
	}
	h.sender.set(answer(1, 1, false))
	if status, _, raw := h.post(t, sendPath, `{"convId":"c","fromUid":"1","clientMsgId":"a"}`); status != 200 {
		t.Fatalf("after panic: %d %s", status, raw)
	}
}

// A body over the limit gets the precise validation message
// (invalid_argument, never a retryable code).
func TestOversizedRequest(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxBody = 1024 })
	h.sender.set(answer(1, 1, false))
	body := func(n int) string {
		return `{"convId":"c","fromUid":"1","clientMsgId":"a","body":"` + base64.StdEncoding.EncodeToString(make([]byte, n)) + `"}`
	}
	status, m, raw := h.post(t, sendPath, body(3*1024))
	if status != 400 || m["message"] != "body: must be at most 1024 bytes, got 3072" {
		t.Fatalf("3x body: %d %s", status, raw)
	}
	status, m, raw = h.post(t, sendPath, body(200<<10))
	if status != 400 || m["code"] != "invalid_argument" {
		t.Fatalf("200 KiB body: %d %s", status, raw)
	}
	if n := len(h.sender.Calls()); n != 0 {
		t.Fatalf("sender called %d times", n)
	}
}

// counterValue reads a counter (what prometheus/testutil.ToFloat64 does,
// without its extra module).
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A small SendResponse is not gzipped even when the client accepts gzip: it
// would cost CPU on every send and save nothing.
func TestSmallResponsesAreNotCompressed(t *testing.T) {
	h := newHarness(t)
	h.sender.set(answer(7401283746512896, 1, false))
	req, _ := http.NewRequest(http.MethodPost, h.url+sendPath, strings.NewReader(`{"convId":"g","fromUid":"1","clientMsgId":"k"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" {
		t.Fatalf("a %d-byte class response came back %s-encoded", compressMinBytes, enc)
	}
}

// sequencer_sends_total counts messages: a SendBatch refused as a whole adds
// nothing; each failed or stored item adds one.
func TestSendsTotalCountsBatchItems(t *testing.T) {
	h := newHarness(t)
	h.sender.set(answer(1, 1, false))
	sends := func(code string) float64 {
		var m dto.Metric
		if err := h.metrics.Sends.WithLabelValues(code).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	path := "/sequencer.v1.SequencerService/SendBatch"
	if status, _, raw := h.post(t, path, `{"items":[]}`); status != 400 {
		t.Fatalf("empty batch: %d %s", status, raw)
	}
	if n := sends("invalid_argument"); n != 0 {
		t.Fatalf("a batch refused as a whole counted %v failed sends", n)
	}
	if status, _, raw := h.post(t, path, `{"items":[{"convId":"c","fromUid":"1","clientMsgId":"a"},{"convId":"c","fromUid":"0","clientMsgId":"b"}]}`); status != 200 {
		t.Fatalf("batch: %d %s", status, raw)
	}
	if ok, bad := sends("ok"), sends("invalid_argument"); ok != 1 || bad != 1 {
		t.Fatalf("sends_total ok %v invalid_argument %v, want 1 and 1", ok, bad)
	}
}
