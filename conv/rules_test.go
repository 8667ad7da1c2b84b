package conv_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/conv"
)

func TestCheckEvent(t *testing.T) {
	sent := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	msg := conv.Target{MsgID: 9, Found: true, FromUID: 7, ServerAt: sent}
	edit := sequencer.SendRequest{ConvID: "c", FromUID: 7, Kind: sequencer.KindEdit, TargetMsgID: 9}
	recall := edit
	recall.Kind = sequencer.KindRecall
	other := edit
	other.FromUID = 8
	mod := other
	mod.AsModerator = true
	recalled := msg
	recalled.Recalled = true
	event := msg
	event.Kind = sequencer.KindEdit
	w := conv.Windows{Edit: time.Minute, Recall: time.Hour}
	for _, tc := range []struct {
		name string
		req  sequencer.SendRequest
		t    conv.Target
		at   time.Duration // after sent
		w    conv.Windows
		want sequencer.Code
	}{
		{"edit by sender", edit, msg, time.Hour, conv.Windows{}, sequencer.CodeOK},
		{"recall by sender", recall, msg, time.Hour, conv.Windows{}, sequencer.CodeOK},
		{"not found", edit, conv.Target{MsgID: 9}, 0, conv.Windows{}, sequencer.CodeNotFound},
		{"not found beats permission", other, conv.Target{MsgID: 9}, 0, conv.Windows{}, sequencer.CodeNotFound},
		{"another user", other, msg, 0, conv.Windows{}, sequencer.CodePermissionDenied},
		{"another user as moderator", mod, msg, 0, conv.Windows{}, sequencer.CodeOK},
		{"edit of a recalled message", edit, recalled, 0, conv.Windows{}, sequencer.CodeFailedPrecondition},
		{"recall of a recalled message", recall, recalled, 0, conv.Windows{}, sequencer.CodeFailedPrecondition},
		{"moderator and recalled", mod, recalled, 0, conv.Windows{}, sequencer.CodeFailedPrecondition},
		{"target is an event", edit, event, 0, conv.Windows{}, sequencer.CodeFailedPrecondition},
		{"edit inside its window", edit, msg, time.Minute, w, sequencer.CodeOK},
		{"edit past its window", edit, msg, time.Minute + time.Millisecond, w, sequencer.CodeFailedPrecondition},
		{"recall inside its window", recall, msg, time.Hour, w, sequencer.CodeOK},
		{"recall past its window", recall, msg, time.Hour + time.Millisecond, w, sequencer.CodeFailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := conv.CheckEvent(&tc.req, tc.t, sent.Add(tc.at), tc.w)
			if got := sequencer.ErrorCode(err); got != tc.want {
				t.Fatalf("CheckEvent = %v (%v), want %v", got, err, tc.want)
			}
		})
	}
}

func TestTargetApply(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	msg := conv.Target{MsgID: 9, Found: true, FromUID: 7}
	e := msg.Apply(&sequencer.SendRequest{Kind: sequencer.KindEdit}, now)
	e = e.Apply(&sequencer.SendRequest{Kind: sequencer.KindEdit}, now)
	if e.EditCount != 2 || e.Recalled {
		t.Fatalf("after two edits: %+v", e)
	}
	r := e.Apply(&sequencer.SendRequest{Kind: sequencer.KindRecall}, now)
	if !r.Recalled || r.EditCount != 2 {
		t.Fatalf("after a recall: %+v", r)
	}
}

// eventStore is a map standing in for the store of a core driven by
// runCore: rows by msg_id, with the target updates of edits and recalls
// applied at commit, like the real stores do in the same transaction.
type eventStore struct {
	head  uint64
	rows  map[uint64]sequencer.Message
	reads int // target reads (Ready.Targets msg_ids)
	// unedited is RecallsOfUnedited of every commit with a recall; when
	// set, the recalls' edit events keep their bodies, as a store that
	// trusts the flag leaves them (so a wrong flag shows in the rows).
	unedited []bool
}

func newEventStore() *eventStore { return &eventStore{rows: map[uint64]sequencer.Message{}} }

