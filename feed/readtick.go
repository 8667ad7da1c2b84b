package feed

import (
	"cmp"
	"slices"

	"github.com/sequencer-im/sequencer"
)

// Read ticks: the live read-position changes a stream may opt into
// (Subscription.ReadPositions). They are live only: a stream gets the
// changes made while it is attached, never a backlog (a subscriber that
// needs the positions of now asks ListReadPositions or GetReadReceipts),
// and at most once per change on the node it is attached to; a stream that
// ends may miss ticks. Two sources:
//   - MarkRead on any node: the API calls Hub.PublishRead with the
//     position the store answered; the hub hands it to its own streams and
//     to every peer's Tap that follows the conversation (the cluster carries
//     it like a batch), whose hub delivers it with DeliverRead;
//   - a user's own message (the own-send rule, persist.SenderMarks): every
//     hub derives the sender's tick from the messages it publishes or gets
//     from a peer (unless Config.KeepReadPositions says the rule is off), so
//     nothing more travels between nodes.
//
// A tick is the position after a change, so a subscriber keeps the highest
// per (conversation, user): ticks of one user from two nodes may arrive out
// of order, and a tick may come before the message its seq names (it is
// not held back by the stream's backlog reads).

// KindReadPosition is an Event of a stream with read ticks on: UID's read
// position in ConvID is now ReadSeq.
const KindReadPosition = KindHeartbeat + 1

// ReadTick is one user's read position in one conversation after a change.
type ReadTick struct {
	ConvID  string
	UID     uint64
	ReadSeq uint64
}

// PublishRead hands ticks of this node's MarkRead calls to the streams that
// follow their conversations with read positions on, and to the peers'
// Taps that follow them. Like Publish it never blocks.
func (h *Hub) PublishRead(ticks ...ReadTick) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, tk := range ticks {
		h.offerTicks(tk.ConvID, []ReadTick{tk})
		for s := range h.taps[tk.ConvID] {
			s.offerTicks([]ReadTick{tk})
		}
	}
}

// DeliverRead hands ticks a peer published (from the Upstream) to this
// node's streams; never to Taps.
func (h *Hub) DeliverRead(ticks []ReadTick) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, tk := range ticks {
		h.offerTicks(tk.ConvID, []ReadTick{tk})
	}
}

// tickSenders offers the senders' ticks of a committed batch (the own-send
// rule) to the streams with read positions on; nothing to do (not even
// the lock) while no stream asked for them. Called after Publish and
// Deliver.
func (h *Hub) tickSenders(convID string, msgs []sequencer.Message) {
	if h.cfg.KeepReadPositions || h.readStreams.Load() == 0 {
		return
	}
	ticks := senderTicks(convID, msgs)
	h.mu.RLock()
	h.offerTicks(convID, ticks)
	h.mu.RUnlock()
}

// offerTicks queues ticks of convID on every stream that follows it with
// read positions on (h.mu held).
func (h *Hub) offerTicks(convID string, ticks []ReadTick) {
	for s := range h.convs[convID] {
		if s.reads.Load() {
			s.offerTicks(ticks)
		}
	}
}

// senderTicks is the own-send rule for one batch: each sender at their
// highest seq in it, by uid.
func senderTicks(convID string, msgs []sequencer.Message) []ReadTick {
	ticks := make([]ReadTick, 0, 1)
	for i := range msgs {
		ticks = append(ticks, ReadTick{ConvID: convID, UID: msgs[i].FromUID, ReadSeq: msgs[i].Seq})
	}
	slices.SortFunc(ticks, func(a, b ReadTick) int {
		if a.UID != b.UID {
			return cmp.Compare(a.UID, b.UID)
		}
		return cmp.Compare(b.ReadSeq, a.ReadSeq)
	})
	return slices.CompactFunc(ticks, func(a, b ReadTick) bool { return a.UID == b.UID })
}

// watchReads turns read ticks on for s (Subscription.ReadPositions); the
// returned func turns them off.
func (h *Hub) watchReads(s *stream) func() {
	s.reads.Store(true)
	h.readStreams.Add(1)
	return func() { h.readStreams.Add(-1) }
}

// offerTicks queues ticks on s, bounded like messages (MaxQueue): a stream
// past it falls behind and ends.
func (s *stream) offerTicks(ticks []ReadTick) {
	s.mu.Lock()
	if s.behind {
		s.mu.Unlock()
		return
	}
	if s.queued+len(s.ticks)+len(ticks) > s.max {
		s.behind = true
		s.queue, s.queued, s.ticks = nil, 0, nil
		if s.cut != nil {
			s.cut()
		}
	} else {
		s.ticks = append(s.ticks, ticks...)
	}
	s.mu.Unlock()
	s.poke()
}

// takeTicks removes the ticks queued on s.
func (s *stream) takeTicks() []ReadTick {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.ticks
	s.ticks = nil
	return t
}
