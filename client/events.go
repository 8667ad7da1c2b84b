package client

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// EditRequest replaces the body of an earlier message of the conversation
// (docs/API.md, "Edit and Recall").
type EditRequest struct {
	ConvID  string
	FromUID uint64 // the target's sender, unless AsModerator
	// ClientMsgID is the edit's resend key, as SendRequest's (generated
	// when empty, returned in SendResult.ClientMsgID).
	ClientMsgID string
	TargetMsgID uint64 // the message to edit
	Body        []byte // the new body, Send's limits
	// AsModerator lets FromUID edit another user's message: set it only
	// for a user your logic layer authorized as a moderator.
	AsModerator bool
}

// RecallRequest recalls an earlier message of the conversation: its body
// is removed for good.
type RecallRequest struct {
	ConvID      string
	FromUID     uint64
	ClientMsgID string
	TargetMsgID uint64
	AsModerator bool
}

// Edit appends an edit event to the conversation and replaces the target's
// body in the same commit. The result is the event's ids (a new msg_id and
// seq). It is retried and routed like Send, with the same resend key, so a
// retried edit is applied once. Refusals (not retried): not_found (no such
// message in the conversation), permission_denied (another user's message
// without AsModerator), failed_precondition (recalled, or past the server's
// --edit-window).
func (c *Client) Edit(ctx context.Context, req EditRequest) (SendResult, error) {
	return c.event(ctx, "edit", req.ConvID, req.FromUID, req.ClientMsgID,
		func(ctx context.Context, rpc nodeRPC, key string) (*connect.Response[sequencerv1.SendResponse], error) {
			return rpc.Edit(ctx, connect.NewRequest(&sequencerv1.EditRequest{ConvId: req.ConvID, FromUid: req.FromUID,
				ClientMsgId: key, TargetMsgId: req.TargetMsgID, Body: req.Body, AsModerator: req.AsModerator}))
		})
}

// Recall appends a recall event to the conversation and removes the
// target's body for good in the same commit; see Edit (--recall-window).
func (c *Client) Recall(ctx context.Context, req RecallRequest) (SendResult, error) {
	return c.event(ctx, "recall", req.ConvID, req.FromUID, req.ClientMsgID,
		func(ctx context.Context, rpc nodeRPC, key string) (*connect.Response[sequencerv1.SendResponse], error) {
			return rpc.Recall(ctx, connect.NewRequest(&sequencerv1.RecallRequest{ConvId: req.ConvID, FromUid: req.FromUID,
				ClientMsgId: key, TargetMsgId: req.TargetMsgID, AsModerator: req.AsModerator}))
		})
}

// nodeRPC is what an event call needs of a node's client.
type nodeRPC interface {
	Edit(context.Context, *connect.Request[sequencerv1.EditRequest]) (*connect.Response[sequencerv1.SendResponse], error)
	Recall(context.Context, *connect.Request[sequencerv1.RecallRequest]) (*connect.Response[sequencerv1.SendResponse], error)
}

// event is an Edit or Recall call: Send's routing and retries (one resend
// key for every attempt), one RPC per attempt.
func (c *Client) event(ctx context.Context, op, convID string, fromUID uint64, key string,
	rpc func(ctx context.Context, rpc nodeRPC, key string) (*connect.Response[sequencerv1.SendResponse], error)) (SendResult, error) {
	if key == "" {
		key = NewClientMsgID()
	}
	res := SendResult{ClientMsgID: key}
	cl := call{op: op, convID: convID, send: true, fromUID: fromUID, clientMsgID: key}
	err := c.retry(ctx, cl, func(ctx context.Context) (*node, error) {
		target, err := c.sendTarget(ctx, convID)
		if err != nil {
			return target, err
		}
		ctx, stopWatch := c.watchRoute(ctx, convID, target)
		defer stopWatch()
		resp, err := rpc(ctx, target.rpc, key)
		if err != nil {
			if errors.Is(context.Cause(ctx), errRouteMoved) {
				err = fmt.Errorf("%w (%w)", errRouteMoved, err)
			}
			return target, err
		}
		c.sawView(resp.Header())
		out := resp.Msg
		res.MsgID, res.Seq, res.Duplicate = out.GetMsgId(), out.GetSeq(), out.GetDuplicate()
		if ts := out.GetServerAt(); ts != nil {
			res.ServerAt = ts.AsTime()
		}
		return target, nil
	})
	return res, err
}
