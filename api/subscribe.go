package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
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
	rc, _ := ctx.Value(streamControlKey{}).(*http.ResponseController)
	var cut func()
	if rc != nil {
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
	var out sequencerv1.SubscribeResponse
	err = s.feed.Serve(ctx, feed.Subscription{Cursors: cursors, Store: s.reader, Cut: cut, ReadPositions: req.Msg.GetReadPositions(), Send: func(e feed.Event) error {
		switch e.Kind {
		case feed.KindMessage:
			out.Event = &sequencerv1.SubscribeResponse_Message{Message: messageProto(e.Msg)}
		case feed.KindTruncated:
			out.Event = &sequencerv1.SubscribeResponse_Truncated{Truncated: &sequencerv1.Truncated{ConvId: e.ConvID, OldestSeq: e.OldestSeq}}
		case feed.KindHeartbeat:
			out.Event = &sequencerv1.SubscribeResponse_Heartbeat{Heartbeat: &sequencerv1.Heartbeat{}}
		case feed.KindReadPosition:
			out.Event = &sequencerv1.SubscribeResponse_ReadPosition{ReadPosition: &sequencerv1.ReadPositionChanged{ConvId: e.ConvID, Uid: e.UID, ReadSeq: e.ReadSeq}}
		}
		return st.Send(&out)
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
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), streamControlKey{}, rc)))
	})
}
