package api

import (
	"context"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// Method names of the event RPCs in the metric label "method".
const (
	methodEdit   = "Edit"
	methodRecall = "Recall"
)

// ValidateEdit checks an Edit (sequencer.NewEditRequest): the resend key
// and body as Send's, target_msg_id > 0 and < 2^63. Every error has code
// invalid_argument.
func ValidateEdit(req *sequencerv1.EditRequest, maxBody int) (sequencer.SendRequest, error) {
	return sequencer.NewEditRequest(req.GetConvId(), req.GetFromUid(), req.GetClientMsgId(), req.GetTargetMsgId(),
		req.GetBody(), req.GetAsModerator(), maxBody)
}

// ValidateRecall checks a Recall like ValidateEdit.
func ValidateRecall(req *sequencerv1.RecallRequest) (sequencer.SendRequest, error) {
	return sequencer.NewRecallRequest(req.GetConvId(), req.GetFromUid(), req.GetClientMsgId(), req.GetTargetMsgId(),
		req.GetAsModerator())
}

// Edit appends an edit event to the conversation and replaces the target's
// body in the same commit (docs/API.md, "Edit and Recall"). It goes to the
// conversation's writer like a Send (forwarded to the owner in a cluster),
// which judges the target (conv.CheckEvent); the answer carries the
// event's ids.
func (s *Service) Edit(ctx context.Context, req *connect.Request[sequencerv1.EditRequest]) (*connect.Response[sequencerv1.SendResponse], error) {
	in, err := ValidateEdit(req.Msg, s.maxBody)
	return s.event(ctx, methodEdit, in, err)
}

// Recall appends a recall event and removes the target's body for good in
// the same commit; see Edit.
func (s *Service) Recall(ctx context.Context, req *connect.Request[sequencerv1.RecallRequest]) (*connect.Response[sequencerv1.SendResponse], error) {
	in, err := ValidateRecall(req.Msg)
	return s.event(ctx, methodRecall, in, err)
}

// event hands a validated event (or its validation error) to the Sender and
// answers like Send.
func (s *Service) event(ctx context.Context, method string, in sequencer.SendRequest, err error) (_ *connect.Response[sequencerv1.SendResponse], rerr error) {
	dup := false
	defer func(start time.Time) { s.observeSend(ctx, method, start, rerr, dup) }(time.Now())
	if err != nil {
		return nil, s.fail(ctx, method, err)
	}
	res, err := s.sender.Send(ctx, in)
	if err != nil {
		return nil, s.fail(ctx, method, err, "conv_id", in.ConvID, "from_uid", in.FromUID,
			"client_msg_id", in.ClientMsgID, "target_msg_id", in.TargetMsgID)
	}
	s.ok(method)
	dup = res.Duplicate
	resp := connect.NewResponse(sendResponse(res))
	s.viewHeader(resp.Header())
	return resp, nil
}
