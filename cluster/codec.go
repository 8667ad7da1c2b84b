package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sequencer-im/sequencer"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// sentinels names the domain's sentinel errors on the wire, so a forwarded
// failure is rebuilt as an error that errors.Is recognises. Names are part
// of the node-to-node protocol: add, never rename.
var sentinels = []struct {
	name string
	err  error
}{
	{"not_found", sequencer.ErrNotFound},
	{"already_exists", sequencer.ErrAlreadyExists},
	{"store_unavailable", sequencer.ErrStoreUnavailable},
	{"unknown_outcome", sequencer.ErrUnknownOutcome},
	{"clock_moved_backwards", sequencer.ErrClockMovedBackwards},
	{"worker_lease_lost", sequencer.ErrWorkerLeaseLost},
	{"stale_epoch", sequencer.ErrStaleEpoch},
	{"not_owner", sequencer.ErrNotOwner},
	{"ownership_moving", sequencer.ErrOwnershipMoving},
	{"head_mismatch", sequencer.ErrHeadMismatch},
	{"overloaded", sequencer.ErrOverloaded},
	{"shutting_down", sequencer.ErrShuttingDown},
	{"context_canceled", context.Canceled},
	{"context_deadline_exceeded", context.DeadlineExceeded},
}

// encodeReplies answers a forwarded batch: Results[i] for out[i]. The
// results are allocated together (a batch has up to MaxForwardItems).
func encodeReplies(nodeID string, out []sequencer.SendOutcome) *clusterv1.ForwardBatchReply {
	reply := &clusterv1.ForwardBatchReply{NodeId: nodeID, Results: make([]*clusterv1.ForwardReply, len(out))}
	replies := make([]clusterv1.ForwardReply, len(out))
	oks := make([]clusterv1.ForwardReply_Result, 0, len(out))
	results := make([]clusterv1.SendResult, 0, len(out))
	for i, o := range out {
		r := &replies[i]
		reply.Results[i] = r
		if o.Err != nil {
			r.Outcome = encodeReply(o.Result, o.Err).Outcome
			continue
		}
		results = append(results, clusterv1.SendResult{})
		res := &results[len(results)-1]
		res.MsgId, res.Seq, res.Duplicate = o.Result.MsgID, o.Result.Seq, o.Result.Duplicate
		res.ServerAtUnixNano = o.Result.ServerAt.UnixNano()
		oks = append(oks, clusterv1.ForwardReply_Result{Result: res})
		r.Outcome = &oks[len(oks)-1]
	}
	return reply
}

func encodeReply(res sequencer.SendResult, err error) *clusterv1.ForwardReply {
	if err == nil {
		return &clusterv1.ForwardReply{Outcome: &clusterv1.ForwardReply_Result{Result: &clusterv1.SendResult{
			MsgId:            res.MsgID,
			Seq:              res.Seq,
			ServerAtUnixNano: res.ServerAt.UnixNano(),
			Duplicate:        res.Duplicate,
		}}}
	}
	f := &clusterv1.Failure{Code: int32(sequencer.ErrorCode(err)), Message: err.Error()}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			f.Sentinel = s.name
			break
		}
	}
	return &clusterv1.ForwardReply{Outcome: &clusterv1.ForwardReply_Failure{Failure: f}}
}

func decodeReply(r *clusterv1.ForwardReply) (sequencer.SendResult, error) {
	switch o := r.GetOutcome().(type) {
	case *clusterv1.ForwardReply_Result:
		return sequencer.SendResult{
			MsgID:     o.Result.GetMsgId(),
			Seq:       o.Result.GetSeq(),
			ServerAt:  time.Unix(0, o.Result.GetServerAtUnixNano()).UTC(),
			Duplicate: o.Result.GetDuplicate(),
		}, nil
	case *clusterv1.ForwardReply_Failure:
		return sequencer.SendResult{}, decodeFailure(r.GetNodeId(), o.Failure)
	}
	return sequencer.SendResult{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrUnknownOutcome,
		fmt.Sprintf("node %s answered a forwarded send with neither result nor failure", r.GetNodeId()))
}

// RemoteError is a failure answered by the node a send was forwarded to. It
// keeps the domain code, and unwraps to the domain sentinel when there was
// one, so errors.Is and sequencer.ErrorCode work as on the owner.
type RemoteError struct {
	NodeID string
	Code   sequencer.Code
	Msg    string
	cause  error
}

func (e *RemoteError) Error() string { return "node " + e.NodeID + ": " + e.Msg }

// Unwrap returns the sentinel the owner's error wrapped, or an
// *sequencer.Error carrying the code.
func (e *RemoteError) Unwrap() error { return e.cause }

func decodeFailure(nodeID string, f *clusterv1.Failure) error {
	e := &RemoteError{NodeID: nodeID, Code: sequencer.Code(f.GetCode()), Msg: f.GetMessage()}
	for _, s := range sentinels {
		if s.name == f.GetSentinel() {
			e.cause = s.err
			if sequencer.ErrorCode(s.err) != e.Code {
				// Keep the owner's code (e.g. a wrapped sentinel recoded).
				e.cause = &sequencer.Error{Code: e.Code, Msg: s.err.Error(), Err: s.err}
			}
			return e
		}
	}
	e.cause = &sequencer.Error{Code: e.Code, Msg: "remote failure"}
	return e
}
