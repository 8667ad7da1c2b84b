package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/feed"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

const methodSubscribe = "Subscribe"

// errNoFeed answers Subscribe on a node built without a feed hub.
var errNoFeed = connect.NewError(connect.CodeUnimplemented, errors.New("the change feed is not configured on this node"))

// Subscribe validates the cursors (invalid_argument before any event) and
// streams the feed's events (package feed: backlog, then live) until the
// client ends it or the feed does: resource_exhausted for a subscriber that
// fell behind or a node at its subscription bound, unavailable for a store
// that failed: both retryable by resuming from the last seqs received.
func (s *Service) Subscribe(ctx context.Context, req *connect.Request[sequencerv1.SubscribeRequest], st *connect.ServerStream[sequencerv1.SubscribeResponse]) error {
	cursors, err := ValidateCursors(req.Msg.GetCursors(), MaxSubscribeCursors)
	if err != nil {
		return s.fail(ctx, methodSubscribe, err)
	}
	if s.feed == nil {
		s.count(methodSubscribe, "unimplemented")
		return errNoFeed
	}
	ctl, _ := ctx.Value(streamControlKey{}).(*streamWriter)
	var cut func()
	var flush func() error
	if ctl != nil {
		rc := ctl.rc
		// A subscriber that fell behind gets SubscribeCutGrace to take
		// the write under way: a slow one then reads resource_exhausted,
		// a stalled one loses the stream to the deadline.
		cut = func() { _ = rc.SetWriteDeadline(time.Now().Add(SubscribeCutGrace)) }
	}
	// Headers go out at once: a client (or proxy) sees the stream open
	// before the first event.
	if err := st.Send(nil); err != nil {
		return err
	}
	if ctl != nil {
		// From here on connect's flush after every message is held, and
		// the feed flushes once per turn: the events pending at once go
		// out in one write (a subscriber that fell behind catches up in
		// large writes, not one per message).
		ctl.hold.Store(true)
		defer ctl.release()
		flush = ctl.flushHeld
	}
	var out sequencerv1.SubscribeResponse
	var shared sharedEvent
	err = s.feed.Serve(ctx, feed.Subscription{Cursors: cursors, Store: s.reader, Cut: cut, Flush: flush, ReadPositions: req.Msg.GetReadPositions(), Send: func(e feed.Event) error {
		return sendEvent(st, &out, &shared, e) // a live message encoded once for all streams (feedcodec.go)
	}})
	if ctx.Err() != nil && !errors.Is(err, feed.ErrBehind) {
		s.count(methodSubscribe, "canceled") // the client's own end
		return ctx.Err()
	}
	return s.fail(ctx, methodSubscribe, err, "conversations", len(cursors))
}

// SubscribeCutGrace is how long a Subscribe stream that fell behind may
// still take to write what is under way before its transport is cut.
const SubscribeCutGrace = 10 * time.Second

type streamControlKey struct{}

// streamControl lifts the server's whole-RPC read and write timeouts for a
// Subscribe (a stream lives as long as its client wants) and hands the
// handler the response's controller: the feed cuts a subscriber that fell
// behind with a write deadline in the past, which fails a write blocked on
// the client's flow control. Other RPCs pass through untouched.
func streamControl(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/"+methodSubscribe) {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		sw := &streamWriter{ResponseWriter: w, rc: rc}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), streamControlKey{}, sw)))
	})
}

// streamWriter is a Subscribe's response writer: while hold is set, a
// Flush (connect flushes after every streamed message) only notes that
// one is due, and flushHeld does it (the feed, once per turn). Only the
// stream's handler goroutine writes and flushes.
type streamWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	hold    atomic.Bool
	pending bool
	flushes int // flushes that reached the transport (tests)
}

func (w *streamWriter) Flush() {
	if w.hold.Load() {
		w.pending = true
		return
	}
	w.flush()
}

func (w *streamWriter) flush() {
	w.flushes++
	_ = w.rc.Flush()
}

// flushHeld flushes what the held flushes left in the buffers.
func (w *streamWriter) flushHeld() error {
	if !w.pending {
		return nil
	}
	w.pending = false
	w.flushes++
	return w.rc.Flush()
}

// release stops holding flushes and flushes what is pending.
func (w *streamWriter) release() {
	w.hold.Store(false)
	_ = w.flushHeld()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *streamWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
