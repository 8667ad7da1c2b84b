package api

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/metrics"
)

// apiPair is the same API twice, each with its own service, sender and
// metrics: with the direct path of JSON Sends and without it (every request
// through the Connect handler).
type apiPair struct {
	direct, generic        http.Handler
	dirSender, genSender   *fakeSender
	dirMetrics, genMetrics *metrics.Set
}

func newAPIPair(t *testing.T, answer func(sequencer.SendRequest) (sequencer.SendResult, error)) *apiPair {
	t.Helper()
	p := &apiPair{}
	build := func(direct bool) (http.Handler, *fakeSender, *metrics.Set) {
		snd := &fakeSender{}
		snd.set(answer)
		m := metrics.New()
		svc := NewService(Config{Sender: snd, Reader: newFakeReader(), Metrics: m, Logger: slog.New(slog.DiscardHandler)})
		return newAPIMux(svc, Edge{}, direct), snd, m
	}
	p.direct, p.dirSender, p.dirMetrics = build(true)
	p.generic, p.genSender, p.genMetrics = build(false)
	return p
}

type sendCase struct {
	name   string
	method string
	header http.Header
	body   []byte
}

// serve serves c on h and returns the response.
func serve(h http.Handler, c sendCase) *http.Response {
	method := c.method
	if method == "" {
		method = http.MethodPost
	}
	r := httptest.NewRequest(method, "/sequencer.v1.SequencerService/Send", bytes.NewReader(c.body))
	for k, v := range c.header {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Result()
}

// compare serves c on both paths and fails on any difference a client could
// see: status, headers, body; and in what reached the sender.
func (p *apiPair) compare(t *testing.T, c sendCase) {
	t.Helper()
	d, g := serve(p.direct, c), serve(p.generic, c)
	db, _ := io.ReadAll(d.Body)
	gb, _ := io.ReadAll(g.Body)
	if d.StatusCode != g.StatusCode {
		t.Errorf("%s: status %d (direct), %d (Connect)", c.name, d.StatusCode, g.StatusCode)
	}
	if !reflect.DeepEqual(d.Header, g.Header) {
		t.Errorf("%s: headers\ndirect:  %v\nConnect: %v", c.name, d.Header, g.Header)
	}
	if !bytes.Equal(db, gb) {
		t.Errorf("%s: body\ndirect:  %s\nConnect: %s", c.name, db, gb)
	}
	dc, gc := p.dirSender.Calls(), p.genSender.Calls()
	if !reflect.DeepEqual(dc, gc) {
		t.Errorf("%s: sender calls differ\ndirect:  %+v\nConnect: %+v", c.name, dc, gc)
	}
}

// counters returns the sequencer_rpc_requests_total, sequencer_sends_total
// and sequencer_dedup_hits_total series of m.
func counters(t *testing.T, m *metrics.Set) map[string]float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		switch f.GetName() {
		case "sequencer_rpc_requests_total", "sequencer_sends_total", "sequencer_dedup_hits_total":
			for _, s := range f.GetMetric() {
				out[f.GetName()+labels(s)] = s.GetCounter().GetValue()
			}
		}
	}
	return out
}

func labels(m *dto.Metric) string {
	var b strings.Builder
	for _, l := range m.GetLabel() {
		b.WriteString("," + l.GetName() + "=" + l.GetValue())
	}
	return b.String()
}

func jsonHeader(kv ...string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"req-1"}}
	for i := 0; i+1 < len(kv); i += 2 {
		h[kv[i]] = append(h[kv[i]], kv[i+1])
	}
	return h
}

func gzipped(s string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write([]byte(s))
	_ = zw.Close()
	return b.Bytes()
}

