package api

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// The section-12 read-receipt RPCs are declared in the proto; until their
// handlers land they answer unimplemented.
var errPending = connect.NewError(connect.CodeUnimplemented, errors.New("not implemented on this node yet"))

func (s *Service) GetReadReceipts(context.Context, *connect.Request[sequencerv1.GetReadReceiptsRequest]) (*connect.Response[sequencerv1.GetReadReceiptsResponse], error) {
	return nil, errPending
}

func (s *Service) ListReadPositions(context.Context, *connect.Request[sequencerv1.ListReadPositionsRequest]) (*connect.Response[sequencerv1.ListReadPositionsResponse], error) {
	return nil, errPending
}
