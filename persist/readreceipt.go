package persist

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"github.com/sequencer-im/sequencer"
)

// The read-receipt rules, written once for every store: the own-send rule
// (SenderMarks: which positions a commit raises) and the receipt count
// (ReadReceipts: from the store's per-read_seq counts). A driver only
// holds the SQL of ReadCounts, ReadPositionsPage and its commit's upsert.

// ReadCount is how many users' read positions in one conversation stand at
// exactly ReadSeq.
type ReadCount struct {
	ReadSeq uint64
	Users   uint64
}

// ReadPosition is one user's read position in one conversation.
type ReadPosition struct {
	UID     uint64
	ReadSeq uint64
}

// ReadReceipts answers GetReadReceipts from s: for each of seqs (checked
// with sequencer.CheckReadReceipts), how many users of convID have a read
// position >= it (the sender included). ONE store read: the counts of
// every position at or above min(seqs), in read_seq order, from the
// (conv_id, read_seq) index; the answer is counted here. Its cost grows
// with the distinct positions at or above the lowest seq asked (at most
// the conversation's readers), not with the number of seqs.
func ReadReceipts(ctx context.Context, s ReadPositions, convID string, seqs []uint64) ([]uint64, error) {
	if err := sequencer.CheckReadReceipts(convID, seqs); err != nil {
		return nil, err
	}
	counts, err := s.ReadCounts(ctx, convID, slices.Min(seqs))
	if err != nil {
		return nil, err
	}
	return CountReadBy(seqs, counts), nil
}

// CountReadBy returns, for each of seqs, the users of counts whose
// read_seq >= it. counts may come in any order.
func CountReadBy(seqs []uint64, counts []ReadCount) []uint64 {
	c := slices.Clone(counts)
	slices.SortFunc(c, func(a, b ReadCount) int { return cmp.Compare(b.ReadSeq, a.ReadSeq) }) // highest first
	order := make([]int, len(seqs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(seqs[b], seqs[a]) })
	out := make([]uint64, len(seqs))
	var total uint64
	j := 0
	for _, i := range order { // seqs from the highest: a running sum
		for j < len(c) && c[j].ReadSeq >= seqs[i] {
			total += c[j].Users
			j++
		}
		out[i] = total
	}
	return out
}

// SenderMarks is the own-send rule of a commit: for the batches with
// MarkSendersRead, each (conversation, sender) with the highest seq the
// commit gives that sender there, sorted by (conv_id, uid) (the order a
// driver writes rows in, so concurrent commits lock them in one order).
// The driver raises each position to it in the commit's transaction, never
// lowering one (GREATEST). Nil when there is nothing to write.
func SenderMarks(batches []ConvBatch) []Mark {
	var marks []Mark
	for i := range batches {
		b := &batches[i]
		if !b.MarkSendersRead {
			continue
		}
		for j := range b.Messages {
			m := &b.Messages[j]
			marks = append(marks, Mark{ConvID: b.ConvID, UID: m.FromUID, Seq: m.Seq})
		}
	}
	if len(marks) == 0 {
		return nil
	}
	// By (conv, uid), the highest seq first; then keep the first of each.
	slices.SortFunc(marks, func(a, b Mark) int {
		if c := strings.Compare(a.ConvID, b.ConvID); c != 0 {
			return c
		}
		if c := cmp.Compare(a.UID, b.UID); c != 0 {
			return c
		}
		return cmp.Compare(b.Seq, a.Seq)
	})
	return slices.CompactFunc(marks, func(a, b Mark) bool { return a.ConvID == b.ConvID && a.UID == b.UID })
}

// CheckReadPositionsPage checks ReadPositionsPage's arguments (a driver
// calls it first): a valid conv_id, afterUID below 2^63, limit 1..
// sequencer.MaxReadPositions. Its error has code invalid_argument.
func CheckReadPositionsPage(convID string, afterUID uint64, limit int) error {
	if _, err := sequencer.ReadPositionsPage(convID, afterUID, 0); err != nil {
		return err
	}
	if limit < 1 || limit > sequencer.MaxReadPositions {
		return sequencer.Errorf(sequencer.CodeInvalidArgument, "limit: must be 1..%d, got %d", sequencer.MaxReadPositions, limit)
	}
	return nil
}

// CheckReadCounts checks ReadCounts' arguments: a valid conv_id and
// atLeast below 2^63.
func CheckReadCounts(convID string, atLeast uint64) error {
	if err := sequencer.CheckConvID(convID); err != nil {
		return err
	}
	if atLeast >= sequencer.MaxID {
		return sequencer.Errorf(sequencer.CodeInvalidArgument, "seq: must be < 2^63, got %d", atLeast)
	}
	return nil
}

// ScanReadCount reads (read_seq, count).
func ScanReadCount(r Rows) (ReadCount, error) {
	var seq, n int64
	err := r.Scan(&seq, &n)
	return ReadCount{ReadSeq: uint64(seq), Users: uint64(n)}, err
}

// ScanReadPosition reads (uid, read_seq).
func ScanReadPosition(r Rows) (ReadPosition, error) {
	var uid, seq int64
	err := r.Scan(&uid, &seq)
	return ReadPosition{UID: uint64(uid), ReadSeq: uint64(seq)}, err
}

// ReadPage is ReadPositionsPage written once for every driver: the
// arguments checked (CheckReadPositionsPage), then query, which reads up to
// n positions of the page in uid order (the driver's SQL, LIMIT n), asked
// for one more than limit to tell whether more follow.
func ReadPage(convID string, afterUID uint64, limit int, query func(n int) ([]ReadPosition, error)) ([]ReadPosition, bool, error) {
	if err := CheckReadPositionsPage(convID, afterUID, limit); err != nil {
		return nil, false, err
	}
	ps, err := query(limit + 1)
	if err != nil {
		return nil, false, err
	}
	if len(ps) > limit {
		return ps[:limit], true, nil
	}
	return ps, false, nil
}

// ReadCountsOf is ReadCounts written once for every driver: the arguments
// checked (CheckReadCounts), then query (the driver's SQL).
func ReadCountsOf(convID string, atLeast uint64, query func() ([]ReadCount, error)) ([]ReadCount, error) {
	if err := CheckReadCounts(convID, atLeast); err != nil {
		return nil, err
	}
	return query()
}
