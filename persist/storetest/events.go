package storetest

import (
	"math"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// The store's part of edits and recalls (persist/events.go): an event row
// and its target's update, in one transaction.
var eventCases = []struct {
	name string
	fn   func(x *suite)
}{
	{"EditAndRecall", testEditAndRecall},
	{"EditsAndRecallOfOneTargetInOneBatch", testEventsOnOneTarget},
	{"EventTargetsOwnConversationOnly", testEventOwnConversation},
	{"EventAndTargetAllOrNothing", testEventAllOrNothing},
	{"EventsTrimmedLikeMessages", testEventsTrimmed},
	{"RecallOfUneditedTargets", testRecallOfUnedited},
	{"GetMessagesReadsTargetsTogether", testGetMessages},
}

// event builds conv's event of kind at seq changing target.
func event(conv string, seq uint64, kind sequencer.Kind, target sequencer.Message, body string, at time.Time) sequencer.Message {
	m := msg(conv, seq)
	m.Kind, m.TargetMsgID, m.FromUID, m.ServerAt = kind, target.MsgID, target.FromUID, at
	m.Body = []byte(body)
	return m
}

func (x *suite) get(id uint64) sequencer.Message {
	x.t.Helper()
	m, err := x.s.GetMessage(x.ctx, id)
	if err != nil {
		x.t.Fatalf("GetMessage(%d): %v", id, err)
	}
	return m
}

func testEditAndRecall(x *suite) {
	c := x.conv()
	b := batch(c, 0, 2)
	x.mustCommit(b)
	m1, m2 := b.Messages[0], b.Messages[1]
	t1 := serverAt.Add(time.Minute)
	t2 := serverAt.Add(2 * time.Minute)
	e1 := event(c, 3, sequencer.KindEdit, m1, "edited once", t1)
	x.mustCommit(persist.ConvBatch{ConvID: c, PrevHead: 2, Messages: []sequencer.Message{e1}})
	got := x.get(m1.MsgID)
	want := m1
	want.Body, want.EditCount, want.EditedAt = []byte("edited once"), 1, t1
	sameMessage(x.t, got, want)
	sameMessage(x.t, x.get(e1.MsgID), e1)

	// Two edits in one batch, and a message after them.
	e2 := event(c, 4, sequencer.KindEdit, m1, "edited twice", t2)
	e3 := event(c, 5, sequencer.KindEdit, m2, "", t2)
	m6 := msg(c, 6)
	x.mustCommit(persist.ConvBatch{ConvID: c, PrevHead: 3, Messages: []sequencer.Message{e2, e3, m6}})
	want.Body, want.EditCount, want.EditedAt = []byte("edited twice"), 2, t2
	sameMessage(x.t, x.get(m1.MsgID), want)
	want2 := m2
	want2.Body, want2.EditCount, want2.EditedAt = []byte{}, 1, t2
	sameMessage(x.t, x.get(m2.MsgID), want2)

	// A recall: the target and its edit events lose their bodies for good.
	r := event(c, 7, sequencer.KindRecall, m1, "", t2)
	x.mustCommit(persist.ConvBatch{ConvID: c, PrevHead: 6, Messages: []sequencer.Message{r}})
	want.Body, want.Recalled = []byte{}, true
	e1.Body, e1.Recalled = []byte{}, true
	e2.Body, e2.Recalled = []byte{}, true
	x.expectStored(c, 7, []sequencer.Message{want, want2, e1, e2, e3, m6, r})
}

// Events on one target in one batch leave it as the events in seq order
// would: two edits count twice and leave the last body and time; a recall
// after them empties the target and both edit events, stored in the same
// transaction.
func testEventsOnOneTarget(x *suite) {
	c := x.conv()
	b := batch(c, 0, 2)
	x.mustCommit(b)
	m1, m2 := b.Messages[0], b.Messages[1]
	t1, t2 := serverAt.Add(time.Minute), serverAt.Add(2*time.Minute)
	e3 := event(c, 3, sequencer.KindEdit, m1, "first", t1)
	e4 := event(c, 4, sequencer.KindEdit, m2, "other", t1)
	e5 := event(c, 5, sequencer.KindEdit, m1, "second", t2)
	x.mustCommit(persist.ConvBatch{ConvID: c, PrevHead: 2, Messages: []sequencer.Message{e3, e4, e5}})
	want1 := m1
	want1.Body, want1.EditCount, want1.EditedAt = []byte("second"), 2, t2
	want2 := m2
	want2.Body, want2.EditCount, want2.EditedAt = []byte("other"), 1, t1
	sameMessage(x.t, x.get(m1.MsgID), want1)
	sameMessage(x.t, x.get(m2.MsgID), want2)

	// Two edits and a recall of m2, and an edit of m1, in one batch.
	e6 := event(c, 6, sequencer.KindEdit, m2, "again", t1)
	e7 := event(c, 7, sequencer.KindEdit, m1, "third", t2)
	e8 := event(c, 8, sequencer.KindEdit, m2, "and again", t2)
	r9 := event(c, 9, sequencer.KindRecall, m2, "", t2)
	x.mustCommit(persist.ConvBatch{ConvID: c, PrevHead: 5, Messages: []sequencer.Message{e6, e7, e8, r9}})
	want1.Body, want1.EditCount = []byte("third"), 3
	want2.Body, want2.EditCount, want2.EditedAt, want2.Recalled = []byte{}, 3, t2, true
	for _, e := range []*sequencer.Message{&e4, &e6, &e8} {
		e.Body, e.Recalled = []byte{}, true
	}
	x.expectStored(c, 9, []sequencer.Message{want1, want2, e3, e4, e5, e6, e7, e8, r9})
}

// An event names its target by msg_id; the store updates that msg_id in
// the event's conversation only.
func testEventOwnConversation(x *suite) {
	a, b := x.conv(), x.conv()
	ba := batch(a, 0, 1)
	x.mustCommit(ba)
	m := ba.Messages[0]
	ed := event(b, 1, sequencer.KindEdit, m, "hijack", serverAt)
	ev := event(b, 2, sequencer.KindRecall, m, "", serverAt)
	x.mustCommit(persist.ConvBatch{ConvID: b, Messages: []sequencer.Message{ed, ev}})
	sameMessage(x.t, x.get(m.MsgID), m)
	x.expectStored(a, 1, []sequencer.Message{m})
	if h := x.head(b); h != 2 {
		x.t.Fatalf("head of %q = %d, want 2", b, h)
	}
}

// A commit that fails writes neither an event nor its target's update: the
// event is in a multi-conversation commit whose other conversation hits a
// unique key after the event's row and update were staged.
func testEventAllOrNothing(x *suite) {
	a, b := x.conv(), x.conv()
	ba, bb := batch(a, 0, 1), batch(b, 0, 1)
	x.mustCommit(ba, bb)
	m := ba.Messages[0]
	r := event(a, 2, sequencer.KindRecall, m, "", serverAt)
	e := event(a, 3, sequencer.KindEdit, m, "x", serverAt) // (a store does not judge: it writes)
	clash := msg(b, 2)
	clash.MsgID = bb.Messages[0].MsgID
	err := x.commitFails(persist.ConvBatch{ConvID: a, PrevHead: 1, Messages: []sequencer.Message{r, e}},
		persist.ConvBatch{ConvID: b, PrevHead: 1, Messages: []sequencer.Message{clash}})
	hasConflict(x.t, conflictOf(x.t, err), persist.KeyMsgID, clash)
	x.expectStored(a, 1, []sequencer.Message{m})
	x.expectStored(b, 1, bb.Messages)
	// The same events alone land, with their update.
	x.mustCommit(persist.ConvBatch{ConvID: a, PrevHead: 1, Messages: []sequencer.Message{r}})
	m.Body, m.Recalled = []byte{}, true
	x.expectStored(a, 2, []sequencer.Message{m, r})
}

// Retention trims events like any message; the head stays.
func testEventsTrimmed(x *suite) {
	c := x.conv()
	b := batch(c, 0, 2)
	x.mustCommit(b)
	e := event(c, 3, sequencer.KindEdit, b.Messages[1], "new", serverAt)
	x.mustCommit(persist.ConvBatch{ConvID: c, PrevHead: 2, Messages: []sequencer.Message{e}})
	if err := x.s.Trim(x.ctx, c, 3); err != nil {
		x.t.Fatalf("Trim: %v", err)
	}
	x.expectStored(c, 3, nil)
	// An event whose target is gone still lands (there is nothing to update).
	r := event(c, 4, sequencer.KindRecall, b.Messages[0], "", serverAt)
	x.mustCommit(persist.ConvBatch{ConvID: c, PrevHead: 3, Messages: []sequencer.Message{r}})
	x.expectStored(c, 4, []sequencer.Message{r})
}

// A batch whose writer knows its recalls' targets unedited
// (RecallsOfUnedited) recalls them as any other: target emptied and marked.
// In the same commit, another conversation's batch without the flag
// recalls an edited target, whose edit events still lose their bodies.
func testRecallOfUnedited(x *suite) {
	a, b := x.conv(), x.conv()
	ba, bb := batch(a, 0, 2), batch(b, 0, 1)
	x.mustCommit(ba, bb)
	t1 := serverAt.Add(time.Minute)
	eb := event(b, 2, sequencer.KindEdit, bb.Messages[0], "edited", t1)
	x.mustCommit(persist.ConvBatch{ConvID: b, PrevHead: 1, Messages: []sequencer.Message{eb}})

	ra := event(a, 3, sequencer.KindRecall, ba.Messages[0], "", t1)
	rb := event(b, 3, sequencer.KindRecall, bb.Messages[0], "", t1)
	x.mustCommit(persist.ConvBatch{ConvID: a, PrevHead: 2, Messages: []sequencer.Message{ra}, RecallsOfUnedited: true},
		persist.ConvBatch{ConvID: b, PrevHead: 2, Messages: []sequencer.Message{rb}})
	wantA := ba.Messages[0]
	wantA.Body, wantA.Recalled = []byte{}, true
	x.expectStored(a, 3, []sequencer.Message{wantA, ba.Messages[1], ra})
	wantB := bb.Messages[0]
	wantB.Body, wantB.Recalled, wantB.EditCount, wantB.EditedAt = []byte{}, true, 1, t1
	eb.Body, eb.Recalled = []byte{}, true
	x.expectStored(b, 3, []sequencer.Message{wantB, eb, rb})
}

// testGetMessages: a store with persist.MessagesGetter answers many msg_ids
// of several conversations in one call exactly as GetMessage answers each
// (an edited and a recalled target in their current state), leaving out the
// ids it does not hold.
func testGetMessages(x *suite) {
	g, ok := x.s.(persist.MessagesGetter)
	if !ok {
		x.t.Skip("the store has no persist.MessagesGetter (it reads in process; the actors read one message at a time)")
	}
	a, b := x.conv(), x.conv()
	ba, bb := batch(a, 0, 3), batch(b, 0, 2)
	x.mustCommit(ba, bb)
	at := serverAt.Add(time.Minute)
	edit := event(a, 4, sequencer.KindEdit, ba.Messages[0], "edited", at)
	recall := event(a, 5, sequencer.KindRecall, ba.Messages[1], "", at)
	x.mustCommit(persist.ConvBatch{ConvID: a, PrevHead: 3, Messages: []sequencer.Message{edit, recall}})

	ids := []uint64{bb.Messages[1].MsgID, ba.Messages[0].MsgID, 12345, ba.Messages[1].MsgID, math.MaxUint64,
		edit.MsgID, ba.Messages[2].MsgID, bb.Messages[0].MsgID, recall.MsgID}
	got, err := g.GetMessages(x.ctx, ids)
	if err != nil {
		x.t.Fatalf("GetMessages: %v", err)
	}
	byID := map[uint64]sequencer.Message{}
	for _, m := range got {
		if _, dup := byID[m.MsgID]; dup {
			x.t.Fatalf("GetMessages answered msg_id %d twice", m.MsgID)
		}
		byID[m.MsgID] = m
	}
	if len(got) != 7 {
		x.t.Fatalf("GetMessages of 7 stored and 2 unknown ids = %d messages, want 7", len(got))
	}
	for _, id := range ids {
		m, ok := byID[id]
		if id == 12345 || id == math.MaxUint64 {
			if ok {
				x.t.Fatalf("GetMessages answered the unknown msg_id %d", id)
			}
			continue
		}
		if !ok {
			x.t.Fatalf("GetMessages left out the stored msg_id %d", id)
		}
		sameMessage(x.t, m, x.get(id))
	}
	if m := byID[ba.Messages[0].MsgID]; string(m.Body) != "edited" || m.EditCount != 1 {
		x.t.Fatalf("the edited target read as body %q, edit_count %d", m.Body, m.EditCount)
	}
	if m := byID[ba.Messages[1].MsgID]; !m.Recalled || len(m.Body) != 0 {
		x.t.Fatalf("the recalled target read as recalled=%v, body %q", m.Recalled, m.Body)
	}
	if got, err := g.GetMessages(x.ctx, nil); err != nil || len(got) != 0 {
		x.t.Fatalf("GetMessages(none) = %d messages, %v", len(got), err)
	}
}
