package api

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

const methodSubscribe = "Subscribe"

// Subscribe is not served yet.
func (s *Service) Subscribe(ctx context.Context, req *connect.Request[sequencerv1.SubscribeRequest], st *connect.ServerStream[sequencerv1.SubscribeResponse]) error {
	s.count(methodSubscribe, "unimplemented")
	return connect.NewError(connect.CodeUnimplemented, errors.New("Subscribe is not served yet"))
}
