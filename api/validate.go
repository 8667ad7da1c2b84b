package api

import (
	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// PullQuery is a validated Pull: Limit is already defaulted and clamped to
// 1..sequencer.MaxPullLimit.
type PullQuery struct {
	ConvID   string
	AfterSeq uint64
	Limit    int
	MaxBytes int // defaulted and clamped: 1 MiB by default, at most 4 MiB
	// BeforeSeq > 0 asks for the newest page below it (newest first).
	BeforeSeq uint64
}

// Page byte limits of Pull.
const (
	DefaultPullMaxBytes = 1 << 20
	MaxPullMaxBytes     = 4 << 20
)

// ValidateSend checks a Send against the validation rules
// (sequencer.NewSendRequest) and returns the domain request with msg_type
// defaulted (0 -> 1). maxBody <= 0 means sequencer.DefaultMaxBody. Every
// error has code invalid_argument. The returned Body aliases the request's
// bytes (no copy).
func ValidateSend(req *sequencerv1.SendRequest, maxBody int) (sequencer.SendRequest, error) {
	return sequencer.NewSendRequest(req.GetConvId(), req.GetFromUid(), req.GetClientMsgId(), req.GetMsgType(), req.GetBody(), maxBody)
}

// ValidatePull checks a Pull's conv_id and defaults its limits: limit 0
// means sequencer.DefaultPullLimit, above sequencer.MaxPullLimit is clamped;
// max_bytes 0 means DefaultPullMaxBytes, above MaxPullMaxBytes is clamped.
// after_seq takes any value.
func ValidatePull(req *sequencerv1.PullRequest) (PullQuery, error) {
	if err := ValidateConvID(req.GetConvId()); err != nil {
		return PullQuery{}, err
	}
	limit := int(req.GetLimit())
	switch {
	case limit == 0:
		limit = sequencer.DefaultPullLimit
	case limit > sequencer.MaxPullLimit:
		limit = sequencer.MaxPullLimit
	}
	maxBytes := int(min(req.GetMaxBytes(), MaxPullMaxBytes))
	if maxBytes == 0 {
		maxBytes = DefaultPullMaxBytes
	}
	return PullQuery{ConvID: req.GetConvId(), AfterSeq: req.GetAfterSeq(), Limit: limit, MaxBytes: maxBytes, BeforeSeq: req.GetBeforeSeq()}, nil
}

// ValidateConvID checks a conv_id (Send, Pull, GetHead, Route).
func ValidateConvID(convID string) error { return sequencer.CheckConvID(convID) }

// ValidateMsgID checks a GetMessage msg_id: > 0 and < 2^63.
func ValidateMsgID(msgID uint64) error { return sequencer.CheckMsgID(msgID) }

// ValidateMarkRead checks a MarkRead: conv_id as in Send, uid > 0 and
// < 2^63, seq < 2^63 (0 allowed: it changes nothing; above the head is
// clamped by the store, not refused).
func ValidateMarkRead(req *sequencerv1.MarkReadRequest) error {
	return sequencer.CheckMarkRead(req.GetConvId(), req.GetUid(), req.GetSeq())
}

// ValidateReadState checks a GetReadState: uid > 0 and < 2^63, and
// 1..sequencer.MaxReadStateConvs conv_ids, each valid as in Send
// (duplicates allowed).
func ValidateReadState(req *sequencerv1.GetReadStateRequest) error {
	return sequencer.CheckReadStates(req.GetUid(), req.GetConvIds())
}
