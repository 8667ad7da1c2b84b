package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
)

// The event engines (issue 32) measure Edit and Recall (engine_sdkops.go):
// each operation is one Edit or one Recall of a message of the picked
// conversation, as its sender (uid 1). Before the load they seed every
// conversation with eventTargets messages from uid 1. x-edit edits the
// conversation's first message over and over (each edit is a new event
// and a new seq); x-recall recalls the conversation's next message not yet
// recalled, and fails when a conversation ran out of them (keep --messages
// below about eventTargets/2 per conversation). --engines e,x-edit,x-recall
// compares them with a Send (e-sqlite,x-edit-sqlite,x-recall-sqlite on the
// embedded store).
func init() {
	registerOpEngines("x-edit", "Edit, SDK unary", "one Edit of the picked conversation's first message (a new body, as its sender; every conversation seeded with 16 messages first)",
		func(c *client.Client) Engine { return newEventClient(c, false) })
	registerOpEngines("x-recall", "Recall, SDK unary", "one Recall of the picked conversation's next message not yet recalled (as its sender; every conversation seeded with 16 messages first)",
		func(c *client.Client) Engine { return newEventClient(c, true) })
}

// eventTargets is how many messages the event engines seed per
// conversation (the targets of x-recall).
const eventTargets = 16

type eventClient struct {
	c      *client.Client
	recall bool

	mu      sync.Mutex
	targets map[string][]uint64       // conv -> seeded msg_ids, in seq order
	next    map[string]*atomic.Uint32 // conv -> the next target x-recall takes
}

func newEventClient(c *client.Client, recall bool) *eventClient {
	return &eventClient{c: c, recall: recall, targets: map[string][]uint64{}, next: map[string]*atomic.Uint32{}}
}

// Seed stores eventTargets messages from uid 1 in every conversation and
// keeps their msg_ids.
func (e *eventClient) Seed(ctx context.Context, convPfx string, convs, senders int) error {
	return seedMessages(ctx, e.c, convPfx, convs, eventTargets, func(k, i int, msgID uint64) {
		c := convID(convPfx, k)
		e.mu.Lock()
		defer e.mu.Unlock()
		t := e.targets[c]
		if t == nil {
			t = make([]uint64, eventTargets)
			e.targets[c] = t
			e.next[c] = new(atomic.Uint32)
		}
		t[i] = msgID
	})
}

// Send is one operation: an Edit or a Recall of a seeded message of the
// picked conversation, as its sender, with the operation's resend key.
func (e *eventClient) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	e.mu.Lock()
	targets, next := e.targets[req.ConvID], e.next[req.ConvID]
	e.mu.Unlock()
	if targets == nil {
		return sequencer.SendResult{}, fmt.Errorf("%s: conversation %q was not seeded", map[bool]string{false: "x-edit", true: "x-recall"}[e.recall], req.ConvID)
	}
	if !e.recall {
		r, err := e.c.Edit(ctx, client.EditRequest{ConvID: req.ConvID, FromUID: 1, ClientMsgID: req.ClientMsgID, TargetMsgID: targets[0], Body: req.Body})
		return sequencer.SendResult{MsgID: r.MsgID, Seq: r.Seq, ServerAt: r.ServerAt, Duplicate: r.Duplicate}, err
	}
	i := next.Add(1) - 1
	if int(i) >= len(targets) {
		return sequencer.SendResult{}, fmt.Errorf("x-recall: conversation %q has no message left to recall (%d seeded)", req.ConvID, len(targets))
	}
	r, err := e.c.Recall(ctx, client.RecallRequest{ConvID: req.ConvID, FromUID: 1, ClientMsgID: req.ClientMsgID, TargetMsgID: targets[i]})
	return sequencer.SendResult{MsgID: r.MsgID, Seq: r.Seq, ServerAt: r.ServerAt, Duplicate: r.Duplicate}, err
}

func (e *eventClient) Close() error { return e.c.Close() }
