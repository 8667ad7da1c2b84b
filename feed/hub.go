package feed

import (
	"sync"

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
	mu       sync.RWMutex
	convs    map[string]map[*stream]struct{}
	follows  int // (stream, conversation) pairs
	maxConvs int
	streams  int
	up       Upstream
	cfg      Config
}

// stream is one subscriber's queue: what the hub handed it since its loop
// last looked.
type stream struct {
	mu     sync.Mutex
	queue  []published
	queued int // messages in queue
	max    int
	behind bool
	resync []string
	wake   chan struct{} // capacity 1: the loop has something to look at
	cut    func()        // called once when the stream falls behind (may be nil)
}

type published struct {
	convID string
	msgs   []sequencer.Message
}

// NewHub returns a hub. up may be nil (a single node: every writer is
// local and publishes itself).
func NewHub(cfg Config, up Upstream) *Hub {
	cfg.fill()
	return &Hub{convs: map[string]map[*stream]struct{}{}, maxConvs: cfg.MaxSubscriptions, up: up, cfg: cfg}
}

// Publish hands a committed batch of one conversation (ascending seqs,
// durably stored) to every stream that follows it. The slice is shared and
// must not be changed afterwards.
func (h *Hub) Publish(convID string, msgs []sequencer.Message) {
	if len(msgs) == 0 {
		return
	}
	h.mu.RLock()
	for s := range h.convs[convID] {
		s.offer(convID, msgs)
	}
	h.mu.RUnlock()
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
	h.mu.Lock()
	if h.follows+len(cursors) > h.maxConvs {
		h.mu.Unlock()
		return nil, sequencer.Errorf(sequencer.CodeResourceExhausted,
			"this node follows %d conversations for its subscribers, at most %d: subscribe to fewer, later or at another node", h.follows, h.maxConvs)
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
	h.mu.Unlock()
	if h.up != nil && len(fresh) > 0 {
		h.up.Follow(fresh)
	}
	return s, nil
}

func (h *Hub) detach(s *stream, cursors []persist.Cursor) {
	var gone []string
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
	h.mu.Unlock()
	if h.up != nil && len(gone) > 0 {
		h.up.Unfollow(gone)
	}
}

func (s *stream) offer(convID string, msgs []sequencer.Message) {
	s.mu.Lock()
	if s.behind {
		s.mu.Unlock()
		return
	}
	if s.queued+len(msgs) > s.max {
		s.behind = true
		s.queue, s.queued = nil, 0 // the stream ends: free its queue now
		if s.cut != nil {
			s.cut() // unblock a send stuck on the subscriber
		}
	} else {
		s.queue = append(s.queue, published{convID, msgs})
		s.queued += len(msgs)
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

// take moves what the hub queued into t.
func (s *stream) take(t *Tail) (behind bool) {
	s.mu.Lock()
	q, rs, behind := s.queue, s.resync, s.behind
	s.queue, s.queued, s.resync = nil, 0, nil
	s.mu.Unlock()
	for _, c := range rs {
		t.Resync(c)
	}
	for _, p := range q {
		t.Live(p.convID, p.msgs)
	}
	return behind
}
