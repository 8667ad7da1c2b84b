package feed

import (
	"sync"
	"sync/atomic"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// Upstream brings the hub live messages of conversations whose writer is on
// another node (the cluster's peer feed; nil on a single node). The hub
// tells it which conversations its streams follow; it calls Hub.Publish
// with what arrives and Hub.Resync whenever a conversation's live source
// changed or broke (so the streams fill from the store).
type Upstream interface {
	// Follow: the hub's first stream on each of convIDs started.
	Follow(convIDs []string)
	// Unfollow: the hub's last stream on each of convIDs ended.
	Unfollow(convIDs []string)
}

// Hub is a node's fan-out: which streams follow which conversations, and
// their bounded queues. Publish never blocks: a stream whose queue is full
// is marked behind and ends (resource_exhausted) at its next turn.
type Hub struct {
	// upMu orders the Upstream's Follow and Unfollow calls as the hub
	// decided them (under mu): held from the decision through the call, so
	// a conversation's last stream detaching and a new first one attaching
	// cannot reach the Upstream as Follow then Unfollow, which would leave
	// the new stream with no live messages from other nodes.
	upMu     sync.Mutex
	mu       sync.RWMutex
	convs    map[string]map[*stream]struct{}
	taps     map[string]map[*stream]struct{} // peers' Taps (tap.go)
	follows  int                             // (stream, conversation) pairs
	maxConvs int
	streams  int
	up       Upstream
	cfg      Config
	closed   bool
	openTaps int // open Taps
	n        counters

	readStreams atomic.Int64 // streams with read ticks on (readtick.go)
}

// counters are the hub's totals since it started (Totals).
type counters struct {
	delivered, heartbeats, cut, refused, reads, readMsgs, tapsCut atomic.Uint64
}

// Totals is what a hub did since it started and holds now, for metrics.
type Totals struct {
	Streams       int    // Subscribe streams open
	Follows       int    // (stream, conversation) pairs (what MaxSubscriptions bounds)
	Conversations int    // distinct conversations followed by the streams
	Taps          int    // peers' Taps open (cluster: one per peer)
	Delivered     uint64 // messages sent to subscribers
	Heartbeats    uint64 // heartbeat events sent
	Cut           uint64 // streams ended because their subscriber fell behind (ErrBehind)
	Refused       uint64 // Subscribes refused at the node's bound (MaxSubscriptions)
	BacklogReads  uint64 // store reads of streams' backlogs (each names up to 1,000 conversations)
	BacklogMsgs   uint64 // messages those reads returned
	TapsCut       uint64 // peers' Taps ended because their queue overflowed
}

// Totals returns the hub's counts.
func (h *Hub) Totals() Totals {
	h.mu.RLock()
	t := Totals{Streams: h.streams, Follows: h.follows, Conversations: len(h.convs), Taps: h.openTaps}
	h.mu.RUnlock()
	t.Delivered, t.Heartbeats, t.Cut = h.n.delivered.Load(), h.n.heartbeats.Load(), h.n.cut.Load()
	t.Refused, t.BacklogReads, t.BacklogMsgs, t.TapsCut = h.n.refused.Load(), h.n.reads.Load(), h.n.readMsgs.Load(), h.n.tapsCut.Load()
	return t
}

// stream is one subscriber's queue: what the hub handed it since its loop
// last looked.
type stream struct {
	mu     sync.Mutex
	queue  []published
	queued int         // messages in queue
	spare  []published // the loop's emptied queue, handed back at the next take (the loop's own)
	max    int
	behind bool
	resync []string
	closed bool          // the hub closed: end with ErrClosed
	acks   []uint64      // a Tap's acks, in order with its batches
	wake   chan struct{} // capacity 1: the loop has something to look at
	cut    func()        // called once when the stream falls behind (may be nil)
	reads  atomic.Bool   // read ticks on (readtick.go)
	ticks  []ReadTick    // read ticks queued
}

type published struct {
	convID string
	msgs   []sequencer.Message
	wires  []Wire // msgs' shared wire forms (nil for a Tap's)
}

// NewHub returns a hub. up may be nil (a single node: every writer is
// local and publishes itself).
func NewHub(cfg Config, up Upstream) *Hub {
	cfg.fill()
	return &Hub{convs: map[string]map[*stream]struct{}{}, taps: map[string]map[*stream]struct{}{}, maxConvs: cfg.MaxSubscriptions, up: up, cfg: cfg}
}

// SetUpstream sets the hub's Upstream before any stream attaches (the
// cluster's, made after the hub).
func (h *Hub) SetUpstream(up Upstream) {
	h.mu.Lock()
	h.up = up
	h.mu.Unlock()
}

// Publish hands a batch this node's writer committed in one conversation
// (ascending seqs, durably stored) to every stream and peer Tap that
// follows it. The slice is shared and must not be changed afterwards.
func (h *Hub) Publish(convID string, msgs []sequencer.Message) {
	if len(msgs) == 0 {
		return
	}
	h.mu.RLock()
	if set := h.convs[convID]; len(set) > 0 {
		wires := make([]Wire, len(msgs)) // encoded once, by the first stream to send each
		for s := range set {
			s.offer(published{convID, msgs, wires})
		}
	}
	for s := range h.taps[convID] {
		s.offer(published{convID, msgs, nil})
	}
	h.mu.RUnlock()
	h.tickSenders(convID, msgs)
}

// Deliver hands a batch another node committed (from the Upstream) to the
// streams that follow it; never to Taps, so batches never travel on.
func (h *Hub) Deliver(convID string, msgs []sequencer.Message) {
	if len(msgs) == 0 {
		return
	}
	h.mu.RLock()
	if set := h.convs[convID]; len(set) > 0 {
		wires := make([]Wire, len(msgs))
		for s := range set {
			s.offer(published{convID, msgs, wires})
		}
	}
	h.mu.RUnlock()
	h.tickSenders(convID, msgs)
}

// Resync tells every stream that follows one of convIDs to read the store
// before going on: the conversation's live source changed (a handoff, a
// lost upstream), so messages committed meanwhile may never come live.
func (h *Hub) Resync(convIDs []string) {
	h.mu.RLock()
	for _, c := range convIDs {
		for s := range h.convs[c] {
			s.mu.Lock()
			s.resync = append(s.resync, c)
			s.mu.Unlock()
			s.poke()
		}
	}
	h.mu.RUnlock()
}

// ErrClosed ends the streams of a node that stops (retryable: subscribe
// again, at another node).
var ErrClosed = sequencer.Errorf(sequencer.CodeUnavailable,
	"this node is stopping: subscribe again, at another node, from the last seq received of each conversation")

// Close ends every stream with ErrClosed and refuses new ones (the node
// drains: an HTTP server's Shutdown waits for its streams to end).
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, set := range h.convs {
		for s := range set {
			s.mu.Lock()
			s.closed = true
			s.mu.Unlock()
			s.poke()
		}
	}
}

