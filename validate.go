package sequencer

import (
	"unicode"
	"unicode/utf8"
)

// MaxID is the exclusive upper bound of ids stored as PostgreSQL BIGINT
// (from_uid, msg_id): 2^63.
const MaxID = uint64(1) << 63

// This file is the ONE table of validation rules (docs/API.md, "Validation").
// The API edge and the owner of a forwarded send both call it, so a message
// that reaches a conversation's writer has passed the same checks whichever
// way it came.

// invalid returns an invalid_argument error that names the field and the
// rule, e.g. "conv_id: must be 1..64 bytes, got 65".
func invalid(field, format string, args ...any) error {
	return Errorf(CodeInvalidArgument, field+": "+format, args...)
}

// NewSendRequest checks one send's fields against the validation rules and
// returns the request with msg_type defaulted (0 -> 1). maxBody <= 0 means
// DefaultMaxBody. Every error has code invalid_argument. The returned Body
// aliases body (no copy).
func NewSendRequest(convID string, fromUID uint64, clientMsgID string, msgType int32, body []byte, maxBody int) (SendRequest, error) {
	if maxBody <= 0 {
		maxBody = DefaultMaxBody
	}
	if err := CheckConvID(convID); err != nil {
		return SendRequest{}, err
	}
	if fromUID == 0 || fromUID >= MaxID {
		return SendRequest{}, invalid("from_uid", "must be > 0 and < 2^63, got %d", fromUID)
	}
	if err := checkText("client_msg_id", clientMsgID, MaxClientMsgIDLen); err != nil {
		return SendRequest{}, err
	}
	if msgType == 0 {
		msgType = DefaultMsgType
	}
	if msgType < 1 || msgType > 32767 {
		return SendRequest{}, invalid("msg_type", "must be 0 (default 1) or 1..32767, got %d", msgType)
	}
	if n := len(body); n > maxBody {
		return SendRequest{}, invalid("body", "must be at most %d bytes, got %d", maxBody, n)
	}
	return SendRequest{ConvID: convID, FromUID: fromUID, ClientMsgID: clientMsgID, MsgType: int16(msgType), Body: body}, nil
}

// NewEditRequest checks an Edit: the resend key and body as Send
// (NewSendRequest; the event is of msg_type 1) and a target msg_id > 0 and
// < 2^63. Whether the target may be edited is the conversation writer's
// decision (conv.CheckEvent), made against the stored target.
func NewEditRequest(convID string, fromUID uint64, clientMsgID string, targetMsgID uint64, body []byte, asModerator bool, maxBody int) (SendRequest, error) {
	return newEventRequest(KindEdit, convID, fromUID, clientMsgID, targetMsgID, body, asModerator, maxBody)
}

// NewRecallRequest checks a Recall like NewEditRequest; the event has no
// body.
func NewRecallRequest(convID string, fromUID uint64, clientMsgID string, targetMsgID uint64, asModerator bool) (SendRequest, error) {
	return newEventRequest(KindRecall, convID, fromUID, clientMsgID, targetMsgID, nil, asModerator, 0)
}

func newEventRequest(kind Kind, convID string, fromUID uint64, clientMsgID string, targetMsgID uint64, body []byte, asModerator bool, maxBody int) (SendRequest, error) {
	r, err := NewSendRequest(convID, fromUID, clientMsgID, DefaultMsgType, body, maxBody)
	if err != nil {
		return SendRequest{}, err
	}
	if targetMsgID == 0 || targetMsgID >= MaxID {
		return SendRequest{}, invalid("target_msg_id", "must be > 0 and < 2^63, got %d", targetMsgID)
	}
	r.Kind, r.TargetMsgID, r.AsModerator = kind, targetMsgID, asModerator
	return r, nil
}

// Check re-validates an already built request (for example one rebuilt from
// another node's message) with the same rules as NewSendRequest.
func (r *SendRequest) Check(maxBody int) error {
	_, err := NewRequest(r.Kind, r.ConvID, r.FromUID, r.ClientMsgID, int32(r.MsgType), r.Body, r.TargetMsgID, r.AsModerator, maxBody)
	return err
}

// NewRequest checks a request of any kind (one forwarded by another node):
// a Send (NewSendRequest; target_msg_id and as_moderator ignored), an Edit
// (NewEditRequest; msg_type ignored) or a Recall (NewRecallRequest; a body
// is refused).
func NewRequest(kind Kind, convID string, fromUID uint64, clientMsgID string, msgType int32, body []byte, targetMsgID uint64, asModerator bool, maxBody int) (SendRequest, error) {
	switch kind {
	case KindMessage:
		return NewSendRequest(convID, fromUID, clientMsgID, msgType, body, maxBody)
	case KindEdit:
		return NewEditRequest(convID, fromUID, clientMsgID, targetMsgID, body, asModerator, maxBody)
	case KindRecall:
		if len(body) > 0 {
			return SendRequest{}, invalid("body", "a recall carries no body")
		}
		return NewRecallRequest(convID, fromUID, clientMsgID, targetMsgID, asModerator)
	}
	return SendRequest{}, invalid("kind", "unknown message kind %d", kind)
}

// CheckConvID checks a conv_id (Send, Pull, GetHead, Route): 1..64 bytes,
// valid UTF-8, no control characters.
func CheckConvID(convID string) error {
	return checkText("conv_id", convID, MaxConvIDLen)
}

// CheckMsgID checks a GetMessage msg_id: > 0 and < 2^63.
func CheckMsgID(msgID uint64) error {
	if msgID == 0 || msgID >= MaxID {
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

// ParseCode returns the Code named name (the names of Code.String, which are
// also the RPC error code names), CodeInternal for any other name.
func ParseCode(name string) Code {
	for c := CodeInternal; c <= CodeFailedPrecondition; c++ {
		if c.String() == name {
			return c
		}
	}
	return CodeInternal
}

// Route is the owner of a conversation as the answering node sees it.
type Route struct {
	NodeID            string
	Address           string // API address of the owner (host:port)
	Partition         uint32
	Epoch             uint64 // the owner's lease epoch of Partition
	MembershipVersion uint64 // the membership view the ring was built from
}

// SendOutcome is one item's answer in a batch: a result or an error.
type SendOutcome struct {
	Result SendResult
	Err    error
}