func (s *eventStore) commit(b *sequencer.ConvBatch) {
	for _, m := range b.Messages {
		s.rows[m.MsgID] = m
		if t, ok := s.rows[m.TargetMsgID]; ok {
			switch m.Kind {
			case sequencer.KindEdit:
				t.Body, t.EditCount, t.EditedAt = m.Body, t.EditCount+1, m.ServerAt
			case sequencer.KindRecall:
				t.Body, t.Recalled = nil, true
				if !b.RecallsOfUnedited {
					for id, e := range s.rows {
						if e.Kind == sequencer.KindEdit && e.TargetMsgID == t.MsgID {
							e.Body, e.Recalled = nil, true
							s.rows[id] = e
						}
					}
				}
			}
			s.rows[t.MsgID] = t
		}
	}
	if slices.ContainsFunc(b.Messages, func(m sequencer.Message) bool { return m.Kind == sequencer.KindRecall }) {
		s.unedited = append(s.unedited, b.RecallsOfUnedited)
	}
	s.head = b.LastSeq()
}

// editsKeptOf returns the edit events of target that still hold a body.
func (s *eventStore) editsKeptOf(target uint64) []uint64 {
	var out []uint64
	for id, e := range s.rows {
		if e.Kind == sequencer.KindEdit && e.TargetMsgID == target && len(e.Body) > 0 {
			out = append(out, id)
		}
	}
	return out
}

type answer struct {
	res sequencer.SendResult
	err error
}

// runCore carries out the core's Ready against s until it is idle and
// returns the replies by token.
func runCore(t *testing.T, c *conv.Core, s *eventStore, ids *counter, now time.Time) map[any]answer {
	t.Helper()
	out := map[any]answer{}
	for range 100 {
		rd := c.Ready()
		if testing.Verbose() {
			t.Logf("ready: load %v targets %v form %d commit %v lookup %v replies %d", rd.LoadHead, rd.Targets, rd.Form, rd.Commit != nil, rd.Lookup, len(rd.Replies))
		}
		for _, r := range rd.Replies {
			out[r.Token] = answer{r.Result, r.Err}
		}
		switch {
		case rd.LoadHead:
			c.HeadLoaded(s.head, nil)
		case len(rd.Targets) > 0:
			var res []conv.TargetResult
			for _, id := range rd.Targets {
				s.reads++
				m, ok := s.rows[id]
				r := conv.TargetResult{MsgID: id, Msg: m}
				if !ok {
					r.Err = sequencer.ErrNotFound
				}
				res = append(res, r)
			}
			c.TargetsLoaded(res)
		case rd.Form > 0:
			f := conv.Formation{Now: now}
			for range rd.Form {
				id, _ := ids.NextID()
				f.IDs = append(f.IDs, id)
			}
			c.Formed(f)
		case rd.Commit != nil:
			s.commit(rd.Commit)
			c.Committed(nil)
		case len(rd.Lookup) > 0:
			var res []conv.LookupResult
			for _, k := range rd.Lookup {
				r := conv.LookupResult{Key: k, Err: sequencer.ErrNotFound}
				for _, m := range s.rows {
					if m.Key() == k {
						r.Msg, r.Err = m, nil
					}
				}
				res = append(res, r)
			}
			c.LookedUp(res)
		case rd.Empty():
			return out
		}
	}
	t.Fatal("the core did not settle")
	return nil
}

func eventReq(kind sequencer.Kind, from uint64, key string, target uint64, body string) sequencer.SendRequest {
	return sequencer.SendRequest{ConvID: "c1", FromUID: from, ClientMsgID: key, MsgType: 1,
		Kind: kind, TargetMsgID: target, Body: []byte(body)}
}

