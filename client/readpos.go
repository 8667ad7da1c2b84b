package client

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// ReadState is one user's read position in one conversation with the
// conversation's head; Unread() is Head - ReadSeq, exact because seqs have
// no holes. HeadSeq() is Head under the wire's name (head_seq).
type ReadState = sequencer.ReadState

// MarkReadRequest names MarkRead's arguments (a uid and a seq are both
// uint64: by name they cannot be swapped).
type MarkReadRequest struct {
	ConvID string
	UID    uint64 // > 0 and < 2^63
	Seq    uint64 // the position to raise to; clamped to the head
}

// Mark is MarkRead with its arguments named.
func (c *Client) Mark(ctx context.Context, req MarkReadRequest) (ReadState, error) {
	return c.MarkRead(ctx, req.ConvID, req.UID, req.Seq)
}

// MarkRead raises uid's read position in convID to seq and returns the
// stored position, the head and (Unread) the unread count. The position
// never goes backwards (a lower seq changes nothing) and a seq above the
// head is clamped to the head; it is durable when MarkRead returns. A
// user's own Send moves their position to its seq (unless the server runs
// with --send-marks-read=false: then mark the seq Send returned to keep
// one's own messages from counting as unread). Any node answers it,
// and retries are harmless (a mark only moves up), so failed attempts are
// retried like a Send's.
func (c *Client) MarkRead(ctx context.Context, convID string, uid, seq uint64) (ReadState, error) {
	var st ReadState
	req := &sequencerv1.MarkReadRequest{ConvId: convID, Uid: uid, Seq: seq}
	err := c.retry(ctx, call{op: "mark read", subject: fmt.Sprintf("conv_id %q uid %d seq %d", convID, uid, seq)},
		func(ctx context.Context) (*node, error) {
			target := c.anyNode(nil)
			resp, err := target.rpc.MarkRead(ctx, connect.NewRequest(req))
			if err != nil {
				return target, err
			}
			st = ReadState{ConvID: convID, ReadSeq: resp.Msg.GetReadSeq(), Head: resp.Msg.GetHeadSeq()}
			return target, nil
		})
	return st, err
}

// ReadState is GetReadState.
//
// Deprecated: use GetReadState, the RPC's name.
func (c *Client) ReadState(ctx context.Context, uid uint64, convIDs []string) ([]ReadState, error) {
	return c.GetReadState(ctx, uid, convIDs)
}

// GetReadState returns uid's read state in each of convIDs (1..1,000; more
// is invalid_argument), in the order given; a conversation never written or
// never marked has zeros. One call, answered by one query on the server.
func (c *Client) GetReadState(ctx context.Context, uid uint64, convIDs []string) ([]ReadState, error) {
	var out []ReadState
	req := &sequencerv1.GetReadStateRequest{Uid: uid, ConvIds: convIDs}
	err := c.retry(ctx, call{op: "get read state", subject: fmt.Sprintf("uid %d (%d conversations)", uid, len(convIDs))},
		func(ctx context.Context) (*node, error) {
			target := c.anyNode(nil)
			resp, err := target.rpc.GetReadState(ctx, connect.NewRequest(req))
			if err != nil {
				return target, err
			}
			states := resp.Msg.GetStates()
			if len(states) != len(convIDs) {
				return target, sequencer.Errorf(sequencer.CodeInternal, "get read state: the server answered %d states for %d conversations", len(states), len(convIDs))
			}
			out = make([]ReadState, len(states))
			for i, s := range states {
				out[i] = ReadState{ConvID: convIDs[i], ReadSeq: s.GetReadSeq(), Head: s.GetHeadSeq()}
			}
			return target, nil
		})
	return out, err
}

// ReadPosition is one user's read position in a conversation
// (ListReadPositions).
type ReadPosition struct {
	UID     uint64
	ReadSeq uint64
}

// GetReadReceipts returns, for each of seqs (1..100, any order) of convID,
// how many users have read up to it (a stored read position >= seq; the
// sender included, since a Send marks its sender's position). One call,
// one query on the server; retried like a read.
func (c *Client) GetReadReceipts(ctx context.Context, convID string, seqs []uint64) ([]uint64, error) {
	var out []uint64
	req := &sequencerv1.GetReadReceiptsRequest{ConvId: convID, Seqs: seqs}
	err := c.retry(ctx, call{op: "get read receipts", subject: fmt.Sprintf("conv_id %q (%d seqs)", convID, len(seqs))},
		func(ctx context.Context) (*node, error) {
			target := c.anyNode(nil)
			resp, err := target.rpc.GetReadReceipts(ctx, connect.NewRequest(req))
			if err != nil {
				return target, err
			}
			if n := len(resp.Msg.GetReadBy()); n != len(seqs) {
				return target, sequencer.Errorf(sequencer.CodeInternal, "get read receipts: the server answered %d counts for %d seqs", n, len(seqs))
			}
			out = resp.Msg.GetReadBy()
			return target, nil
		})
	return out, err
}

// ListReadPositions returns a page of convID's read positions with uid >
// afterUID, ascending by uid (limit 0 = 100, clamped to 1,000 by the
// server), and whether more follow (ask again from the last uid). Retried
// like a read.
func (c *Client) ListReadPositions(ctx context.Context, convID string, afterUID uint64, limit uint32) ([]ReadPosition, bool, error) {
	var out []ReadPosition
	var more bool
	req := &sequencerv1.ListReadPositionsRequest{ConvId: convID, AfterUid: afterUID, Limit: limit}
	err := c.retry(ctx, call{op: "list read positions", subject: fmt.Sprintf("conv_id %q after uid %d", convID, afterUID)},
		func(ctx context.Context) (*node, error) {
			target := c.anyNode(nil)
			resp, err := target.rpc.ListReadPositions(ctx, connect.NewRequest(req))
			if err != nil {
				return target, err
			}
			ps := resp.Msg.GetPositions()
			out = make([]ReadPosition, len(ps))
			for i, p := range ps {
				out[i] = ReadPosition{UID: p.GetUid(), ReadSeq: p.GetReadSeq()}
			}
			more = resp.Msg.GetHasMore()
			return target, nil
		})
	return out, more, err
}
