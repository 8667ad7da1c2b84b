package feed

import (
	"context"

	"github.com/sequencer-im/sequencer"
)

// Tap is a peer node's share of this hub: the batches this node's writers
// commit (Publish) in the conversations the peer follows, for the peer's
// own hub (its Upstream delivers them). Taps never count against
// MaxSubscriptions: a peer's tap stands for all of its subscribers, so a
// node's cost grows with its peers, not with their subscribers. Its queue
// is bounded like a stream's (MaxQueue); past it Next answers ErrBehind and
// the peer reads the store and opens a new Tap. One goroutine calls Next;
// Follow and Unfollow may come from another.
type Tap struct {
	h     *Hub
	s     *stream
	convs map[string]bool // guarded by h.mu
}

// Published is one committed batch of one conversation.
type Published struct {
	ConvID string
	Msgs   []sequencer.Message
	Reads  []ReadTick // read ticks of ConvID (PublishRead), no Msgs then
}

// NewTap returns an empty tap.
func (h *Hub) NewTap() *Tap {
	h.mu.Lock()
	h.openTaps++
	h.mu.Unlock()
	return &Tap{h: h, s: &stream{max: h.cfg.MaxQueue, wake: make(chan struct{}, 1)}, convs: map[string]bool{}}
}

// Follow adds convIDs, then queues ack: Next returns it after every batch
// queued before, and everything committed after it is queued.
func (t *Tap) Follow(convIDs []string, ack uint64) {
	h := t.h
	h.mu.Lock()
	for _, c := range convIDs {
		if t.convs[c] {
			continue
		}
		t.convs[c] = true
		set := h.taps[c]
		if set == nil {
			set = map[*stream]struct{}{}
			h.taps[c] = set
		}
		set[t.s] = struct{}{}
	}
	h.mu.Unlock()
	t.s.mu.Lock()
	t.s.acks = append(t.s.acks, ack)
	t.s.mu.Unlock()
	t.s.poke()
}

// Unfollow removes convIDs.
func (t *Tap) Unfollow(convIDs []string) {
	h := t.h
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range convIDs {
		if !t.convs[c] {
			continue
		}
		delete(t.convs, c)
		set := h.taps[c]
		delete(set, t.s)
		if len(set) == 0 {
			delete(h.taps, c)
		}
	}
}

// Close unfollows everything.
func (t *Tap) Close() {
	h := t.h
	h.mu.Lock()
	h.openTaps--
	var all []string
	for c := range t.convs {
		all = append(all, c)
	}
	h.mu.Unlock()
	t.Unfollow(all)
}

// Next waits for batches or acks (or ctx) and returns them: acks after
// the batches queued before them. ErrBehind when the queue overflowed.
func (t *Tap) Next(ctx context.Context) ([]Published, []uint64, error) {
	for {
		s := t.s
		s.mu.Lock()
		q, acks, behind, ticks := s.queue, s.acks, s.behind, s.ticks
		s.queue, s.queued, s.acks, s.ticks = nil, 0, nil, nil
		s.mu.Unlock()
		if behind {
			t.h.n.tapsCut.Add(1)
			return nil, nil, ErrBehind
		}
		if len(q) > 0 || len(acks) > 0 || len(ticks) > 0 {
			out := make([]Published, len(q), len(q)+len(ticks))
			for i, p := range q {
				out[i] = Published{ConvID: p.convID, Msgs: p.msgs}
			}
			for _, tk := range ticks {
				out = append(out, Published{ConvID: tk.ConvID, Reads: []ReadTick{tk}})
			}
			return out, acks, nil
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}
