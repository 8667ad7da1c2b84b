package storetest

import (
	"errors"
	"fmt"
	"slices"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// receiptCases are the own-send rule and read-receipt subtests (Run runs
// them).
var receiptCases = []struct {
	name string
	fn   func(x *suite)
}{
	{"SendMarksSenderRead", testSendMarksSenderRead},
	{"SendMarksReadAllOrNothing", testSendMarksReadAllOrNothing},
	{"SendMarksReadOff", testSendMarksReadOff},
	{"ReadReceipts", testReadReceipts},
	{"ReadPositionsPages", testReadPositionsPages},
	{"ReadReceiptsInvalid", testReadReceiptsInvalid},
}

// from builds conv's batch after prev with one message per sender, in
// order, and the own-send rule on.
func from(conv string, prev uint64, senders ...uint64) persist.ConvBatch {
	b := persist.ConvBatch{ConvID: conv, PrevHead: prev, MarkSendersRead: true}
	for i, uid := range senders {
		m := msg(conv, prev+uint64(i)+1)
		m.FromUID = uid
		b.Messages = append(b.Messages, m)
	}
	return b
}

// receipts asks the store, through persist.ReadReceipts, for seqs.
func (x *suite) receipts(conv string, seqs ...uint64) []uint64 {
	x.t.Helper()
	got, err := persist.ReadReceipts(x.ctx, x.positions(), conv, seqs)
	if err != nil {
		x.t.Fatalf("ReadReceipts(%q, %v): %v", conv, seqs, err)
	}
	return got
}

func testSendMarksSenderRead(x *suite) {
	a, b := x.conv(), x.conv()
	// Two conversations in one commit; uid 1 sends twice in a.
	x.mustCommit(from(a, 0, 1, 2, 1), from(b, 0, 3))
	x.expectState(a, 1, 3, 3)
	x.expectState(a, 2, 2, 3) // uid 2 has not read uid 1's later message
	x.expectState(a, 3, 0, 3) // not a sender of a
	x.expectState(b, 3, 1, 1)
	if u := x.states(1, a)[0].Unread(); u != 0 {
		x.t.Fatalf("unread of the last sender = %d, want 0", u)
	}
	// A position above the sender's new message is never lowered: uid 4
	// read up to 5, then sends at 6 (raised); uid 2 reads the head, then
	// a commit of other senders leaves it.
	x.mustCommit(from(a, 3, 2, 2))
	x.mark(a, 4, 5, 5, 5)
	x.mustCommit(from(a, 5, 4))
	x.expectState(a, 4, 6, 6)
	x.mark(a, 2, 6, 6, 6)
	x.mustCommit(from(a, 6, 1))
	x.expectState(a, 2, 6, 7)
	x.expectState(a, 1, 7, 7)
	if got, want := x.receipts(a, 1, 5, 6, 7), []uint64{3, 3, 3, 1}; !slices.Equal(got, want) {
		x.t.Fatalf("receipts = %v, want %v", got, want)
	}
}

func testSendMarksReadAllOrNothing(x *suite) {
	a, b := x.conv(), x.conv()
	x.mustCommit(from(b, 0, 9))
	// b's batch is stale (head 1, not 0): nothing of the commit lands,
	// positions included.
	err := x.commit(from(a, 0, 5), from(b, 0, 6))
	if !errors.Is(err, sequencer.ErrHeadMismatch) {
		x.t.Fatalf("commit with a stale batch: %v, want ErrHeadMismatch", err)
	}
	x.expectState(a, 5, 0, 0)
	x.expectState(b, 6, 0, 1)
	if ps, _, err := x.positions().ReadPositionsPage(x.ctx, a, 0, 10); err != nil || len(ps) != 0 {
		x.t.Fatalf("positions of a after a refused commit: %v, %v; want none", ps, err)
	}
}

func testSendMarksReadOff(x *suite) {
	c := x.conv()
	b := from(c, 0, 5, 6)
	b.MarkSendersRead = false
	x.mustCommit(b)
	x.expectState(c, 5, 0, 2)
	x.expectState(c, 6, 0, 2)
}

func testReadReceipts(x *suite) {
	c := x.conv()
	x.mustCommit(batch(c, 0, 10))
	// Positions: uid 100+i at i for i = 1..10, and two more users at 10.
	for i := uint64(1); i <= 10; i++ {
		x.mark(c, 100+i, i, i, 10)
	}
	x.mark(c, 200, 10, 10, 10)
	x.mark(c, 201, 10, 10, 10)
	other := x.conv() // positions of another conversation never count
	x.mustCommit(batch(other, 0, 10))
	x.mark(other, 300, 10, 10, 10)

	seqs := []uint64{10, 1, 5, 5, 11, 9, sequencer.MaxID - 1}
	want := []uint64{3, 12, 8, 8, 0, 4, 0}
	if got := x.receipts(c, seqs...); !slices.Equal(got, want) {
		x.t.Fatalf("receipts(%v) = %v, want %v", seqs, got, want)
	}
	if got := x.receipts(x.conv(), 1); !slices.Equal(got, []uint64{0}) {
		x.t.Fatalf("receipts of an empty conversation = %v, want [0]", got)
	}
	// 100 seqs at once (the most a call may name).
	many := make([]uint64, sequencer.MaxReceiptSeqs)
	for i := range many {
		many[i] = uint64(i%10) + 1
	}
	got := x.receipts(c, many...)
	for i, s := range many {
		if w := want1to10(s); got[i] != w {
			x.t.Fatalf("receipts of 100 seqs: [%d] (seq %d) = %d, want %d", i, s, got[i], w)
		}
	}
	counts, err := x.positions().ReadCounts(x.ctx, c, []uint64{2, 9, 10, 12})
	if err != nil {
		x.t.Fatal(err)
	}
	if w := []uint64{7, 1, 3, 0}; !slices.Equal(counts, w) {
		x.t.Fatalf("ReadCounts([2 9 10 12]) = %v, want %v (one count per bucket between bounds)", counts, w)
	}
}

// want1to10 is testReadReceipts' count for seq s in 1..10: users 100+s..110,
// 200 and 201.
func want1to10(s uint64) uint64 { return 10 - s + 1 + 2 }

func testReadPositionsPages(x *suite) {
	c := x.conv()
	x.mustCommit(batch(c, 0, 50))
	var want []persist.ReadPosition
	for i := uint64(1); i <= 25; i++ {
		uid := 1000 - 7*i // marked in descending uid order; listed ascending
		x.mark(c, uid, 2*i, 2*i, 50)
		want = append(want, persist.ReadPosition{UID: uid, ReadSeq: 2 * i})
	}
	other := x.conv()
	x.mustCommit(batch(other, 0, 1))
	x.mark(other, 1, 1, 1, 1)
	slices.SortFunc(want, func(a, b persist.ReadPosition) int { return int(a.UID) - int(b.UID) })
	var got []persist.ReadPosition
	after, pages := uint64(0), 0
	for {
		ps, more, err := x.positions().ReadPositionsPage(x.ctx, c, after, 10)
		if err != nil {
			x.t.Fatal(err)
		}
		pages++
		got = append(got, ps...)
		if !more {
			break
		}
		if len(ps) != 10 {
			x.t.Fatalf("a page with more after it holds %d positions, want 10", len(ps))
		}
		after = ps[len(ps)-1].UID
	}
	if !slices.Equal(got, want) || pages != 3 {
		x.t.Fatalf("pages = %d, positions = %v; want 3 pages of %v", pages, got, want)
	}
	// A page that ends exactly at the last position says no more.
	ps, more, err := x.positions().ReadPositionsPage(x.ctx, c, want[14].UID, 10)
	if err != nil || more || len(ps) != 10 {
		x.t.Fatalf("last full page: %d positions, more=%v, %v; want 10, false", len(ps), more, err)
	}
}

func testReadReceiptsInvalid(x *suite) {
	c := x.conv()
	rp := x.positions()
	invalid := func(what string, err error) {
		x.t.Helper()
		if err == nil || sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
			x.t.Fatalf("%s: got %v, want invalid_argument", what, err)
		}
	}
	for name, seqs := range map[string][]uint64{
		"no seqs": nil, "101 seqs": make([]uint64, 101), "seq 0": {1, 0}, "seq 2^63": {sequencer.MaxID},
	} {
		_, err := persist.ReadReceipts(x.ctx, rp, c, seqs)
		invalid("ReadReceipts "+name, err)
	}
	_, err := persist.ReadReceipts(x.ctx, rp, "", []uint64{1})
	invalid("ReadReceipts empty conv", err)
	_, err = rp.ReadCounts(x.ctx, "g:\xff", []uint64{1})
	invalid("ReadCounts bad conv", err)
	_, err = rp.ReadCounts(x.ctx, c, []uint64{2, 2})
	invalid("ReadCounts repeated bound", err)
	_, err = rp.ReadCounts(x.ctx, c, []uint64{3, 2})
	invalid("ReadCounts descending bounds", err)
	for _, tc := range []struct {
		conv  string
		after uint64
		limit int
	}{{"", 0, 1}, {c, sequencer.MaxID, 1}, {c, 0, 0}, {c, 0, sequencer.MaxReadPositions + 1}} {
		_, _, err := rp.ReadPositionsPage(x.ctx, tc.conv, tc.after, tc.limit)
		invalid(fmt.Sprintf("ReadPositionsPage(%q, %d, %d)", tc.conv, tc.after, tc.limit), err)
	}
}
