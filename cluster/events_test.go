package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
)

// An Edit or Recall sent to a node that does not own the conversation is
// forwarded to the owner like a Send: its kind, target and as_moderator
// travel with it, the owner's writer judges it (a refusal keeps its code
// across the hop), and the event and the target's update land together.
func TestInProcessForwardedEditAndRecall(t *testing.T) {
	_, a, b, ct := countedPair(t, ipOptions{})
	conv := convsOwnedBy(t, a, "b", "ev", 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	m, err := a.cn.Send(ctx, sequencer.SendRequest{ConvID: conv, FromUID: 7, ClientMsgID: "m", MsgType: 1, Body: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	edit, _ := sequencer.NewEditRequest(conv, 7, "e", m.MsgID, []byte("hi!"), false, 0)
	e, err := a.cn.Send(ctx, edit)
	if err != nil || e.Seq != 2 {
		t.Fatalf("forwarded edit: %+v %v", e, err)
	}
	other, _ := sequencer.NewEditRequest(conv, 8, "e8", m.MsgID, []byte("x"), false, 0)
	if _, err := a.cn.Send(ctx, other); sequencer.ErrorCode(err) != sequencer.CodePermissionDenied {
		t.Fatalf("forwarded edit by another user: %v, want permission_denied", err)
	}
	mod, _ := sequencer.NewRecallRequest(conv, 8, "r8", m.MsgID, true)
	r, err := a.cn.Send(ctx, mod)
	if err != nil || r.Seq != 3 {
		t.Fatalf("forwarded recall as a moderator: %+v %v", r, err)
	}
	again, _ := sequencer.NewRecallRequest(conv, 7, "r7", m.MsgID, false)
	if _, err := a.cn.Send(ctx, again); sequencer.ErrorCode(err) != sequencer.CodeFailedPrecondition {
		t.Fatalf("forwarded second recall: %v, want failed_precondition", err)
	}
	if ct.items.Load() < 5 {
		t.Fatalf("%d items forwarded, want the 5 calls", ct.items.Load())
	}
	rows, err := b.store.ReadRange(ctx, conv, 0, 10)
	if err != nil || len(rows) != 3 {
		t.Fatalf("stored rows: %+v %v", rows, err)
	}
	tg, ev, rc := rows[0], rows[1], rows[2]
	if !tg.Recalled || len(tg.Body) != 0 || tg.EditCount != 1 {
		t.Fatalf("target: %+v", tg)
	}
	if ev.Kind != sequencer.KindEdit || ev.TargetMsgID != m.MsgID || !ev.Recalled {
		t.Fatalf("edit event: %+v", ev)
	}
	if rc.Kind != sequencer.KindRecall || rc.TargetMsgID != m.MsgID || rc.FromUID != 8 {
		t.Fatalf("recall event: %+v", rc)
	}
}
