package client_test

import (
	"testing"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
)

// Edit and Recall through the SDK: the events get the next seqs, a retried
// call (same key) is a duplicate, refusals carry their codes, and Pull and
// GetMessage show the target's state.
func TestEditAndRecall(t *testing.T) {
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := ctxT(t)
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}})
	m, err := c.Send(ctx, client.SendRequest{ConvID: "g:ev", FromUID: 7, Body: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	e, err := c.Edit(ctx, client.EditRequest{ConvID: "g:ev", FromUID: 7, TargetMsgID: m.MsgID, Body: []byte("hi!")})
	if err != nil || e.Seq != 2 || e.ClientMsgID == "" {
		t.Fatalf("edit: %+v %v", e, err)
	}
	again, err := c.Edit(ctx, client.EditRequest{ConvID: "g:ev", FromUID: 7, ClientMsgID: e.ClientMsgID, TargetMsgID: m.MsgID, Body: []byte("hi!")})
	if err != nil || !again.Duplicate || again.MsgID != e.MsgID {
		t.Fatalf("edit resent: %+v %v", again, err)
	}
	if _, err := c.Edit(ctx, client.EditRequest{ConvID: "g:ev", FromUID: 8, TargetMsgID: m.MsgID, Body: []byte("x")}); client.ErrorCode(err) != client.CodePermissionDenied {
		t.Fatalf("edit by another user: %v", err)
	}
	if _, err := c.Recall(ctx, client.RecallRequest{ConvID: "g:ev", FromUID: 8, TargetMsgID: m.MsgID, AsModerator: true}); err != nil {
		t.Fatalf("recall as a moderator: %v", err)
	}
	if _, err := c.Recall(ctx, client.RecallRequest{ConvID: "g:ev", FromUID: 7, TargetMsgID: m.MsgID}); client.ErrorCode(err) != client.CodeFailedPrecondition {
		t.Fatalf("second recall: %v", err)
	}
	if _, err := c.Recall(ctx, client.RecallRequest{ConvID: "g:other", FromUID: 7, TargetMsgID: m.MsgID}); client.ErrorCode(err) != client.CodeNotFound {
		t.Fatalf("recall from another conversation: %v", err)
	}
	got, err := c.GetMessage(ctx, m.MsgID)
	if err != nil || !got.Recalled || len(got.Body) != 0 || got.EditCount != 1 || got.EditedAt.IsZero() {
		t.Fatalf("target: %+v %v", got, err)
	}
	page, err := c.Pull(ctx, "g:ev", 0, 10)
	if err != nil || page.HeadSeq != 3 || len(page.Messages) != 3 {
		t.Fatalf("pull: %+v %v", page, err)
	}
	if ev := page.Messages[2]; ev.Kind != sequencer.KindRecall || ev.TargetMsgID != m.MsgID || ev.FromUID != 8 {
		t.Fatalf("recall event: %+v", ev)
	}
}