// TestCoreEvents drives edits and recalls through the core: the rules are
// applied against the stored target and against the events before them in
// the same batch; refused events consume no seq; a resend of a stored event
// is a duplicate even once its target refuses it.
func TestCoreEvents(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newEventStore()
	ids := &counter{}
	c, err := conv.New(conv.Config{ConvID: "c1", MemoSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	s.rows[500] = sequencer.Message{MsgID: 500, ConvID: "other", Seq: 1, FromUID: 7, ClientMsgID: "x"}

	c.Send("m1", eventReq(0, 7, "m1", 0, "hello"))
	got := runCore(t, c, s, ids, now)
	m1 := got["m1"].res.MsgID
	if got["m1"].err != nil || got["m1"].res.Seq != 1 {
		t.Fatalf("send: %+v", got["m1"])
	}

	// One batch: an edit by the sender, an edit by another user, the
	// same as a moderator, two recalls, an edit after them, and a recall
	// of a message of another conversation.
	c.Send("e1", eventReq(sequencer.KindEdit, 7, "e1", m1, "hello!"))
	c.Send("e2", eventReq(sequencer.KindEdit, 8, "e2", m1, "spam"))
	mod := eventReq(sequencer.KindEdit, 8, "e3", m1, "[moderated]")
	mod.AsModerator = true
	c.Send("e3", mod)
	c.Send("r1", eventReq(sequencer.KindRecall, 7, "r1", m1, ""))
	c.Send("r2", eventReq(sequencer.KindRecall, 7, "r2", m1, ""))
	c.Send("e4", eventReq(sequencer.KindEdit, 7, "e4", m1, "late"))
	c.Send("r3", eventReq(sequencer.KindRecall, 7, "r3", 500, ""))
	c.Send("r4", eventReq(sequencer.KindRecall, 7, "r4", 12345, ""))
	got = runCore(t, c, s, ids, now)
	want := map[string]sequencer.Code{
		"e1": sequencer.CodeOK, "e2": sequencer.CodePermissionDenied, "e3": sequencer.CodeOK,
		"r1": sequencer.CodeOK, "r2": sequencer.CodeFailedPrecondition, "e4": sequencer.CodeFailedPrecondition,
		"r3": sequencer.CodeNotFound, "r4": sequencer.CodeNotFound,
	}
	for tok, code := range want {
		if c := sequencer.ErrorCode(got[tok].err); c != code {
			t.Errorf("%s: %v (%v), want %v", tok, c, got[tok].err, code)
		}
	}
	// The accepted events got seqs 2, 3, 4 in arrival order, nothing else.
	for tok, seq := range map[string]uint64{"e1": 2, "e3": 3, "r1": 4} {
		if got[tok].res.Seq != seq {
			t.Errorf("%s: seq %d, want %d", tok, got[tok].res.Seq, seq)
		}
	}
	if s.head != 4 {
		t.Fatalf("head %d, want 4 (refused events consume no seq)", s.head)
	}
	if tg := s.rows[m1]; !tg.Recalled || tg.EditCount != 2 || len(tg.Body) != 0 {
		t.Fatalf("target after the batch: %+v", tg)
	}
	ev := s.rows[got["e1"].res.MsgID]
	if ev.Kind != sequencer.KindEdit || ev.TargetMsgID != m1 || ev.Seq != 2 || !ev.Recalled {
		t.Fatalf("edit event: %+v", ev)
	}
	// The recall follows edits of its target in its batch: the commit
	// does not call it a recall of an unedited message.
	if kept := s.editsKeptOf(m1); len(kept) > 0 || !slices.Equal(s.unedited, []bool{false}) {
		t.Fatalf("edit events still holding a body: %v; RecallsOfUnedited of the commits with recalls: %v", kept, s.unedited)
	}

	// The resend of e1 (memo holds only the last key) is found by its key:
	// a duplicate, although its target is recalled now.
	reads := s.reads
	c.Send("e1 again", eventReq(sequencer.KindEdit, 7, "e1", m1, "hello!"))
	c.Send("r1 other content", eventReq(sequencer.KindRecall, 7, "r1", 99, ""))
	got = runCore(t, c, s, ids, now)
	if a := got["e1 again"]; a.err != nil || !a.res.Duplicate || a.res.Seq != 2 {
		t.Fatalf("resend of a stored edit: %+v", a)
	}
	if c := sequencer.ErrorCode(got["r1 other content"].err); c != sequencer.CodeAlreadyExists {
		t.Fatalf("same key, other target: %v", c)
	}
	if s.reads != reads {
		// m1 is known from the writer's own commits; r1's key is in the
		// memo (its content differs: no target is read).
		t.Fatalf("%d target reads, want 0", s.reads-reads)
	}
	if s.head != 4 {
		t.Fatalf("head %d, want 4", s.head)
	}
}

// TestCoreEventAfterOwnSend: the writer knows what it committed last; an
// event on a message it just stored needs no read of the target.
func TestCoreEventAfterOwnSend(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newEventStore()
	ids := &counter{}
	c, _ := conv.New(conv.Config{ConvID: "c1", Windows: conv.Windows{Recall: time.Minute}})
	c.Send("m", eventReq(0, 7, "m", 0, "hi"))
	m := runCore(t, c, s, ids, now)["m"].res.MsgID
	c.Send("e", eventReq(sequencer.KindEdit, 7, "e", m, "hi!"))
	if a := runCore(t, c, s, ids, now)["e"]; a.err != nil || a.res.Seq != 2 {
		t.Fatalf("edit: %+v", a)
	}
	c.Send("r", eventReq(sequencer.KindRecall, 7, "r", m, ""))
	if a := runCore(t, c, s, ids, now.Add(time.Minute+time.Millisecond))["r"]; sequencer.ErrorCode(a.err) != sequencer.CodeFailedPrecondition {
		t.Fatalf("recall past the window: %+v", a)
	}
	if s.reads != 0 {
		t.Fatalf("%d target reads, want 0", s.reads)
	}
	c.Send("m2", eventReq(0, 7, "m2", 0, "yo"))
	m2 := runCore(t, c, s, ids, now)["m2"].res.MsgID
	c.Send("r2", eventReq(sequencer.KindRecall, 7, "r2", m2, ""))
	if a := runCore(t, c, s, ids, now)["r2"]; a.err != nil {
		t.Fatalf("recall of a message just sent: %+v", a)
	}
	if s.reads != 0 {
		t.Fatalf("%d target reads, want still 0", s.reads)
	}
	if tg := s.rows[m]; tg.EditCount != 1 || string(tg.Body) != "hi!" || !tg.EditedAt.Equal(now) {
		t.Fatalf("target: %+v", tg)
	}
}

// TestCoreRecallsOfUnedited: a commit says RecallsOfUnedited exactly when
// none of its recalls' targets has edits, by the writer's knowledge of each
// target (its own commits, or the target read from the store), so a store
// may skip clearing edit events only where there are none.
func TestCoreRecallsOfUnedited(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newEventStore()
	ids := &counter{}
	c, _ := conv.New(conv.Config{ConvID: "c1"})
	for _, k := range []string{"a", "b", "c"} {
		c.Send(k, eventReq(0, 7, k, 0, k))
	}
	sent := runCore(t, c, s, ids, now)
	a, b, cc := sent["a"].res.MsgID, sent["b"].res.MsgID, sent["c"].res.MsgID

	c.Send("edit a", eventReq(sequencer.KindEdit, 7, "edit a", a, "a!"))
	runCore(t, c, s, ids, now)
	c.Send("recall b", eventReq(sequencer.KindRecall, 7, "recall b", b, "")) // never edited
	runCore(t, c, s, ids, now)
	c.Send("recall a", eventReq(sequencer.KindRecall, 7, "recall a", a, "")) // edited in an earlier commit
	runCore(t, c, s, ids, now)
	if !slices.Equal(s.unedited, []bool{true, false}) {
		t.Fatalf("RecallsOfUnedited of the recall commits: %v, want [true false]", s.unedited)
	}

	// A new writer (another owner) knows c's state only from the store.
	s.unedited = nil
	c2, _ := conv.New(conv.Config{ConvID: "c1"})
	c2.Send("edit c", eventReq(sequencer.KindEdit, 7, "edit c", cc, "c!"))
	runCore(t, c2, s, ids, now)
	c3, _ := conv.New(conv.Config{ConvID: "c1"})
	c3.Send("recall c", eventReq(sequencer.KindRecall, 7, "recall c", cc, ""))
	if r := runCore(t, c3, s, ids, now)["recall c"]; r.err != nil {
		t.Fatalf("recall c: %v", r.err)
	}
	if !slices.Equal(s.unedited, []bool{false}) || s.reads == 0 {
		t.Fatalf("RecallsOfUnedited %v after %d target reads, want [false] after a read", s.unedited, s.reads)
	}
	for _, id := range []uint64{a, b, cc} {
		if kept := s.editsKeptOf(id); len(kept) > 0 || !s.rows[id].Recalled {
			t.Fatalf("target %d: recalled %v, edit events still holding a body %v", id, s.rows[id].Recalled, kept)
		}
	}
}
