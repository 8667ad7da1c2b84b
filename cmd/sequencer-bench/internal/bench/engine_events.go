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
// conversation's last seeded message over and over (each edit is a new
// event and a new seq; the message stays in its writer's memory, see
// recentTargets); x-recall recalls the conversation's next message not yet
// recalled (recallOrder), and fails when a conversation ran out of them
// (keep --messages below about eventTargets/2 per conversation). x-send is their baseline:
// the same seeding, then one Send from uid 1 per operation, so that a Send
// is measured on the same tables (320,000 seeded rows at many) as the
// events it is compared with.
// --engines x-send,x-edit,x-recall compares them (x-send-sqlite,... on the
// embedded store); engine e is a Send on an empty schema. x-recall-old
// recalls the seeded messages oldest first: those its writer no longer
// remembers, so each recall reads its target before its batch forms.
func init() {
	registerOpEngines("x-send", "Send after the events' seeding, SDK unary", "one Send from uid 1 to the picked conversation (every conversation seeded with "+seededText+" first, as for x-edit and x-recall: their baseline)",
		func(c *client.Client, env Env) (Engine, error) {
			// The client's batcher would gather these Sends into SendBatch
			// calls: the operations go through a client without one, unary
			// like the Edits and Recalls they are compared with.
			u, err := client.New(sdkConfig(env, false))
			if err != nil {
				return nil, err
			}
			e := newEventClient(c, opSend)
			e.unary = u
			return e, nil
		})
	registerOpEngines("x-edit", "Edit, SDK unary", "one Edit of the picked conversation's last seeded message (a new body, as its sender; every conversation seeded with "+seededText+" first)",
		func(c *client.Client, _ Env) (Engine, error) { return newEventClient(c, opEdit), nil })
	registerOpEngines("x-recall", "Recall, SDK unary", "one Recall of the picked conversation's next message not yet recalled (as its sender; every conversation seeded with "+seededText+" first)",
		func(c *client.Client, _ Env) (Engine, error) { return newEventClient(c, opRecall), nil })
	registerOpEngines("x-recall-old", "Recall of an older message, SDK unary", "one Recall of the picked conversation's oldest seeded message not yet recalled (as its sender; every conversation seeded with "+seededText+" first, so the first "+fmt.Sprint(eventTargets-recentTargets)+" recalls of a conversation are of messages its writer no longer remembers, each read from the store first)",
		func(c *client.Client, _ Env) (Engine, error) { return newEventClient(c, opRecallOld), nil })
}

// eventOp is what an event engine's operation is.
type eventOp int

const (
	opSend eventOp = iota
	opEdit
	opRecall
	opRecallOld
)

func (o eventOp) String() string {
	return [...]string{"x-send", "x-edit", "x-recall", "x-recall-old"}[o]
}

// eventTargets is how many messages the event engines seed per
// conversation (the targets of x-recall). At many, 10,000 conversations
// picked uniformly, x-recall's 7,000 recalls/s for 15 s take about 10.5 of
// a conversation's targets on average; 16 ran out in some (1,171 failed
// recalls of 107,000 in one round), 32 in none of six rounds (2026-12-06).
const eventTargets = 32

// recentTargets is how many of a conversation's latest messages its writer
// remembers (conv.DefaultConfig's TargetCache): an event on one of them
// needs no read of the store first.
const recentTargets = 16

// recallOrder is the seeded message x-recall takes as its i-th recall of a
// conversation (of n seeded): the latest recentTargets first, oldest of
// them first (each recall's event pushes the oldest message out of the
// writer's memory, which is the one just recalled), then the older ones,
// whose recall reads its target from the store first. At many the first
// kind is nearly all of them: a conversation takes about 10.5 recalls in
// 15 s at 7,000 recalls/s.
func recallOrder(i, n int) int {
	recent := min(recentTargets, n)
	if i < recent {
		return n - recent + i
	}
	return i - recent
}

// seededText says eventTargets in the engines' descriptions.
var seededText = fmt.Sprintf("%d messages", eventTargets)

type eventClient struct {
	c     *client.Client // seeds (SendMany, batched); Edits and Recalls
	unary *client.Client // x-send's Sends: no batcher
	op    eventOp

	mu      sync.Mutex
	targets map[string][]uint64       // conv -> seeded msg_ids, in seq order
	next    map[string]*atomic.Uint32 // conv -> the next target x-recall takes
}

func newEventClient(c *client.Client, op eventOp) *eventClient {
	return &eventClient{c: c, op: op, targets: map[string][]uint64{}, next: map[string]*atomic.Uint32{}}
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

// Send is one operation: a Send from uid 1, or an Edit or a Recall of a
// seeded message of the picked conversation as its sender, with the
// operation's resend key.
func (e *eventClient) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	e.mu.Lock()
	targets, next := e.targets[req.ConvID], e.next[req.ConvID]
	e.mu.Unlock()
	if targets == nil {
		return sequencer.SendResult{}, fmt.Errorf("%s: conversation %q was not seeded", e.op, req.ConvID)
	}
	switch e.op {
	case opSend:
		r, err := e.unary.Send(ctx, client.SendRequest{ConvID: req.ConvID, FromUID: 1, ClientMsgID: req.ClientMsgID, MsgType: req.MsgType, Body: req.Body})
		return sequencer.SendResult{MsgID: r.MsgID, Seq: r.Seq, ServerAt: r.ServerAt, Duplicate: r.Duplicate}, err
	case opEdit:
		r, err := e.c.Edit(ctx, client.EditRequest{ConvID: req.ConvID, FromUID: 1, ClientMsgID: req.ClientMsgID, TargetMsgID: targets[len(targets)-1], Body: req.Body})
		return sequencer.SendResult{MsgID: r.MsgID, Seq: r.Seq, ServerAt: r.ServerAt, Duplicate: r.Duplicate}, err
	}
	i := int(next.Add(1) - 1)
	if i >= len(targets) {
		return sequencer.SendResult{}, fmt.Errorf("%s: conversation %q has no message left to recall (%d seeded)", e.op, req.ConvID, len(targets))
	}
	k := recallOrder(i, len(targets))
	if e.op == opRecallOld {
		k = i
	}
	r, err := e.c.Recall(ctx, client.RecallRequest{ConvID: req.ConvID, FromUID: 1, ClientMsgID: req.ClientMsgID, TargetMsgID: targets[k]})
	return sequencer.SendResult{MsgID: r.MsgID, Seq: r.Seq, ServerAt: r.ServerAt, Duplicate: r.Duplicate}, err
}

func (e *eventClient) Close() error {
	if e.unary != nil {
		e.unary.Close()
	}
	return e.c.Close()
}
