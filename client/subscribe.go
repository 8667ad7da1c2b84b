package client

import (
	"context"
	"iter"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// Cursor is one conversation to follow and the highest seq the caller
// already holds in it (0 for none).
type Cursor struct {
	ConvID   string
	AfterSeq uint64
}

// Event is one item of a Subscribe: a stored message, or a notice that
// retention removed seqs the cursor asked for (the conversation continues
// at Truncated.OldestSeq).
type Event struct {
	Message   *Message   // the next stored message of its conversation
	Truncated *Truncated // retention removed the seqs before OldestSeq
	// ReadPosition (SubscribeOptions.ReadPositions only): a user's read
	// position in a followed conversation changed. Live only: ticks made
	// while no stream was attached (between resumes) are not repeated.
	ReadPosition *ReadPositionChanged
}

// ReadPositionChanged says UID's read position in ConvID is now ReadSeq
// (MarkRead, or UID's own message). Keep the highest per (ConvID, UID):
// ticks may arrive out of order.
type ReadPositionChanged struct {
	ConvID  string
	UID     uint64
	ReadSeq uint64
}

// SubscribeOptions are Subscribe's options beyond the cursors.
type SubscribeOptions struct {
	// ReadPositions: also yield the live read-position changes of the
	// followed conversations (Event.ReadPosition; docs/API.md, "Read
	// ticks").
	ReadPositions bool
}

// Truncated says retention removed seqs a cursor asked for.
type Truncated struct {
	ConvID    string
	OldestSeq uint64
}

// SubscribeIdle is how long a Subscribe waits for any event (the server
// sends a heartbeat when it has nothing to send, every 15 s by default)
// before it takes the stream for dead and subscribes again.
const SubscribeIdle = 45 * time.Second

// Subscribe follows the conversations of cursors (1..10,000, no
// conversation twice) and yields, per conversation, every stored message
// with seq above its cursor, in seq order, each once, first the backlog and
// then live. It resumes by itself: when the stream ends with a retryable
// code (unavailable, resource_exhausted), breaks at the transport or stays
// silent past SubscribeIdle, it subscribes again, at the next node, from
// the last seq it yielded of each conversation, so across node deaths the
// caller still sees each stored message exactly once, in order.
// Heartbeats are not yielded. It ends when ctx ends or the caller stops,
// or yields a final error (invalid_argument, a token refused, ...).
func (c *Client) Subscribe(ctx context.Context, cursors []Cursor) iter.Seq2[Event, error] {
	return c.SubscribeWith(ctx, cursors, SubscribeOptions{})
}

// SubscribeWith is Subscribe with options (read ticks).
func (c *Client) SubscribeWith(ctx context.Context, cursors []Cursor, opts SubscribeOptions) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		last := make(map[string]uint64, len(cursors))
		order := make([]string, len(cursors))
		for i, cur := range cursors {
			last[cur.ConvID] = cur.AfterSeq
			order[i] = cur.ConvID
		}
		var avoid *node
		failures := 0
		for {
			if c.closed.Load() {
				yield(Event{}, ErrClosed)
				return
			}
			target := c.anyNode(avoid)
			req := &sequencerv1.SubscribeRequest{Cursors: make([]*sequencerv1.Cursor, len(order)), ReadPositions: opts.ReadPositions}
			for i, cv := range order {
				req.Cursors[i] = &sequencerv1.Cursor{ConvId: cv, AfterSeq: last[cv]}
			}
			delivered, stopped, err := c.subscribeOnce(ctx, target, req, last, yield)
			if stopped {
				return
			}
			if ctx.Err() != nil {
				return
			}
			f := classify(err, false)
			if !f.retry {
				yield(Event{}, &sequencer.Error{Code: f.code, Msg: "subscribe: " + err.Error(), Err: err})
				return
			}
			if f.transport {
				target.markDown(time.Now().Add(c.cfg.Retry.MaxBackoff))
			}
			if delivered {
				failures = 0
			}
			failures++
			avoid = target
			select {
			case <-time.After(c.cfg.Retry.backoff(failures)):
			case <-ctx.Done():
				return
			}
		}
	}
}

// subscribeOnce runs one stream at target. delivered: it yielded
// something; stopped: the caller stopped iterating.
func (c *Client) subscribeOnce(ctx context.Context, target *node, req *sequencerv1.SubscribeRequest, last map[string]uint64, yield func(Event, error) bool) (delivered, stopped bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := target.rpc.Subscribe(ctx, connect.NewRequest(req))
	if err != nil {
		return false, false, err
	}
	defer st.Close()
	// A silent stream (no event, not even a heartbeat) is dead.
	idle := time.AfterFunc(SubscribeIdle, cancel)
	defer idle.Stop()
	idled := false
	for st.Receive() {
		idle.Reset(SubscribeIdle)
		switch e := st.Msg().GetEvent().(type) {
		case *sequencerv1.SubscribeResponse_Message:
			m := e.Message
			prev, ok := last[m.GetConvId()]
			if !ok || m.GetSeq() <= prev {
				continue // not followed, or already yielded
			}
			if m.GetSeq() != prev+1 {
				// Not the next one and no truncated before it: read it
				// again from the last seq (never skip).
				return delivered, false, sequencer.Errorf(sequencer.CodeUnavailable, "subscribe: seq %d of %q after %d", m.GetSeq(), m.GetConvId(), prev)
			}
			msg := messageFromProto(m)
			last[m.GetConvId()] = m.GetSeq()
			delivered = true
			if !yield(Event{Message: &msg}, nil) {
				return delivered, true, nil
			}
		case *sequencerv1.SubscribeResponse_Truncated:
			t := e.Truncated
			prev, ok := last[t.GetConvId()]
			if !ok || t.GetOldestSeq() <= prev+1 {
				continue
			}
			last[t.GetConvId()] = t.GetOldestSeq() - 1
			delivered = true
			if !yield(Event{Truncated: &Truncated{ConvID: t.GetConvId(), OldestSeq: t.GetOldestSeq()}}, nil) {
				return delivered, true, nil
			}
		case *sequencerv1.SubscribeResponse_ReadPosition:
			r := e.ReadPosition
			if _, ok := last[r.GetConvId()]; !ok {
				continue
			}
			if !yield(Event{ReadPosition: &ReadPositionChanged{ConvID: r.GetConvId(), UID: r.GetUid(), ReadSeq: r.GetReadSeq()}}, nil) {
				return delivered, true, nil
			}
		}
	}
	if !idle.Stop() {
		idled = true
	}
	err = st.Err()
	if err == nil || idled && ctx.Err() != nil {
		// The server never ends a stream without a code; an idle one was
		// cut here.
		err = sequencer.Errorf(sequencer.CodeUnavailable, "subscribe: the stream ended without a code")
	}
	return delivered, false, err
}
