package console

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/metrics"
)

type fakeView struct{}

func (fakeView) Version() uint64 { return 7 }
func (fakeView) Members() []Member {
	return []Member{{NodeID: "n1", APIAddr: "127.0.0.1:1", Self: true, HeartbeatAgeMs: 120}, {NodeID: "n2", APIAddr: "127.0.0.1:2", HeartbeatAgeMs: 900}}
}
func (fakeView) Partitions() []Partition {
	return []Partition{{Owner: "n1", Epoch: 3, RingOwner: "n1"}, {Owner: "", Epoch: 1, RingOwner: "n1"}, {Owner: "n2", Epoch: 1 << 60, RingOwner: "n2"}}
}

type fakeReader struct{ down bool }

func (r fakeReader) LoadHead(ctx context.Context, convID string) (uint64, error) {
	if r.down {
		return 0, errors.New("dial tcp 10.0.0.5:5432: connection refused (user secret)")
	}
	if convID == "g:1" {
		return 30, nil
	}
	return 0, nil
}

func (r fakeReader) ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error) {
	var out []sequencer.Message
	for s := afterSeq + 1; s <= 30 && len(out) < limit; s++ {
		m := sequencer.Message{MsgID: 1<<62 + s, ConvID: convID, Seq: s, FromUID: 9, MsgType: 1,
			Body: []byte("secret body"), ClientMsgID: "k", ServerAt: time.Unix(1700000000, 0).UTC()}
		switch s {
		case 28: // edited twice, then recalled by seq 29
			m.Body, m.EditCount, m.Recalled = nil, 2, true
		case 29:
			m.Body, m.Kind, m.TargetMsgID = nil, sequencer.KindRecall, 1<<62+28
		}
		out = append(out, m)
	}
	return out, nil
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

func TestAPI(t *testing.T) {
	c := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{}, Gatherer: metrics.New().Registry})
	defer c.Close()

	code, body := get(t, c, "/console/api/members")
	if code != 200 || !strings.Contains(body, `"nodeId":"n2"`) || !strings.Contains(body, `"membershipVersion":"7"`) || !strings.Contains(body, `"heartbeatAgeMs":900`) {
		t.Fatalf("members: %d %s", code, body)
	}
	code, body = get(t, c, "/console/api/partitions")
	var parts struct{ Partitions []map[string]string }
	if err := json.Unmarshal([]byte(body), &parts); code != 200 || err != nil || len(parts.Partitions) != 3 {
		t.Fatalf("partitions: %d %s %v", code, body, err)
	}
	if p := parts.Partitions[2]; p["owner"] != "n2" || p["epoch"] != "1152921504606846976" {
		t.Fatalf("partition 2: %v (epochs are strings: no rounding in the browser)", p)
	}

	code, body = get(t, c, "/console/api/conversation?conv_id=g:1&limit=5")
	var conv struct {
		HeadSeq  string
		Messages []map[string]any
	}
	if err := json.Unmarshal([]byte(body), &conv); code != 200 || err != nil {
		t.Fatalf("conversation: %d %s %v", code, body, err)
	}
	if conv.HeadSeq != "30" || len(conv.Messages) != 5 || conv.Messages[0]["seq"] != "30" || conv.Messages[4]["seq"] != "26" {
		t.Fatalf("want head 30 and seqs 30..26 newest first: %s", body)
	}
	if conv.Messages[0]["msgId"] != "4611686018427387934" || conv.Messages[0]["bodyBytes"] != float64(11) {
		t.Fatalf("ids as strings, body size only: %v", conv.Messages[0])
	}
	if conv.Messages[0]["state"] != nil || conv.Messages[1]["state"] != "recall of 4611686018427387932" || conv.Messages[2]["state"] != "edited 2×, recalled" {
		t.Fatalf("edited and recalled messages shown as such: %v", conv.Messages[:3])
	}
	if strings.Contains(body, "secret body") || strings.Contains(body, "c2VjcmV0") {
		t.Fatalf("a body leaked: %s", body)
	}
	if code, body = get(t, c, "/console/api/conversation?conv_id="); code != 400 || !strings.Contains(body, "conv_id") {
		t.Fatalf("empty conv_id: %d %s", code, body)
	}
	if code, _ = get(t, c, "/console/api/conversation?conv_id=x&limit=-1"); code != 400 {
		t.Fatalf("bad limit: %d", code)
	}
	down := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{down: true}})
	defer down.Close()
	if code, body = get(t, down, "/console/api/conversation?conv_id=g:1"); code != 503 || strings.Contains(body, "10.0.0.5") || strings.Contains(body, "secret") {
		t.Fatalf("store down: %d %s (must not reveal the store's address or user)", code, body)
	}

	for _, p := range []string{"/console/", "/console/app.js", "/console/style.css"} {
		if code, body = get(t, c, p); code != 200 || len(body) < 100 {
			t.Fatalf("%s: %d", p, code)
		}
	}
	if code, _ = get(t, c, "/console/api/nothing"); code != 404 {
		t.Fatalf("unknown path: %d", code)
	}
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/console/api/members", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d, want 405 (read-only)", rec.Code)
	}
}

