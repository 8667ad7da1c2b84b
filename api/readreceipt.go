package api

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// GetReadReceipts answers, for each of 1..100 seqs of a conversation, how
// many users have read up to it (read position >= seq, the sender
// included: a Send marks its sender's position). Any node answers from
// the shared store, in one query (persist.ReadReceipts).
func (s *Service) GetReadReceipts(ctx context.Context, req *connect.Request[sequencerv1.GetReadReceiptsRequest]) (*connect.Response[sequencerv1.GetReadReceiptsResponse], error) {
	m := req.Msg
	if err := sequencer.CheckReadReceipts(m.GetConvId(), m.GetSeqs()); err != nil {
		return nil, s.fail(ctx, methodReceipts, err)
	}
	if s.reads == nil {
		s.count(methodReceipts, "unimplemented")
		return nil, errNoPositions
	}
	n, err := persist.ReadReceipts(ctx, s.reads, m.GetConvId(), m.GetSeqs())
	if err != nil {
		return nil, s.fail(ctx, methodReceipts, fmt.Errorf("read receipts: %w", err), "conv_id", m.GetConvId())
	}
	s.ok(methodReceipts)
	return connect.NewResponse(&sequencerv1.GetReadReceiptsResponse{ReadBy: n}), nil
}

// ListReadPositions answers a page of a conversation's read positions
// (uid > after_uid, ascending by uid; limit 0 = 100, clamped to 1,000) and
// whether more follow (has_more: ask again from the last uid).
func (s *Service) ListReadPositions(ctx context.Context, req *connect.Request[sequencerv1.ListReadPositionsRequest]) (*connect.Response[sequencerv1.ListReadPositionsResponse], error) {
	m := req.Msg
	limit, err := sequencer.ReadPositionsPage(m.GetConvId(), m.GetAfterUid(), m.GetLimit())
	if err != nil {
		return nil, s.fail(ctx, methodPositions, err)
	}
	if s.reads == nil {
		s.count(methodPositions, "unimplemented")
		return nil, errNoPositions
	}
	ps, more, err := s.reads.ReadPositionsPage(ctx, m.GetConvId(), m.GetAfterUid(), limit)
	if err != nil {
		return nil, s.fail(ctx, methodPositions, fmt.Errorf("read positions: %w", err), "conv_id", m.GetConvId())
	}
	out := make([]*sequencerv1.ReadPosition, len(ps))
	for i, p := range ps {
		out[i] = &sequencerv1.ReadPosition{Uid: p.UID, ReadSeq: p.ReadSeq}
	}
	s.ok(methodPositions)
	return connect.NewResponse(&sequencerv1.ListReadPositionsResponse{Positions: out, HasMore: more}), nil
}
