package actor

import (
	"context"
	"sync"
	"testing"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/faulty"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

func editReq(conv, key string, from, target uint64, body string) sequencer.SendRequest {
	r, err := sequencer.NewEditRequest(conv, from, key, target, []byte(body), false, 0)
	if err != nil {
		panic(err)
	}
	return r
}

func recallReq(conv, key string, from, target uint64) sequencer.SendRequest {
	r, err := sequencer.NewRecallRequest(conv, from, key, target, false)
	if err != nil {
		panic(err)
	}
	return r
}

// An edit or recall whose commit's answer is lost (the store crashed
// between the commit and its answer) is answered only after the writer
// re-read the truth: landed, with its seq and the target updated once; or
// not landed, with nothing written (neither the event nor the update), and
// its resend then lands once.
func TestEventOutcomeUnknown(t *testing.T) {
	inner := memstore.New()
	fs := faulty.New(inner, 1, faulty.Rates{})
	n := newNode(t, Config{Store: fs})
	ctx := context.Background()
	m, err := n.Send(ctx, req("g:1", "m"))
	if err != nil {
		t.Fatal(err)
	}

	fs.Inject(faulty.OpCommit, faulty.CommitThenFail)
	e, err := n.Send(ctx, editReq("g:1", "e", 1, m.MsgID, "new"))
	if err != nil || e.Seq != 2 || e.Duplicate {
		t.Fatalf("edit whose answer was lost: %+v %v", e, err)
	}
	if tg, _ := inner.GetMessage(ctx, m.MsgID); tg.EditCount != 1 || string(tg.Body) != "new" {
		t.Fatalf("target after the edit: %+v", tg)
	}

	fs.Inject(faulty.OpCommit, faulty.Drop)
	if _, err := n.Send(ctx, recallReq("g:1", "r", 1, m.MsgID)); sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
		t.Fatalf("recall whose commit was dropped: %v, want unavailable", err)
	}
	if h, _ := inner.LoadHead(ctx, "g:1"); h != 2 {
		t.Fatalf("head %d after a dropped recall, want 2", h)
	}
	if tg, _ := inner.GetMessage(ctx, m.MsgID); tg.Recalled || string(tg.Body) != "new" {
		t.Fatalf("target changed by a recall that did not land: %+v", tg)
	}

	fs.Inject(faulty.OpCommit, faulty.LandLate)
	r, err := n.Send(ctx, recallReq("g:1", "r", 1, m.MsgID))
	if err != nil || r.Seq != 3 {
		t.Fatalf("resent recall that lands late: %+v %v", r, err)
	}
	again, err := n.Send(ctx, recallReq("g:1", "r", 1, m.MsgID))
	if err != nil || again.Seq != 3 || !again.Duplicate {
		t.Fatalf("resend of the stored recall: %+v %v", again, err)
	}
	fs.WaitLate()
	if tg, _ := inner.GetMessage(ctx, m.MsgID); !tg.Recalled || len(tg.Body) != 0 || tg.EditCount != 1 {
		t.Fatalf("target after the recall: %+v", tg)
	}
	rows, _ := inner.ReadRange(ctx, "g:1", 0, 10)
	if len(rows) != 3 || rows[1].Kind != sequencer.KindEdit || rows[2].Kind != sequencer.KindRecall || rows[2].TargetMsgID != m.MsgID {
		t.Fatalf("stored rows: %+v", rows)
	}
}

// holdStore holds every Commit while its lock is taken.
type holdStore struct {
	*memstore.Store
	hold sync.RWMutex
}

func (s *holdStore) Commit(ctx context.Context, bs []persist.ConvBatch) error {
	s.hold.RLock()
	defer s.hold.RUnlock()
	return s.Store.Commit(ctx, bs)
}

// Two recalls of one message that wait for the same batch: the second
// waits for the first's outcome and is then judged against it; exactly
// one commits.
func TestTwoRecallsInOneBatch(t *testing.T) {
	st := &holdStore{Store: memstore.New()}
	n := newNode(t, Config{Store: st})
	ctx := context.Background()
	m, err := n.Send(ctx, req("g:1", "m"))
	if err != nil {
		t.Fatal(err)
	}
	st.hold.Lock()
	filler := sendAsync(n, ctx, req("g:1", "f"))
	waitFor(t, "the filler's commit is held", func() bool { return n.pending.Load() == 1 })
	r1 := sendAsync(n, ctx, recallReq("g:1", "r1", 1, m.MsgID))
	r2 := sendAsync(n, ctx, recallReq("g:1", "r2", 1, m.MsgID))
	waitFor(t, "both recalls are queued", func() bool { return n.pending.Load() == 3 })
	st.hold.Unlock()
	if a := <-filler; a.err != nil || a.res.Seq != 2 {
		t.Fatalf("filler: %+v", a)
	}
	a1, a2 := <-r1, <-r2
	if a1.err != nil {
		a1, a2 = a2, a1 // (the two race to the mailbox)
	}
	if a1.err != nil || a1.res.Seq != 3 {
		t.Fatalf("first recall: %+v %v", a1, a1.err)
	}
	if sequencer.ErrorCode(a2.err) != sequencer.CodeFailedPrecondition {
		t.Fatalf("second recall: %+v %v, want failed_precondition", a2, a2.err)
	}
	if h, _ := st.LoadHead(ctx, "g:1"); h != 3 {
		t.Fatalf("head %d, want 3 (the refused recall consumed no seq)", h)
	}
}