func TestConversationLookupNeedsTheToken(t *testing.T) {
	c := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{},
		Authorize: func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer s3cret" }})
	defer c.Close()
	if code, body := get(t, c, "/console/api/conversation?conv_id=g:1"); code != http.StatusUnauthorized || !strings.Contains(body, "bearer token") || strings.Contains(body, "msgId") {
		t.Fatalf("without a token: %d %s", code, body)
	}
	req := httptest.NewRequest(http.MethodGet, "/console/api/conversation?conv_id=g:1", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, req)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"headSeq":"30"`) {
		t.Fatalf("with the token: %d %s", rec.Code, rec.Body.String())
	}
	// The cluster picture stays open, like /metrics.
	if code, _ := get(t, c, "/console/api/members"); code != 200 {
		t.Fatalf("members: %d", code)
	}
}

func TestRatesFromTheRegistry(t *testing.T) {
	m := metrics.New()
	t0 := time.Unix(1000, 0)
	a, err := read(m.Registry, t0)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		m.CommitSeconds.WithLabelValues("ok").Observe(0.001)
	}
	m.CommitSeconds.WithLabelValues("conflict").Observe(0.001) // not a commit
	m.Sends.WithLabelValues("ok").Add(100)
	m.Sends.WithLabelValues("duplicate").Add(50) // not a new message
	for i := range 100 {
		d := 0.002 // 99 fast sends
		if i == 99 {
			d = 0.5
		}
		m.SendSeconds.WithLabelValues("Send", "ok").Observe(d)
	}
	b, err := read(m.Registry, t0.Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s := rates(a, b)
	if s.CommitsPerSec != 10 || s.MessagesPerSec != 50 {
		t.Fatalf("rates: %+v, want 10 commits/s and 50 messages/s", s)
	}
	if s.SendP50Ms == nil || *s.SendP50Ms < 1 || *s.SendP50Ms > 2.0001 {
		t.Fatalf("p50 %v ms, want within the (1, 2] ms bucket", s.SendP50Ms)
	}
	if *s.SendP99Ms < 1 || *s.SendP99Ms > 2.0001 {
		t.Fatalf("p99 %v ms: 99 of 100 sends took 2 ms", *s.SendP99Ms)
	}
	c := rates(b, b)
	if c.SendP50Ms != nil || c.CommitsPerSec != 0 {
		t.Fatalf("no traffic: %+v", c)
	}
	if q := quantile([]float64{1, 2, math.Inf(1)}, []float64{0, 0, 10}, 10, 0.5); !math.IsInf(q, 1) && q != 2 {
		t.Fatalf("past the last finite bound: %v", q)
	}
}

func TestSamplerKeepsTheLastSamples(t *testing.T) {
	m := metrics.New()
	c := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{}, Gatherer: m.Registry, SampleEvery: time.Hour, Keep: 3})
	c.Close() // stop the loop; drive sample by hand
	t0 := time.Unix(2000, 0)
	for i := range 6 {
		m.Sends.WithLabelValues("ok").Add(float64(i))
		c.sample(t0.Add(time.Duration(i) * time.Second))
	}
	code, body := get(t, c, "/console/api/metrics")
	var out struct{ Samples []Sample }
	if err := json.Unmarshal([]byte(body), &out); code != 200 || err != nil {
		t.Fatal(code, body, err)
	}
	if len(out.Samples) != 3 || out.Samples[2].MessagesPerSec != 5 || out.Samples[0].MessagesPerSec != 3 {
		t.Fatalf("want the last 3 samples (3, 4, 5 msg/s): %s", body)
	}
}

type fakePositions struct{ down bool }

func (p fakePositions) ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]sequencer.ReadState, error) {
	if p.down {
		return nil, errors.New("dial tcp 10.0.0.5:5432: connection refused (user secret)")
	}
	out := make([]sequencer.ReadState, len(convIDs))
	for i, c := range convIDs {
		out[i] = sequencer.ReadState{ConvID: c, ReadSeq: uid, Head: 30}
	}
	return out, nil
}

// The lookup with a uid shows that user's read position and unread count.
func TestConversationReadState(t *testing.T) {
	c := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{}, Positions: fakePositions{}})
	defer c.Close()
	code, body := get(t, c, "/console/api/conversation?conv_id=g:1&limit=1&uid=12")
	var ans struct {
		HeadSeq   string
		ReadState map[string]string
	}
	if err := json.Unmarshal([]byte(body), &ans); code != 200 || err != nil {
		t.Fatalf("lookup with uid: %d %s %v", code, body, err)
	}
	if want := map[string]string{"uid": "12", "readSeq": "12", "headSeq": "30", "unread": "18"}; len(ans.ReadState) != len(want) ||
		ans.ReadState["uid"] != "12" || ans.ReadState["readSeq"] != "12" || ans.ReadState["unread"] != "18" || ans.ReadState["headSeq"] != "30" {
		t.Fatalf("readState = %v, want %v", ans.ReadState, want)
	}
	if code, body = get(t, c, "/console/api/conversation?conv_id=g:1"); code != 200 || strings.Contains(body, "readState") {
		t.Fatalf("lookup without uid: %d %s", code, body)
	}
	for _, bad := range []string{"0", "9223372036854775808", "-1", "x"} {
		if code, _ = get(t, c, "/console/api/conversation?conv_id=g:1&uid="+bad); code != 400 {
			t.Fatalf("uid %s: %d, want 400", bad, code)
		}
	}
	down := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{}, Positions: fakePositions{down: true}})
	defer down.Close()
	if code, body = get(t, down, "/console/api/conversation?conv_id=g:1&uid=5"); code != 503 || strings.Contains(body, "10.0.0.5") {
		t.Fatalf("store down: %d %s", code, body)
	}
	none := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{}})
	defer none.Close()
	if code, _ = get(t, none, "/console/api/conversation?conv_id=g:1&uid=5"); code != http.StatusNotImplemented {
		t.Fatalf("no read positions: %d, want 501", code)
	}
}

type fakeWorkers struct{ err error }

func (w fakeWorkers) Workers(ctx context.Context) ([]Worker, error) {
	if w.err != nil {
		return nil, w.err
	}
	return []Worker{{Addr: "10.0.0.7:5432", Shards: 16, Reachable: true}, {Addr: "10.0.0.8:5432", Shards: 16}}, nil
}

// The workers of a distributed store, and none (distributed: false) on
// other stores; a failure says "store unavailable", nothing more.
func TestWorkers(t *testing.T) {
	c := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{}, Workers: fakeWorkers{}})
	defer c.Close()
	code, body := get(t, c, "/console/api/workers")
	var ans struct {
		Distributed bool
		Workers     []Worker
	}
	if err := json.Unmarshal([]byte(body), &ans); code != 200 || err != nil || !ans.Distributed || len(ans.Workers) != 2 ||
		ans.Workers[0] != (Worker{Addr: "10.0.0.7:5432", Shards: 16, Reachable: true}) || ans.Workers[1].Reachable {
		t.Fatalf("workers: %d %s %v", code, body, err)
	}
	plain := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{}})
	defer plain.Close()
	if code, body = get(t, plain, "/console/api/workers"); code != 200 || body != `{"distributed":false,"node":"n1","workers":[]}`+"\n" {
		t.Fatalf("not distributed: %d %s", code, body)
	}
	down := New(Config{NodeID: "n1", Cluster: fakeView{}, Reader: fakeReader{}, Workers: fakeWorkers{err: errors.New("dial tcp 10.0.0.5:5432 (user secret)")}})
	defer down.Close()
	if code, body = get(t, down, "/console/api/workers"); code != 503 || strings.Contains(body, "10.0.0.5") || strings.Contains(body, "secret") {
		t.Fatalf("store down: %d %s", code, body)
	}
}
