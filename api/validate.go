package api

import (
	"unicode"
	"unicode/utf8"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// maxID is the exclusive upper bound of ids stored as PostgreSQL BIGINT
// (from_uid, msg_id): 2^63.
const maxID = uint64(1) << 63

// PullQuery is a validated Pull: Limit is already defaulted and clamped to
// 1..sequencer.MaxPullLimit.
type PullQuery struct {
	ConvID   string
	AfterSeq uint64
	Limit    int
}

// invalid returns an invalid_argument error that names the field and the
// rule, e.g. "conv_id: must be 1..64 bytes, got 65".
func invalid(field, format string, args ...any) error {
	return sequencer.Errorf(sequencer.CodeInvalidArgument, field+": "+format, args...)
}

// ValidateSend checks a Send against CONTRACT.md's validation table and
// returns the domain request with msg_type defaulted (0 -> 1). maxBody <= 0
// means sequencer.DefaultMaxBody. Every error has code invalid_argument. The
// returned Body aliases the request's bytes (no copy).
func ValidateSend(req *sequencerv1.SendRequest, maxBody int) (sequencer.SendRequest, error) {
	if maxBody <= 0 {
		maxBody = sequencer.DefaultMaxBody
	}
	if err := ValidateConvID(req.GetConvId()); err != nil {
		return sequencer.SendRequest{}, err
	}
	if uid := req.GetFromUid(); uid == 0 || uid >= maxID {
		return sequencer.SendRequest{}, invalid("from_uid", "must be > 0 and < 2^63, got %d", uid)
	}
	if err := checkText("client_msg_id", req.GetClientMsgId(), sequencer.MaxClientMsgIDLen); err != nil {
		return sequencer.SendRequest{}, err
	}
	msgType := req.GetMsgType()
	if msgType == 0 {
		msgType = sequencer.DefaultMsgType
	}
	if msgType < 1 || msgType > 32767 {
		return sequencer.SendRequest{}, invalid("msg_type", "must be 0 (default 1) or 1..32767, got %d", msgType)
	}
	if n := len(req.GetBody()); n > maxBody {
		return sequencer.SendRequest{}, invalid("body", "must be at most %d bytes, got %d", maxBody, n)
	}
	return sequencer.SendRequest{
		ConvID:      req.GetConvId(),
		FromUID:     req.GetFromUid(),
		ClientMsgID: req.GetClientMsgId(),
		MsgType:     int16(msgType),
		Body:        req.GetBody(),
	}, nil
}

// ValidatePull checks a Pull's conv_id and defaults its limit: 0 means
// sequencer.DefaultPullLimit, above sequencer.MaxPullLimit is clamped.
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
	return PullQuery{ConvID: req.GetConvId(), AfterSeq: req.GetAfterSeq(), Limit: limit}, nil
}

// ValidateConvID checks a conv_id (Send, Pull, GetHead, Route): 1..64 bytes,
// valid UTF-8, no control characters.
func ValidateConvID(convID string) error {
	return checkText("conv_id", convID, sequencer.MaxConvIDLen)
}

// ValidateMsgID checks a GetMessage msg_id: > 0 and < 2^63.
func ValidateMsgID(msgID uint64) error {
	if msgID == 0 || msgID >= maxID {
		return invalid("msg_id", "must be > 0 and < 2^63, got %d", msgID)
	}
	return nil
}

// checkText enforces the shared rule of conv_id and client_msg_id: 1..max
// bytes, valid UTF-8, no control characters (unicode.IsControl: C0, DEL, C1).
func checkText(field, s string, max int) error {
	if len(s) < 1 || len(s) > max {
		return invalid(field, "must be 1..%d bytes, got %d", max, len(s))
	}
	if !utf8.ValidString(s) {
		return invalid(field, "must be valid UTF-8")
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return invalid(field, "must not contain control characters, found %U at byte %d", r, i)
		}
	}
	return nil
}