// Following returns the conversations the hub's streams follow (for an
// Upstream that re-attaches after a change of owners).
func (h *Hub) Following() []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]string, 0, len(h.convs))
	for c := range h.convs {
		out = append(out, c)
	}
	return out
}

// Stats returns the open streams and the (stream, conversation) pairs they
// follow.
func (h *Hub) Stats() (streams, follows int) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.streams, h.follows
}

// attach registers a stream on cursors (live first: anything published from
// now on is queued), or refuses it when the node's bound would be passed.
func (h *Hub) attach(cursors []persist.Cursor, cut func()) (*stream, error) {
	s := &stream{max: h.cfg.MaxQueue, wake: make(chan struct{}, 1), cut: cut}
	var fresh []string
	h.upMu.Lock()
	defer h.upMu.Unlock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	if follows := h.follows; follows+len(cursors) > h.maxConvs {
		h.mu.Unlock()
		h.n.refused.Add(1)
		return nil, sequencer.Errorf(sequencer.CodeResourceExhausted,
			"this node follows %d conversations for its subscribers, at most %d: subscribe to fewer, later or at another node", follows, h.maxConvs)
	}
	for _, c := range cursors {
		set := h.convs[c.ConvID]
		if set == nil {
			set = map[*stream]struct{}{}
			h.convs[c.ConvID] = set
			fresh = append(fresh, c.ConvID)
		}
		set[s] = struct{}{}
	}
	h.follows += len(cursors)
	h.streams++
	up := h.up
	h.mu.Unlock()
	if up != nil && len(fresh) > 0 {
		up.Follow(fresh)
	}
	return s, nil
}

func (h *Hub) detach(s *stream, cursors []persist.Cursor) {
	var gone []string
	h.upMu.Lock()
	defer h.upMu.Unlock()
	h.mu.Lock()
	for _, c := range cursors {
		set := h.convs[c.ConvID]
		delete(set, s)
		if len(set) == 0 {
			delete(h.convs, c.ConvID)
			gone = append(gone, c.ConvID)
		}
	}
	h.follows -= len(cursors)
	h.streams--
	up := h.up
	h.mu.Unlock()
	if up != nil && len(gone) > 0 {
		up.Unfollow(gone)
	}
}

func (s *stream) offer(p published) {
	s.mu.Lock()
	if s.behind {
		s.mu.Unlock()
		return
	}
	if s.queued+len(p.msgs) > s.max {
		s.behind = true
		s.queue, s.queued = nil, 0 // the stream ends: free its queue now
		if s.cut != nil {
			s.cut() // unblock a send stuck on the subscriber
		}
	} else {
		s.queue = append(s.queue, p)
		s.queued += len(p.msgs)
	}
	s.mu.Unlock()
	s.poke()
}

func (s *stream) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *stream) isBehind() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.behind
}

// take moves what the hub queued into t; err ends the stream.
func (s *stream) take(t *Tail) error {
	s.mu.Lock()
	q, rs, behind, closed := s.queue, s.resync, s.behind, s.closed
	s.queue, s.queued, s.resync = s.spare, 0, nil
	s.mu.Unlock()
	s.spare = nil
	switch {
	case behind:
		return ErrBehind
	case closed:
		return ErrClosed
	}
	for _, c := range rs {
		t.Resync(c)
	}
	for _, p := range q {
		t.LiveShared(p.convID, p.msgs, p.wires)
	}
	// The Tail keeps the messages, not the queue: the queue's array comes
	// back as the next one (a live message costs no queue allocation).
	clear(q)
	s.spare = q[:0]
	return nil
}
