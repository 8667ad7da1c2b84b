package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
)

// The event engines (issue 32) measure Edit and Recall through the Go SDK
// (unary gRPC, like engine e, on PostgreSQL) against a 'sequencer serve':
// each operation is one Edit or one Recall of a message of the picked
// conversation, as its sender (uid 1). Before the load they seed every
// conversation (Seeder, not measured) with eventTargets messages from uid
// 1. x-edit edits the conversation's first message over and over (each
// edit is a new event and a new seq); x-recall recalls the conversation's
// next message not yet recalled, and fails when a conversation ran out of
// them (keep --messages below about eventTargets/2 per conversation). They
// are opt-in: --engines e,x-edit,x-recall compares them with a Send.
func init() {
	for _, recall := range []bool{false, true} {
		key, name, what := "x-edit", "Edit, SDK unary", "one Edit of the picked conversation's first message (a new body, as its sender)"
		if recall {
			key, name, what = "x-recall", "Recall, SDK unary", "one Recall of the picked conversation's next message not yet recalled (as its sender)"
		}
		s := remoteSpec(key, name, false, what+" through the Go SDK to a 'sequencer serve' on PostgreSQL, after seeding every conversation", newEventClient(recall))
		s.OptIn = true
		registerEngine(s)
	}
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

func newEventClient(recall bool) func(env Env) (Engine, error) {
	return func(env Env) (Engine, error) {
		proto := client.ProtocolGRPC
		if env.Protocol == "connect" {
			proto = client.ProtocolConnect
		}
		c, err := client.New(client.Config{
			Addrs: []string{env.Target}, Protocol: proto, DisableRouting: true,
			Retry: client.RetryPolicy{MaxAttempts: 1},
		})
		if err != nil {
			return nil, err
		}
		return &eventClient{c: c, recall: recall, targets: map[string][]uint64{}, next: map[string]*atomic.Uint32{}}, nil
	}
}

// Seed stores eventTargets messages from uid 1 in every conversation
// (SendMany, batched) and keeps their msg_ids.
func (e *eventClient) Seed(ctx context.Context, convPfx string, convs, senders int) error {
	type item struct {
		conv string
		i    int
	}
	var reqs []client.SendRequest
	var items []item
	flush := func() error {
		res, errs := e.c.SendMany(ctx, reqs)
		e.mu.Lock()
		defer e.mu.Unlock()
		for j, err := range errs {
			if err != nil {
				return fmt.Errorf("seed messages: %w", err)
			}
			t := e.targets[items[j].conv]
			if t == nil {
				t = make([]uint64, eventTargets)
				e.targets[items[j].conv] = t
				e.next[items[j].conv] = new(atomic.Uint32)
			}
			t[items[j].i] = res[j].MsgID
		}
		reqs, items = reqs[:0], items[:0]
		return nil
	}
	for i := range eventTargets {
		for k := range convs {
			c := convID(convPfx, k)
			reqs = append(reqs, client.SendRequest{ConvID: c, FromUID: 1, ClientMsgID: fmt.Sprintf("%sseed-%d-%d", convPfx, k, i), Body: []byte("seed")})
			items = append(items, item{c, i})
			if len(reqs) == seedChunk {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	if len(reqs) > 0 {
		return flush()
	}
	return nil
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
