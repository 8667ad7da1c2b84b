package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/metrics"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// The handler benchmarks measure the server's own work for one unary Send:
// the API mux as NewHTTPHandler builds it (request id, size guard, Connect,
// validation, metrics) with a Sender that answers at once, driven without
// sockets, so allocs/op and B/op are the handler path's alone (the
// net/http connection code is not in them). Run:
//
//	go test ./api/ -run '^$' -bench 'Handler' -benchmem

// instantSender answers every send at once with fixed ids.
type instantSender struct{}

func (instantSender) Send(_ context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	return sequencer.SendResult{MsgID: 1 << 40, Seq: 7, ServerAt: time.Unix(1_700_000_000, 0)}, nil
}

func (s instantSender) SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome) {
	for i := range reqs {
		out[i].Result, out[i].Err = s.Send(ctx, reqs[i])
	}
}

// benchWriter is a reusable http.ResponseWriter that keeps nothing.
type benchWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) WriteHeader(code int)        { w.status = code }
func (w *benchWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
func (w *benchWriter) Flush()                      {}

func (w *benchWriter) reset() {
	clear(w.h)
	w.status, w.n = 0, 0
}

// rewindBody is a request body that can be read again for every iteration.
type rewindBody struct{ bytes.Reader }

func (*rewindBody) Close() error { return nil }

func benchHandler(b *testing.B) http.Handler {
	svc := NewService(Config{Sender: instantSender{}, Reader: newFakeReader(), Metrics: metrics.New(),
		Logger: slog.New(slog.DiscardHandler)})
	return NewHTTPHandler(svc, nil, nil)
}

func benchSendRequest(b *testing.B, h http.Handler, req *http.Request, body []byte, wantStatus int) {
	rb := &rewindBody{}
	w := &benchWriter{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		rb.Reset(body)
		r := *req
		r.Body = rb
		r.ContentLength = int64(len(body))
		w.reset()
		h.ServeHTTP(w, &r)
		if w.status != wantStatus && !(w.status == 0 && wantStatus == http.StatusOK) {
			b.Fatalf("status %d, want %d", w.status, wantStatus)
		}
	}
}

func benchMessage() *sequencerv1.SendRequest {
	return &sequencerv1.SendRequest{ConvId: "conv-1234", FromUid: 42, ClientMsgId: "c-42-000001",
		MsgType: 1, Body: bytes.Repeat([]byte{0xab}, 128)}
}

// BenchmarkHandlerSendJSON: POST application/json over HTTP/1.1, as the
// bench's e-json engine and curl send it.
func BenchmarkHandlerSendJSON(b *testing.B) {
	m := benchMessage()
	body := fmt.Appendf(nil, `{"convId":%q,"fromUid":"%d","clientMsgId":%q,"msgType":%d,"body":%q}`,
		m.ConvId, m.FromUid, m.ClientMsgId, m.MsgType, base64.StdEncoding.EncodeToString(m.Body))
	req := &http.Request{Method: http.MethodPost, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		URL:    &url.URL{Path: "/sequencer.v1.SequencerService/Send"},
		Header: http.Header{"Content-Type": {"application/json"}, "Accept-Encoding": {"identity"}},
		Host:   "127.0.0.1", RemoteAddr: "127.0.0.1:5000", RequestURI: "/sequencer.v1.SequencerService/Send"}
	req = req.WithContext(context.Background())
	benchSendRequest(b, benchHandler(b), req, body, http.StatusOK)
}

// BenchmarkHandlerSendGRPC: a gRPC unary call (HTTP/2, binary protobuf), as
// the SDK sends it.
func BenchmarkHandlerSendGRPC(b *testing.B) {
	msg, err := proto.Marshal(benchMessage())
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
	body = append(body, msg...)
	req := &http.Request{Method: http.MethodPost, Proto: "HTTP/2.0", ProtoMajor: 2,
		URL: &url.URL{Path: "/sequencer.v1.SequencerService/Send"},
		Header: http.Header{"Content-Type": {"application/grpc"}, "Te": {"trailers"},
			"Grpc-Accept-Encoding": {"gzip"}},
		Host: "127.0.0.1", RemoteAddr: "127.0.0.1:5000", RequestURI: "/sequencer.v1.SequencerService/Send"}
	req = req.WithContext(context.Background())
	benchSendRequest(b, benchHandler(b), req, body, http.StatusOK)
}

var _ io.Reader = (*rewindBody)(nil)
