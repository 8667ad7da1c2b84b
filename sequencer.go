// Package sequencer holds the domain of the message sequencer: the message, its
// two numbers (a global msg_id and a per-conversation seq), the error codes
// every layer speaks, and what a commit carries and what its errors mean
// (commit.go: Fence, ConvBatch, OutcomeOf), so the pure cores need nothing of
// persist. It imports no storage, transport or actor code; those
// live in their own packages (persist, actor, ring, cluster, api) and are wired
// together only in package server (cmd/sequencer parses flags and runs it).
package sequencer

import "time"

// Message is one stored message, exactly a row of im_message (docs/API.md,
// "Storage schema").
type Message struct {
	MsgID       uint64    // snowflake, global, never reused; always < 2^63
	ConvID      string    // conversation id, also the shard key
	Seq         uint64    // per conversation, 1, 2, 3, ... no gaps
	FromUID     uint64    // sender, > 0 and < 2^63
	MsgType     int16     // 1..32767
	Body        []byte    // opaque payload
	ClientMsgID string    // the client's resend key, never empty
	ServerAt    time.Time // display only, millisecond precision, never used to order

	// Edits and recalls (docs/API.md, "Edit and Recall"). An event message
	// (Kind Edit or Recall) names the message it changes in TargetMsgID;
	// an edit event carries the new body, a recall event none. The target
	// itself keeps its msg_id and seq and shows its current state:
	// Recalled (its body is gone for good), or the edited body with
	// EditCount and EditedAt (the server_at of the last edit event).
	Kind        Kind
	TargetMsgID uint64 // 0 unless Kind is Edit or Recall
	Recalled    bool
	EditCount   uint32
	EditedAt    time.Time // zero unless EditCount > 0
}

// Kind says whether a message is an ordinary one or an event that changes
// an earlier message of its conversation (wire: sequencer.v1.MessageKind).
type Kind int16

const (
	KindMessage Kind = 0 // an ordinary message
	KindEdit    Kind = 1 // replaces the body of TargetMsgID
	KindRecall  Kind = 2 // recalls TargetMsgID (its body is removed for good)
)

func (k Kind) String() string {
	switch k {
	case KindMessage:
		return "message"
	case KindEdit:
		return "edit"
	case KindRecall:
		return "recall"
	}
	return "unknown"
}

// IsEvent reports whether the message changes another one (Edit, Recall).
func (m *Message) IsEvent() bool { return m.Kind != KindMessage }

// ClientKey is the resend key of a message: a resend with the same key returns
// the first send's ids.
type ClientKey struct {
	FromUID     uint64
	ClientMsgID string
}

// Key returns the message's resend key.
func (m *Message) Key() ClientKey { return ClientKey{m.FromUID, m.ClientMsgID} }

// Limits of the API (docs/API.md, "Validation").
const (
	MaxConvIDLen      = 64
	MaxClientMsgIDLen = 64
	DefaultMaxBody    = 65536
	DefaultMsgType    = 1
	DefaultPullLimit  = 100
	MaxPullLimit      = 1000
)

// SendRequest is a validated Send: ids are not assigned yet.
type SendRequest struct {
	ConvID      string
	FromUID     uint64
	ClientMsgID string
	MsgType     int16 // already defaulted: 1..32767
	Body        []byte
	// An Edit or Recall (NewEditRequest, NewRecallRequest): Kind and the
	// target's msg_id; AsModerator lets a user other than the target's
	// sender act (the caller, the logic layer, authorized that).
	Kind        Kind
	TargetMsgID uint64
	AsModerator bool
}

// Key returns the request's resend key.
func (r *SendRequest) Key() ClientKey { return ClientKey{r.FromUID, r.ClientMsgID} }

// SendResult answers a Send: the ids of the stored message. Duplicate is true
// when this was a resend and the ids are the first send's.
type SendResult struct {
	MsgID     uint64
	Seq       uint64
	ServerAt  time.Time
	Duplicate bool
}
