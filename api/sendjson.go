package api

import (
	"fmt"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// sendJSON is the direct path of the unary Send in Connect's JSON form
// (POST application/json, what curl and plain HTTP clients send): it
// answers what the Connect handler would, byte for byte, without its
// per-call machinery (protocol and codec lookup, the call's stream, the
// interceptor chain). It sits behind limitBody, so the guards (request id,
// CORS, token, size) have run and the body is read whole.
//
// It takes only a request it can answer exactly: method POST, Content-Type
// "application/json" or "application/json; charset=utf-8" as written, no
// Content-Encoding, no Connect-Timeout-Ms, Connect-Protocol-Version absent
// or "1", a live context, and a body in the plain shape the JSON codec
// decodes directly (decodeSendRequest). Everything else (other spellings,
// compression, deadlines, protojson's cases, every other RPC) goes on to
// the Connect handler unchanged. Errors are written by connect's
// ErrorWriter (the Connect unary error JSON and status), a panic in Send is
// answered like WithRecover's. Service.Send sets no response headers or
// trailers but HeaderMembershipVersion (cluster mode), which this path sets
// too, so the answer's headers are the Connect handler's own. Not
// installed when tracing is on (the interceptor must see every call).
// sendjson_test.go compares its answers with the Connect handler's.
type sendJSON struct {
	svc  *Service
	ew   *connect.ErrorWriter
	next http.Handler
}

// sendSpec is what the recover handler is told of a Send.
var sendSpec = connect.Spec{Procedure: sequencerv1connect.SequencerServiceSendProcedure, StreamType: connect.StreamTypeUnary}

// acceptCompression is the Accept-Encoding the Connect handler answers: the
// names of its compressors (the default: gzip only). It and contentTypes are
// shared by every answer: header values are replaced or appended to (a new
// array: len == cap), never written in place.
var acceptCompression = []string{"gzip"}

// contentTypes are the Content-Type answers of the direct path: the
// request's own, as the Connect handler answers.
var contentTypes = map[string][]string{
	"application/json":                {"application/json"},
	"application/json; charset=utf-8": {"application/json; charset=utf-8"},
}

func (h *sendJSON) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, ok := r.Body.(*body)
	if !ok || r.Method != http.MethodPost || r.URL.Path != sequencerv1connect.SequencerServiceSendProcedure {
		h.next.ServeHTTP(w, r)
		return
	}
	ctype := jsonContentType(r.Header)
	if ctype == "" || len(r.Header["Content-Encoding"]) != 0 || len(r.Header["Connect-Timeout-Ms"]) != 0 ||
		!protocolVersionOK(r.Header) || r.Context().Err() != nil {
		h.next.ServeHTTP(w, r)
		return
	}
	msg := new(sequencerv1.SendRequest)
	if data := b.buf.Bytes(); len(data) == 0 || !decodeSendRequest(data, msg) {
		h.next.ServeHTTP(w, r) // protojson's business, and its errors
		return
	}
	header := w.Header()
	header["Content-Type"] = contentTypes[ctype]
	header["Accept-Encoding"] = acceptCompression
	res, err := h.call(r, msg)
	if err != nil {
		_ = h.ew.Write(w, r, err)
		return
	}
	out, ok := appendSendResult(b.out[:0], res)
	if !ok { // a time protojson refuses: its error, as the codec answers it
		_, err := jsonCodec{}.MarshalAppend(nil, sendResponse(res))
		_ = h.ew.Write(w, r, connect.NewError(connect.CodeInternal, fmt.Errorf("marshal message: %w", err)))
		return
	}
	b.out = out
	h.svc.viewHeader(header)
	_, _ = w.Write(out)
}

// appendSendResult appends the JSON of res's SendResponse (appendSendResponse)
// without building it on the heap.
func appendSendResult(dst []byte, res sequencer.SendResult) ([]byte, bool) {
	r := sequencerv1.SendResponse{MsgId: res.MsgID, Seq: res.Seq, Duplicate: res.Duplicate}
	ts := timestamppb.Timestamp{Seconds: res.ServerAt.Unix(), Nanos: int32(res.ServerAt.Nanosecond())}
	if !res.ServerAt.IsZero() {
		r.ServerAt = &ts
	}
	return appendSendResponse(dst, &r)
}

// call runs Send, answering a panic as connect.WithRecover does.
func (h *sendJSON) call(r *http.Request, msg *sequencerv1.SendRequest) (res sequencer.SendResult, err error) {
	ctx := r.Context()
	panicked := true
	defer func() {
		if panicked {
			p := recover()
			if p == http.ErrAbortHandler { //nolint:errorlint // net/http compares with ==
				panic(p)
			}
			res, err = sequencer.SendResult{}, h.svc.recovered(ctx, sendSpec, r.Header, p)
		}
	}()
	res, err = h.svc.send(ctx, msg)
	panicked = false
	return res, err
}

// jsonContentType returns the request's Content-Type when it is one the
// direct path takes, else "".
func jsonContentType(h http.Header) string {
	v := h["Content-Type"]
	if len(v) != 1 {
		return ""
	}
	switch v[0] {
	case "application/json", "application/json; charset=utf-8":
		return v[0]
	}
	return ""
}

// protocolVersionOK: Connect-Protocol-Version absent, or "1" (the Connect
// handler refuses any other value).
func protocolVersionOK(h http.Header) bool {
	v := h["Connect-Protocol-Version"]
	return len(v) == 0 || (len(v) == 1 && v[0] == "1")
}
