package conv

import (
	"time"

	"github.com/sequencer-im/sequencer"
)

// This file holds the rules of edits and recalls (docs/API.md, "Edit and
// Recall"): which events may change which message. They are pure: the core
// applies them to the target's state as the store holds it, overlaid with
// the events of the batch being formed, so two events of one batch see each
// other (a second recall of one target never commits with the first). An
// event that only an earlier event of its batch refuses waits for the next
// batch: a refusal never rests on an event that may not land.

// Target is what the rules need of an event's target message: its state
// in the conversation's writer.
type Target struct {
	MsgID     uint64
	Found     bool // a stored message of this conversation
	FromUID   uint64
	Kind      sequencer.Kind
	Recalled  bool
	EditCount uint32
	ServerAt  time.Time
}

// TargetOf returns the state of the stored message m.
func TargetOf(m *sequencer.Message) Target {
	return Target{MsgID: m.MsgID, Found: true, FromUID: m.FromUID, Kind: m.Kind,
		Recalled: m.Recalled, EditCount: m.EditCount, ServerAt: m.ServerAt}
}

// Windows are the server's optional limits on how late after a message's
// server_at it may be edited or recalled (--edit-window, --recall-window);
// 0 means no limit.
type Windows struct {
	Edit   time.Duration
	Recall time.Duration
}

// CheckEvent decides whether the event req (Kind Edit or Recall) may change
// t at now: nil, or the error the sender gets (consuming no seq):
//   - not_found: t is not a stored message of the conversation;
//   - failed_precondition: t is itself an edit or recall event, or
//     recalled, or the event comes later than the window after t's
//     server_at;
//   - permission_denied: the event's from_uid is not t's sender and the
//     request does not act as a moderator.
func CheckEvent(req *sequencer.SendRequest, t Target, now time.Time, w Windows) error {
	what := req.Kind.String()
	if !t.Found {
		return sequencer.Errorf(sequencer.CodeNotFound, "%s: target_msg_id %d is not a message of conversation %q", what, req.TargetMsgID, req.ConvID)
	}
	if t.Kind != sequencer.KindMessage {
		return sequencer.Errorf(sequencer.CodeFailedPrecondition, "%s: the target is itself an %s event; only messages can be edited or recalled", what, t.Kind)
	}
	if req.FromUID != t.FromUID && !req.AsModerator {
		return sequencer.Errorf(sequencer.CodePermissionDenied, "%s: from_uid %d is not the sender of the target (a moderator sets as_moderator)", what, req.FromUID)
	}
	if t.Recalled {
		return sequencer.Errorf(sequencer.CodeFailedPrecondition, "%s: the target is recalled", what)
	}
	window := w.Edit
	if req.Kind == sequencer.KindRecall {
		window = w.Recall
	}
	if window > 0 && now.Sub(t.ServerAt) > window {
		return sequencer.Errorf(sequencer.CodeFailedPrecondition, "%s: the target was sent more than the server's %s window ago", what, window)
	}
	return nil
}

// Apply returns t's state after the event req, stored at now (CheckEvent
// allowed it).
func (t Target) Apply(req *sequencer.SendRequest, now time.Time) Target {
	switch req.Kind {
	case sequencer.KindEdit:
		t.EditCount++
	case sequencer.KindRecall:
		t.Recalled = true
	}
	return t
}

// targets remembers the state of up to size messages of the conversation
// as this writer last committed or read them (FIFO, like memo). Only this
// writer changes them, so the cache stays true while the head is known;
// it is dropped whenever the head is in doubt (another writer may have
// been at work). Entries are kept compact (32 bytes): an idle conversation
// holds its last committed message here.
type targets struct {
	ring []cachedTarget
	next int32
	size int32
}

// cachedTarget is a Target in 32 bytes (server_at in unix milliseconds,
// the precision the stores keep).
type cachedTarget struct {
	msgID, fromUID uint64
	atMs           int64
	editCount      uint32
	kind           sequencer.Kind
	found          bool
	recalled       bool
}

func compact(t Target) cachedTarget {
	return cachedTarget{msgID: t.MsgID, fromUID: t.FromUID, atMs: t.ServerAt.UnixMilli(), editCount: t.EditCount,
		kind: t.Kind, found: t.Found, recalled: t.Recalled}
}

func (c cachedTarget) target() Target {
	t := Target{MsgID: c.msgID, Found: c.found, FromUID: c.fromUID, Kind: c.kind, Recalled: c.recalled, EditCount: c.editCount}
	if c.found {
		t.ServerAt = time.UnixMilli(c.atMs).UTC()
	}
	return t
}

func (c *targets) get(id uint64) (Target, bool) {
	for i := len(c.ring) - 1; i >= 0; i-- {
		if c.ring[i].msgID == id {
			return c.ring[i].target(), true
		}
	}
	return Target{}, false
}

// put remembers t, replacing what was known of its msg_id.
func (c *targets) put(t Target) {
	for i := range c.ring {
		if c.ring[i].msgID == t.MsgID {
			c.ring[i] = compact(t)
			return
		}
	}
	c.add(t)
}

// add remembers a message known not to be cached (one just committed).
func (c *targets) add(t Target) {
	if len(c.ring) < int(c.size) {
		c.ring = append(c.ring, compact(t))
		return
	}
	c.ring[c.next] = compact(t)
	c.next = (c.next + 1) % int32(len(c.ring))
}

func (c *targets) clear() {
	c.ring, c.next = nil, 0
}
