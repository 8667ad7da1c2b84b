package persist

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/sequencer-im/sequencer"
)

// The read-receipt rules, written once for every store: the own-send rule
// (SenderMarks: which positions a commit raises) and the receipt count
// (ReadReceipts: from the store's per-read_seq counts). A driver only
// holds the SQL of ReadCounts, ReadPositionsPage and its commit's upsert.

// BucketCount is one row of a driver's ReadCounts query: how many users'
// positions fall in bucket Bucket of the bounds (BucketSQL).
type BucketCount struct {
	Bucket int
	Users  uint64
}

// ReadPosition is one user's read position in one conversation.
type ReadPosition struct {
	UID     uint64
	ReadSeq uint64
}

// ReadReceipts answers GetReadReceipts from s: for each of seqs (checked
// with sequencer.CheckReadReceipts), how many users of convID have a read
// position >= it (the sender included). ONE store read: the seqs, sorted
// and distinct, are the bounds of ReadCounts, which counts the positions
// at or above the lowest one per bucket between two bounds, in one range
// of the conversation's positions (the primary key's conv_id range: no
// index on read_seq, so that marks update rows in place); the answer is
// the suffix sums. Its cost grows with the conversation's readers
// (log2(100) comparisons each), never with a scan of the readers per seq,
// and its answer is at most 100 rows.
func ReadReceipts(ctx context.Context, s ReadPositions, convID string, seqs []uint64) ([]uint64, error) {
	if err := sequencer.CheckReadReceipts(convID, seqs); err != nil {
		return nil, err
	}
	bounds := slices.Compact(slices.Sorted(slices.Values(seqs)))
	counts, err := s.ReadCounts(ctx, convID, bounds)
	if err != nil {
		return nil, err
	}
	if len(counts) != len(bounds) {
		return nil, sequencer.Errorf(sequencer.CodeInternal, "read receipts: the store answered %d counts for %d bounds", len(counts), len(bounds))
	}
	for i := len(counts) - 2; i >= 0; i-- {
		counts[i] += counts[i+1] // now: read_seq >= bounds[i]
	}
	out := make([]uint64, len(seqs))
	for i, seq := range seqs {
		j, _ := slices.BinarySearch(bounds, seq)
		out[i] = counts[j]
	}
	return out, nil
}

// BucketSQL is the SQL expression of col's bucket among n ascending
// bounds, param(i) naming bound i's placeholder: 0 below bounds[0], i+1
// for bounds[i] <= col < bounds[i+1], n at or above the last. A binary
// search written as nested CASE: a row costs about log2(n) comparisons.
func BucketSQL(col string, n int, param func(i int) string) string {
	var b strings.Builder
	var tree func(lo, hi int) // the buckets lo..hi
	tree = func(lo, hi int) {
		if lo == hi {
			b.WriteString(strconv.Itoa(lo))
			return
		}
		mid := (lo + hi + 1) / 2 // bucket >= mid iff col >= bounds[mid-1]
		b.WriteString("CASE WHEN " + col + " >= " + param(mid-1) + " THEN ")
		tree(mid, hi)
		b.WriteString(" ELSE ")
		tree(lo, mid-1)
		b.WriteString(" END")
	}
	tree(0, n)
	return b.String()
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
// 1..sequencer.MaxReceiptSeqs bounds, ascending, distinct, each 1..2^63-1.
func CheckReadCounts(convID string, bounds []uint64) error {
	if err := sequencer.CheckReadReceipts(convID, bounds); err != nil {
		return err
	}
	for i := 1; i < len(bounds); i++ {
		if bounds[i] <= bounds[i-1] {
			return sequencer.Errorf(sequencer.CodeInvalidArgument, "bounds: must ascend, no repeats: [%d] = %d after %d", i, bounds[i], bounds[i-1])
		}
	}
	return nil
}

// ScanBucketCount reads (bucket, count).
func ScanBucketCount(r Rows) (BucketCount, error) {
	var bucket, n int64
	err := r.Scan(&bucket, &n)
	return BucketCount{Bucket: int(bucket), Users: uint64(n)}, err
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

// ReadCountsArgs are a ReadCounts query's arguments in BucketSQL's
// numbered form: convID, then the bounds (as int64: the column's type).
func ReadCountsArgs(convID string, bounds []uint64) []any {
	args := make([]any, 1, 1+len(bounds))
	args[0] = convID
	for _, b := range bounds {
		args = append(args, int64(b))
	}
	return args
}

// ReadCountsOf is ReadCounts written once for every driver: the arguments
// checked (CheckReadCounts), then query, which runs the driver's SQL
// (BucketSQL over the positions of convID at or above bounds[0], grouped
// by bucket), folded into one count per bound.
func ReadCountsOf(convID string, bounds []uint64, query func() ([]BucketCount, error)) ([]uint64, error) {
	if err := CheckReadCounts(convID, bounds); err != nil {
		return nil, err
	}
	rows, err := query()
	if err != nil {
		return nil, err
	}
	out := make([]uint64, len(bounds))
	for _, r := range rows {
		if r.Bucket < 0 || r.Bucket > len(bounds) {
			return nil, sequencer.Errorf(sequencer.CodeInternal, "read counts: bucket %d of %d bounds", r.Bucket, len(bounds))
		}
		if r.Bucket > 0 {
			out[r.Bucket-1] += r.Users
		}
	}
	return out, nil
}
