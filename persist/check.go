package persist

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/sequencer-im/sequencer"
)

// CheckBatches validates a Commit's batches before any store is touched, the
// same way for every implementation:
//   - a plain error (code internal) for a batch that breaks ConvBatch's shape:
//     a conversation twice in one commit, a message of another conversation,
//     a seq outside PrevHead+1..LastSeq, an id at or above 2^63, an empty
//     ClientMsgID;
//   - a *ConflictError for rows of the batch that collide with an earlier row
//     of the same batch on a unique key (msg_id, uk_conv_seq, uk_from_client);
//     the first row holding a key is not reported, every later one is.
//
// Stores call it first in Commit; nil means only stored rows can conflict.
func CheckBatches(batches []ConvBatch) error { return checkBatches(batches, false) }

// CheckBatchesKeysPerConv is CheckBatches for a store whose resend key is
// unique per conversation (ConvScopedKeys): the same key in two
// conversations of one commit is no conflict.
func CheckBatchesKeysPerConv(batches []ConvBatch) error { return checkBatches(batches, true) }

func checkBatches(batches []ConvBatch, keysPerConv bool) error {
	type convKey struct {
		conv string
		key  sequencer.ClientKey
	}
	type convSeq struct {
		conv string
		seq  uint64
	}
	n := 0
	for i := range batches {
		n += len(batches[i].Messages)
	}
	convs := make(map[string]struct{}, len(batches))
	msgIDs := make(map[uint64]struct{}, n)
	seqs := make(map[convSeq]struct{}, n)
	keys := make(map[convKey]struct{}, n)
	var conflicts []Conflict
	for i := range batches {
		b := &batches[i]
		if _, dup := convs[b.ConvID]; dup {
			return fmt.Errorf("persist: invalid batch: conversation %q appears twice in one commit", b.ConvID)
		}
		convs[b.ConvID] = struct{}{}
		if b.LastSeq() >= math.MaxInt64 || b.LastSeq() < b.PrevHead {
			return fmt.Errorf("persist: invalid batch: conversation %q: head %d + %d messages overflows", b.ConvID, b.PrevHead, len(b.Messages))
		}
		for j := range b.Messages {
			m := &b.Messages[j]
			switch {
			case m.ConvID != b.ConvID:
				return fmt.Errorf("persist: invalid batch: message of conversation %q in the batch of %q", m.ConvID, b.ConvID)
			case m.Seq <= b.PrevHead || m.Seq > b.LastSeq():
				return fmt.Errorf("persist: invalid batch: conversation %q: seq %d outside %d..%d", b.ConvID, m.Seq, b.PrevHead+1, b.LastSeq())
			case m.MsgID >= 1<<63 || m.FromUID >= 1<<63:
				return fmt.Errorf("persist: invalid batch: conversation %q seq %d: msg_id %d / from_uid %d not below 2^63", b.ConvID, m.Seq, m.MsgID, m.FromUID)
			case m.ClientMsgID == "":
				return fmt.Errorf("persist: invalid batch: conversation %q seq %d: empty client_msg_id", b.ConvID, m.Seq)
			}
			c := Conflict{ConvID: m.ConvID, Seq: m.Seq, MsgID: m.MsgID, FromUID: m.FromUID, ClientMsgID: m.ClientMsgID}
			if _, dup := msgIDs[m.MsgID]; dup {
				c.Key = KeyMsgID
				conflicts = append(conflicts, c)
			}
			msgIDs[m.MsgID] = struct{}{}
			if _, dup := seqs[convSeq{m.ConvID, m.Seq}]; dup {
				c.Key = KeyConvSeq
				conflicts = append(conflicts, c)
			}
			seqs[convSeq{m.ConvID, m.Seq}] = struct{}{}
			k := convKey{key: m.Key()}
			if keysPerConv {
				k.conv = m.ConvID
			}
			if _, dup := keys[k]; dup {
				c.Key = KeyClientMsgID
				conflicts = append(conflicts, c)
			}
			keys[k] = struct{}{}
		}
	}
	if len(conflicts) > 0 {
		return &ConflictError{Conflicts: conflicts}
	}
	return nil
}

// Fences returns the distinct non-zero fences of batches, ordered by
// partition (then owner and epoch), and whether any batch is unfenced: what
// a store checks inside a commit's transaction. Every store collects them
// here, so they check (and lock) lease rows in the same order.
func Fences(batches []ConvBatch) (fences []Fence, unfenced bool) {
	for i := range batches {
		f := batches[i].Fence
		switch {
		case f.IsZero():
			unfenced = true
		case !slices.Contains(fences, f):
			fences = append(fences, f)
		}
	}
	slices.SortFunc(fences, func(a, b Fence) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), strings.Compare(a.Owner, b.Owner), cmp.Compare(a.Epoch, b.Epoch))
	})
	return fences, unfenced
}

// SortConflicts puts a ConflictError's rows in the order every store
// reports them: by conversation, seq, then key.
func SortConflicts(cs []Conflict) {
	slices.SortStableFunc(cs, func(a, b Conflict) int {
		return cmp.Or(strings.Compare(a.ConvID, b.ConvID), cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.Key, b.Key))
	})
}

// CheckHeads is the head compare-and-set outcome, written once: every
// batch's PrevHead must be its conversation's stored head (head, as read
// inside the commit's transaction; 0 for a conversation without one). It
// returns nil, or the *HeadMismatchError of the conversations that differ.
func CheckHeads(batches []ConvBatch, head func(convID string) uint64) error {
	var bad []string
	for i := range batches {
		if head(batches[i].ConvID) != batches[i].PrevHead {
			bad = append(bad, batches[i].ConvID)
		}
	}
	return HeadsMismatched(bad)
}

// HeadsMismatched is the refusal of a commit whose compare-and-set failed
// for convIDs (a store's SQL named them): a *HeadMismatchError listing them
// sorted, or nil when there are none.
func HeadsMismatched(convIDs []string) error {
	if len(convIDs) == 0 {
		return nil
	}
	convIDs = slices.Clone(convIDs)
	slices.Sort(convIDs)
	return &HeadMismatchError{ConvIDs: convIDs}
}