// The direct path answers every Send exactly as the Connect handler does:
// successes, duplicates, validation errors, the sender's errors, a panic,
// and every request it leaves to Connect (other spellings, compression,
// deadlines, protojson's inputs, other methods). The metrics agree too.
func TestSendJSONDirectMatchesConnect(t *testing.T) {
	const plain = `{"convId":"c1","fromUid":"7","clientMsgId":"m1","msgType":2,"body":"aGVsbG8="}`
	at := time.Date(2026, 11, 30, 12, 0, 0, 123_000_000, time.UTC)
	answers := map[string]func(sequencer.SendRequest) (sequencer.SendResult, error){
		"ok": func(sequencer.SendRequest) (sequencer.SendResult, error) {
			return sequencer.SendResult{MsgID: 1 << 41, Seq: 9, ServerAt: at}, nil
		},
		"duplicate": func(sequencer.SendRequest) (sequencer.SendResult, error) {
			return sequencer.SendResult{MsgID: 5, Seq: 1, ServerAt: at, Duplicate: true}, nil
		},
		"time out of protojson's range": func(sequencer.SendRequest) (sequencer.SendResult, error) {
			return sequencer.SendResult{MsgID: 5, Seq: 1, ServerAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, nil
		},
		"no time": func(sequencer.SendRequest) (sequencer.SendResult, error) {
			return sequencer.SendResult{MsgID: 5, Seq: 1}, nil
		},
		"unavailable": func(sequencer.SendRequest) (sequencer.SendResult, error) {
			return sequencer.SendResult{}, sequencer.Errorf(sequencer.CodeUnavailable, "store unavailable")
		},
		"resource_exhausted": func(sequencer.SendRequest) (sequencer.SendResult, error) {
			return sequencer.SendResult{}, sequencer.Errorf(sequencer.CodeResourceExhausted, "too many pending sends")
		},
		"internal": func(sequencer.SendRequest) (sequencer.SendResult, error) {
			return sequencer.SendResult{}, errors.New("disk on fire at /var/lib/x")
		},
		"canceled": func(sequencer.SendRequest) (sequencer.SendResult, error) {
			return sequencer.SendResult{}, context.Canceled
		},
		"panic": func(sequencer.SendRequest) (sequencer.SendResult, error) { panic("engine bug: secret") },
	}
	cases := []sendCase{
		{name: "plain", header: jsonHeader(), body: []byte(plain)},
		{name: "charset", header: http.Header{"Content-Type": {"application/json; charset=utf-8"}, "X-Request-Id": {"r"}}, body: []byte(plain)},
		{name: "proto names and spaces", header: jsonHeader(), body: []byte(` { "conv_id" : "c1", "from_uid": 7, "client_msg_id":"m1", "body":"aGk" } `)},
		{name: "no request id", header: http.Header{"Content-Type": {"application/json"}}, body: []byte(plain)},
		{name: "invalid conv", header: jsonHeader(), body: []byte(`{"convId":"","fromUid":"7","clientMsgId":"m1"}`)},
		{name: "empty object", header: jsonHeader(), body: []byte(`{}`)},
		{name: "escape", header: jsonHeader(), body: []byte(`{"convId":"c\u0031","fromUid":"7","clientMsgId":"m1"}`)},
		{name: "unknown field", header: jsonHeader(), body: []byte(`{"convId":"c1","fromUid":"7","clientMsgId":"m1","x":1}`)},
		{name: "not json", header: jsonHeader(), body: []byte(`{"convId":`)},
		{name: "empty body", header: jsonHeader(), body: nil},
		{name: "upper-case type", header: http.Header{"Content-Type": {"Application/JSON"}, "X-Request-Id": {"r"}}, body: []byte(plain)},
		{name: "protocol version 1", header: jsonHeader("Connect-Protocol-Version", "1"), body: []byte(plain)},
		{name: "protocol version 2", header: jsonHeader("Connect-Protocol-Version", "2"), body: []byte(plain)},
		{name: "timeout", header: jsonHeader("Connect-Timeout-Ms", "5000"), body: []byte(plain)},
		{name: "bad timeout", header: jsonHeader("Connect-Timeout-Ms", "soon"), body: []byte(plain)},
		{name: "gzip body", header: jsonHeader("Content-Encoding", "gzip"), body: gzipped(plain)},
		{name: "unknown encoding", header: jsonHeader("Content-Encoding", "br"), body: []byte(plain)},
		{name: "accept gzip", header: jsonHeader("Accept-Encoding", "gzip", "Connect-Accept-Encoding", "gzip"), body: []byte(plain)},
		{name: "GET", method: http.MethodGet, header: jsonHeader(), body: nil},
		{name: "PUT", method: http.MethodPut, header: jsonHeader(), body: []byte(plain)},
		{name: "text", header: http.Header{"Content-Type": {"text/plain"}, "X-Request-Id": {"r"}}, body: []byte(plain)},
	}
	for name, answer := range answers {
		t.Run(name, func(t *testing.T) {
			p := newAPIPair(t, answer)
			for _, c := range cases {
				if c.name == "no request id" {
					// The generated ids differ; everything else must not.
					d, g := serve(p.direct, c), serve(p.generic, c)
					if id := d.Header.Get("X-Request-Id"); id == "" || d.StatusCode != g.StatusCode {
						t.Errorf("no request id: direct %d id %q, Connect %d", d.StatusCode, id, g.StatusCode)
					}
					continue
				}
				p.compare(t, c)
			}
			if dm, gm := counters(t, p.dirMetrics), counters(t, p.genMetrics); !reflect.DeepEqual(dm, gm) {
				t.Errorf("metrics\ndirect:  %v\nConnect: %v", dm, gm)
			}
		})
	}
}

// The direct path does take the plain JSON Send (it is not silently
// handing everything to Connect), and only that.
func TestSendJSONDirectTakesPlainSends(t *testing.T) {
	snd := &fakeSender{}
	snd.set(func(sequencer.SendRequest) (sequencer.SendResult, error) {
		return sequencer.SendResult{MsgID: 1, Seq: 1}, nil
	})
	svc := NewService(Config{Sender: snd, Reader: newFakeReader(), Logger: slog.New(slog.DiscardHandler)})
	connectCalls := 0
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		connectCalls++
		w.WriteHeader(http.StatusTeapot)
	})
	h := limitBody(svc, nil, 1<<20, &sendJSON{svc: svc, next: next})
	plain := `{"convId":"c1","fromUid":"7","clientMsgId":"m1"}`
	for _, c := range []struct {
		name       string
		body, ct   string
		wantDirect bool
	}{
		{"plain", plain, "application/json", true},
		{"charset", plain, "application/json; charset=utf-8", true},
		{"escape", `{"convId":"\u0063"}`, "application/json", false},
		{"binary", "\x0a\x02c1", "application/proto", false},
	} {
		connectCalls = 0
		before := len(snd.Calls())
		r := httptest.NewRequest(http.MethodPost, "/sequencer.v1.SequencerService/Send", strings.NewReader(c.body))
		r.Header.Set("Content-Type", c.ct)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		direct := len(snd.Calls()) > before
		if direct != c.wantDirect || direct == (connectCalls == 1) {
			t.Errorf("%s: direct %v, Connect handler called %d times; want direct %v", c.name, direct, connectCalls, c.wantDirect)
		}
		if direct && w.Code != http.StatusOK {
			t.Errorf("%s: status %d", c.name, w.Code)
		}
	}
}
