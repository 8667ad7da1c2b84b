package api

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// The section-12 RPCs Edit and Recall are declared in the proto; until
// their handlers land they answer unimplemented.
var errPending = connect.NewError(connect.CodeUnimplemented, errors.New("not implemented on this node yet"))

func (s *Service) Edit(context.Context, *connect.Request[sequencerv1.EditRequest]) (*connect.Response[sequencerv1.SendResponse], error) {
	return nil, errPending
}

func (s *Service) Recall(context.Context, *connect.Request[sequencerv1.RecallRequest]) (*connect.Response[sequencerv1.SendResponse], error) {
	return nil, errPending
}
