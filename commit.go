package sequencer

import (
	"errors"
	"fmt"
	"strings"
)

// Fence is the ownership token a commit carries for one partition: the commit
// lands only if, inside its transaction, the partition is still held by Owner
// at Epoch. The zero Fence means "unfenced" (single node, no cluster tables).
type Fence struct {
	Partition uint32
	Owner     string
	Epoch     uint64
}

// IsZero reports whether f is the unfenced zero value.
func (f Fence) IsZero() bool { return f.Owner == "" && f.Epoch == 0 && f.Partition == 0 }

// ConvBatch is one conversation's share of a commit: Messages carry seqs
// PrevHead+1 .. PrevHead+len(Messages), in order. The commit moves the
// conversation's head from PrevHead to the last seq, and fails with
// ErrHeadMismatch if the stored head is not PrevHead.
type ConvBatch struct {
	ConvID   string
	PrevHead uint64
	Fence    Fence
	Messages []Message
	// MarkSendersRead: in the same transaction, each sender's read
	// position in ConvID is raised to their last seq in Messages (never
	// lowered): a user's own messages are read (persist.SenderMarks). The
	// group-commit writer sets it unless the server runs with
	// --send-marks-read=false.
	MarkSendersRead bool
	// Outbox, when On, makes the commit record in the same transaction
	// that this conversation has messages the firehose has not published
	// yet (persist.Outbox; package firehose).
	Outbox OutboxMark
	// RecallsOfUnedited, when set, says that no recall in Messages targets
	// a message with edit events (the writer's state of each target,
	// including this batch's own edits, has no edits): the store may skip
	// clearing edit events' bodies (issue 32: a recall of an unedited
	// message costs one target update, like an edit). Unset (the zero
	// value), the store clears them: always correct.
	RecallsOfUnedited bool
}

// OutboxMark says whether a commit records its conversation in the
// firehose's outbox, and under which ring partition.
type OutboxMark struct {
	On        bool
	Partition uint32
}

// LastSeq returns the seq the head moves to.
func (b *ConvBatch) LastSeq() uint64 { return b.PrevHead + uint64(len(b.Messages)) }

// ConflictKey names the unique key a conflicting row hit.
type ConflictKey int

const (
	KeyConvSeq     ConflictKey = iota + 1 // uk_conv_seq (conv_id, seq)
	KeyClientMsgID                        // uk_from_client (from_uid, client_msg_id)
	KeyMsgID                              // primary key msg_id
)

func (k ConflictKey) String() string {
	switch k {
	case KeyConvSeq:
		return "uk_conv_seq"
	case KeyClientMsgID:
		return "uk_from_client"
	case KeyMsgID:
		return "msg_id"
	}
	return "unknown"
}

// Conflict is one row of a batch that hit a unique key.
type Conflict struct {
	Key         ConflictKey
	ConvID      string
	Seq         uint64
	MsgID       uint64
	FromUID     uint64
	ClientMsgID string
}

// ConflictError reports every row of a commit that hit a unique key (taken
// by a stored row or by another row of the same batch). Nothing was written.
type ConflictError struct {
	Conflicts []Conflict
}

func (e *ConflictError) Error() string {
	var b strings.Builder
	b.WriteString("unique key conflict:")
	for i, c := range e.Conflicts {
		if i == 8 {
			fmt.Fprintf(&b, " (+%d more)", len(e.Conflicts)-8)
			break
		}
		fmt.Fprintf(&b, " %s(conv=%q seq=%d from=%d client=%q msg_id=%d)", c.Key, c.ConvID, c.Seq, c.FromUID, c.ClientMsgID, c.MsgID)
	}
	return b.String()
}

// AsConflict returns the *ConflictError in err's chain, if any.
func AsConflict(err error) (*ConflictError, bool) {
	var c *ConflictError
	ok := errors.As(err, &c)
	return c, ok
}

// HeadMismatchError reports conversations whose stored head was not the
// batch's PrevHead. Nothing was written. It wraps ErrHeadMismatch.
type HeadMismatchError struct {
	ConvIDs []string
}

func (e *HeadMismatchError) Error() string {
	return fmt.Sprintf("%v: %s", ErrHeadMismatch, strings.Join(e.ConvIDs, ","))
}
func (e *HeadMismatchError) Unwrap() error { return ErrHeadMismatch }

// StaleFenceError reports fences that no longer hold. Nothing was written.
// It wraps ErrStaleEpoch.
type StaleFenceError struct {
	Fences []Fence
}

func (e *StaleFenceError) Error() string {
	return fmt.Sprintf("%v: %v", ErrStaleEpoch, e.Fences)
}
func (e *StaleFenceError) Unwrap() error { return ErrStaleEpoch }

// ErrUnfenced refuses an unfenced commit (a node running without a cluster)
// in a store whose partitions a cluster holds: such a node would write
// conversations that cluster nodes own, outside their fences. Nothing was
// written. It wraps ErrStaleEpoch (retryable, not landed).
var ErrUnfenced = fmt.Errorf("%w: this database is used by a cluster (partition leases are held); a node without --cluster-listen may not write to it", ErrStaleEpoch)

// ErrRejected is a store's refusal of the data of a commit (a value the
// schema cannot hold: a data or integrity error other than the unique keys
// ConflictError names). Nothing was written. It names no conversation, so
// the group-commit writer splits the transaction to find the bad rows, and
// only their senders get it (invalid_argument: sending it again cannot
// help).
var ErrRejected = &Error{Code: CodeInvalidArgument, Msg: "the store refused this message"}

// Outcome is what a commit's error means for the rows it carried.
type Outcome int

const (
	OutcomeLanded    Outcome = iota // nil error: every row is durably stored
	OutcomeNotLanded                // nothing was written (and nothing will be)
	OutcomeUnknown                  // the rows may have landed, or may land later: Settle, then re-read
)

func (o Outcome) String() string {
	return [...]string{"landed", "not landed", "unknown"}[o]
}

// OutcomeOf is the ONE place that says what a commit's error means (see
// persist.Committer): refusals (conflict, head mismatch, stale fence,
// rejected data) and failures before COMMIT was sent (ErrStoreUnavailable)
// did not land; ErrUnknownOutcome and any error the contract does not name
// may have.
func OutcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeLanded
	case errors.Is(err, ErrUnknownOutcome):
		return OutcomeUnknown
	}
	if _, ok := AsConflict(err); ok {
		return OutcomeNotLanded
	}
	if errors.Is(err, ErrHeadMismatch) || errors.Is(err, ErrStaleEpoch) ||
		errors.Is(err, ErrStoreUnavailable) || errors.Is(err, ErrRejected) {
		return OutcomeNotLanded
	}
	return OutcomeUnknown
}
