package sequencer

// ReadState is one user's read position in one conversation, with the
// conversation's committed head. Because seqs are contiguous (1..Head, no
// holes), Head - ReadSeq is exactly the number of unread messages: no scan.
type ReadState struct {
	ConvID  string
	ReadSeq uint64 // 0 when the user never marked anything read
	Head    uint64 // the committed head (0 for a conversation never written)
}

// Unread is Head - ReadSeq (never negative: a position is clamped to the
// head when it is stored, and a head never goes down).
func (r ReadState) Unread() uint64 {
	if r.ReadSeq >= r.Head {
		return 0
	}
	return r.Head - r.ReadSeq
}

// HeadSeq is Head, under the wire's name (head_seq of MarkRead and
// GetReadState).
func (r ReadState) HeadSeq() uint64 { return r.Head }

// MaxReadStateConvs is the most conversations one read-state call may name.
const MaxReadStateConvs = 1000

// CheckUID checks a user id (MarkRead, GetReadState): > 0 and < 2^63, the
// same rule as a Send's from_uid.
func CheckUID(uid uint64) error {
	if uid == 0 || uid >= MaxID {
		return invalid("uid", "must be > 0 and < 2^63, got %d", uid)
	}
	return nil
}

// CheckMarkRead checks a mark-read request: a valid conv_id and uid, and a
// seq below 2^63 (0 is allowed and changes nothing; a seq above the head is
// clamped to the head by the store, not refused).
func CheckMarkRead(convID string, uid, seq uint64) error {
	if err := CheckConvID(convID); err != nil {
		return err
	}
	if err := CheckUID(uid); err != nil {
		return err
	}
	if seq >= MaxID {
		return invalid("seq", "must be < 2^63, got %d", seq)
	}
	return nil
}

// CheckReadStates checks a read-state request: a valid uid and
// 1..MaxReadStateConvs valid conv_ids (duplicates allowed). The error names
// the first bad conv_id by its index, never by its value.
func CheckReadStates(uid uint64, convIDs []string) error {
	if err := CheckUID(uid); err != nil {
		return err
	}
	if n := len(convIDs); n < 1 || n > MaxReadStateConvs {
		return invalid("conv_ids", "must hold 1..%d conversations, got %d", MaxReadStateConvs, n)
	}
	for i, c := range convIDs {
		if err := CheckConvID(c); err != nil {
			return Errorf(CodeInvalidArgument, "conv_ids[%d]: %s", i, err.Error())
		}
	}
	return nil
}
