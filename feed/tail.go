// Package feed is the change feed: it tells subscribers of every stored
// message of the conversations they follow, per conversation in seq order,
// each once, first the backlog (read from the store) and then live, never
// one that is not durably stored.
//
// It owns three things:
//   - Tail (this file): the pure rules of one stream, without goroutines,
//     clocks or I/O: cursor arithmetic, the hand-over from backlog to live
//     (attach live first and hold what arrives, read the store up to its
//     head, then deliver the held messages above it) and hole filling (a
//     live message that is not last+1 asks for a store read first);
//   - Hub (hub.go): the node's fan-out. The conversation writers publish
//     each committed batch once (Hub.Publish, after the store acknowledged
//     it); the hub hands it to every stream that follows the conversation
//     through a bounded queue, never blocking the writer;
//   - Serve (serve.go): one stream's loop: store reads, the queue, the
//     heartbeat, the end.
//
// Live messages of conversations another node owns come from an Upstream
// the node gives the hub (the cluster's peer feed); the feed never asks who
// owns what. It must never assign seqs, write to the store, or deliver a
// message it did not get from a commit or a store read.
package feed

import (
	"slices"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// EventKind says what an Event carries.
type EventKind int

const (
	KindMessage   EventKind = iota + 1 // Event.Msg is the next message of its conversation
	KindTruncated                      // retention removed seqs: ConvID continues at OldestSeq
	KindHeartbeat                      // nothing to send for the heartbeat interval
)

// Event is one item of a stream.
type Event struct {
	Kind EventKind
	Msg  *sequencer.Message // KindMessage
	// Wire, when set, is Msg's encoded form shared with the other streams
	// that send it (a live message; nil for one read from the store).
	Wire      *Wire
	ConvID    string // KindTruncated, KindReadPosition
	OldestSeq uint64 // KindTruncated
	UID       uint64 // KindReadPosition
	ReadSeq   uint64 // KindReadPosition
}

// convTail is one conversation of a Tail.
type convTail struct {
	id      string
	last    uint64    // the highest seq delivered (the cursor at first)
	read    bool      // the store must be read before live messages go on
	reading bool      // a read was handed out and not answered yet
	listed  bool      // in Tail.due
	held    []heldMsg // live messages above last+1, ascending, no duplicates
}

// heldMsg is a live message held back, with its shared wire form.
type heldMsg struct {
	sequencer.Message
	wire *Wire
}

// Tail is the catch-up state of one stream: per conversation the last seq
// delivered, whether a store read is due, and the live messages held until
// it is answered. Not safe for concurrent use: one stream's loop owns it.
//
// The loop: Reads() (read them, answer Backlog), Live() for every live
// message, Take() the events to send, until Overflow().
type Tail struct {
	convs   map[string]*convTail
	due     []*convTail // conversations that may have a read due, oldest first
	out     []Event
	held    int // live messages held, all conversations
	maxHeld int
	over    bool
}

// NewTail starts a stream at cursors (distinct conversations): every
// conversation begins with a store read. maxHeld bounds the live messages
// the Tail holds back across its conversations (its share of the stream's
// bounded buffer); beyond it, Overflow reports true.
func NewTail(cursors []persist.Cursor, maxHeld int) *Tail {
	t := &Tail{convs: make(map[string]*convTail, len(cursors)), maxHeld: maxHeld}
	for _, c := range cursors {
		ct := &convTail{id: c.ConvID, last: c.AfterSeq}
		t.convs[c.ConvID] = ct
		t.needRead(ct)
	}
	return t
}

// needRead makes a store read of c due.
func (t *Tail) needRead(c *convTail) {
	c.read = true
	if !c.listed {
		c.listed = true
		t.due = append(t.due, c)
	}
}

// Reads returns the cursors whose store read is due (at most max of them),
// and marks them as being read: each must be answered by Backlog (or
// Unread on a failed read).
func (t *Tail) Reads(max int) []persist.Cursor {
	var out []persist.Cursor
	n := 0
	for ; n < len(t.due) && len(out) < max; n++ {
		c := t.due[n]
		c.listed = false
		if c.read && !c.reading {
			c.reading = true
			out = append(out, persist.Cursor{ConvID: c.id, AfterSeq: c.last})
		}
	}
	t.due = t.due[n:]
	return out
}

// Unread gives back reads that failed: they are due again.
func (t *Tail) Unread(cursors []persist.Cursor) {
	for _, cur := range cursors {
		if c := t.convs[cur.ConvID]; c != nil {
			c.reading = false
			t.needRead(c)
		}
	}
}

// Resync makes a store read due for convID (its live source changed: what
// was committed meanwhile may not come live). Unknown conversations are
// ignored.
func (t *Tail) Resync(convID string) {
	if c := t.convs[convID]; c != nil {
		t.needRead(c)
	}
}

// Follows reports whether the stream follows convID.
func (t *Tail) Follows(convID string) bool { _, ok := t.convs[convID]; return ok }

// Live takes live messages of one conversation (ascending, committed). A
// message at or below the last delivered seq is dropped; last+1 goes out
// at once unless a read is due; anything else is held and asks for a read
// (the hole is filled from the store).
func (t *Tail) Live(convID string, msgs []sequencer.Message) { t.LiveShared(convID, msgs, nil) }

// LiveShared is Live with the messages' shared wire forms (wires[i] is
// msgs[i]'s; nil: none), which the events carry.
func (t *Tail) LiveShared(convID string, msgs []sequencer.Message, wires []Wire) {
	c := t.convs[convID]
	if c == nil {
		return
	}
	for i := range msgs {
		m := &msgs[i]
		var w *Wire
		if wires != nil {
			w = &wires[i]
		}
		switch {
		case m.Seq <= c.last:
		case !c.read && m.Seq == c.last+1 && len(c.held) == 0:
			t.emit(c, m, w)
		default:
			t.hold(c, heldMsg{*m, w})
			if !c.read && m.Seq > c.last+1 {
				t.needRead(c) // a hole: fill it from the store
			}
		}
	}
}

func (t *Tail) hold(c *convTail, m heldMsg) {
	i, found := slices.BinarySearchFunc(c.held, m.Seq, func(h heldMsg, seq uint64) int {
		switch {
		case h.Seq < seq:
			return -1
		case h.Seq > seq:
			return 1
		}
		return 0
	})
	if found {
		return
	}
	c.held = slices.Insert(c.held, i, m)
	t.held++
	if t.held > t.maxHeld {
		t.over = true
	}
}

func (t *Tail) emit(c *convTail, m *sequencer.Message, w *Wire) {
	t.out = append(t.out, Event{Kind: KindMessage, Msg: m, Wire: w})
	c.last = m.Seq
}

// Backlog answers a read Reads handed out: page is the store's answer for
// convID (its head and messages above the cursor, ascending). mayBeCut says
// the read's overall message budget ran out, so an empty page proves
// nothing. Messages above last go out in order; a first message above
// last+1, or a head above last with nothing stored after it, means
// retention removed those seqs (a KindTruncated event first). When the
// page reached the head, the held live messages above it follow and the
// conversation is live; otherwise another read is due.
func (t *Tail) Backlog(convID string, page persist.Page, mayBeCut bool) {
	c := t.convs[convID]
	if c == nil {
		return
	}
	c.reading = false
	for i := range page.Messages {
		m := &page.Messages[i]
		if m.Seq <= c.last {
			continue
		}
		if m.Seq > c.last+1 {
			t.out = append(t.out, Event{Kind: KindTruncated, ConvID: c.id, OldestSeq: m.Seq})
		}
		t.emit(c, m, nil)
	}
	head := page.Head
	if len(page.Messages) == 0 && head > c.last {
		if mayBeCut {
			t.needRead(c)
			return
		}
		// Everything after last is gone: the stream continues after the
		// head.
		t.out = append(t.out, Event{Kind: KindTruncated, ConvID: c.id, OldestSeq: head + 1})
		c.last = head
	}
	if c.last < head {
		t.needRead(c) // more backlog
		return
	}
	c.read = false
	t.drain(c)
}

// drain delivers the held messages that follow last; a hole before the
// next one asks for another read.
func (t *Tail) drain(c *convTail) {
	n := 0
	for n < len(c.held) {
		m := c.held[n]
		if m.Seq <= c.last {
			n++
			continue
		}
		if m.Seq != c.last+1 {
			t.needRead(c)
			break
		}
		t.emit(c, &c.held[n].Message, c.held[n].wire)
		n++
	}
	if n > 0 {
		// The emitted events point into the old array: keep it, take a
		// new one for what is left.
		c.held = slices.Clone(c.held[n:])
		t.held -= n
	}
}

// Take returns the events to send, in order, and forgets them.
func (t *Tail) Take() []Event {
	out := t.out
	t.out = nil
	return out
}

// Reuse gives back a slice Take returned, once its events were sent: the
// next events go into its array.
func (t *Tail) Reuse(evs []Event) {
	if t.out == nil {
		clear(evs)
		t.out = evs[:0]
	}
}

// Overflow reports that more live messages arrived than the Tail may hold:
// the stream must end (resource_exhausted) and the subscriber resume.
func (t *Tail) Overflow() bool { return t.over }

// Last returns the last seq delivered in convID (the cursor before any).
func (t *Tail) Last(convID string) uint64 {
	if c := t.convs[convID]; c != nil {
		return c.last
	}
	return 0
}

// ReadDue reports whether a store read is due and not handed out.
func (t *Tail) ReadDue() bool {
	for len(t.due) > 0 {
		if c := t.due[0]; c.read && !c.reading {
			return true
		}
		t.due[0].listed = false
		t.due = t.due[1:]
	}
	return false
}
