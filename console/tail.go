package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sequencer-im/sequencer"
)

// The conversation view tails live:
//
//	GET /console/api/tail?conv_id=ID&after_seq=N
//
// answers text/event-stream: one "message" event per stored message of the
// conversation above N, in seq order, each once (MessageInfo, as the
// lookup shows it), first what is stored and then live as it is committed,
// from the node's change feed (Config.Tail: package feed, the same streams
// as Subscribe); "end" with the reason when the feed ends the stream (the
// page then tails again from the last seq it has). The lookup's
// authorization applies.

// Tailer streams convID's stored messages above afterSeq to send, backlog
// then live, until ctx ends or the feed ends the stream (its error).
type Tailer func(ctx context.Context, convID string, afterSeq uint64, send func(*sequencer.Message) error) error

func (c *Console) tail(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Authorize != nil && !c.cfg.Authorize(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sequencer"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "unauthenticated: this node needs a bearer token for conversation lookups"})
		return
	}
	if c.cfg.Tail == nil {
		writeJSON(w, http.StatusNotImplemented, map[string]string{"error": "this node has no change feed"})
		return
	}
	conv := r.URL.Query().Get("conv_id")
	if err := sequencer.CheckConvID(conv); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	after, err := strconv.ParseUint(r.URL.Query().Get("after_seq"), 10, 64)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "after_seq: want a decimal seq"})
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "streaming unsupported"})
		return
	}
	// The admin server's write timeout would end the stream: lift it, as
	// Subscribe does.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	err = c.cfg.Tail(r.Context(), conv, after, func(m *sequencer.Message) error {
		b, err := json.Marshal(MessageInfo{MsgID: m.MsgID, Seq: m.Seq, FromUID: m.FromUID, MsgType: m.MsgType,
			ClientMsgID: m.ClientMsgID, ServerAt: m.ServerAt, BodyBytes: len(m.Body)})
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "event: message\ndata: %s\n\n", b); err != nil {
			return err
		}
		fl.Flush()
		return nil
	})
	if r.Context().Err() == nil && err != nil {
		b, _ := json.Marshal(map[string]string{"error": err.Error()})
		fmt.Fprintf(w, "event: end\ndata: %s\n\n", b)
		fl.Flush()
	}
}
