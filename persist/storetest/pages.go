package storetest

import (
	"math"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// pageCases are the persist.PageReader subtests (Run runs them).
var pageCases = []struct {
	name string
	fn   func(x *suite)
}{
	{"ReadBefore", testReadBefore},
	{"ReadMany", testReadMany},
	{"ReadManyAfterTrim", testReadManyAfterTrim},
}

func testReadBefore(x *suite) {
	t := x.t
	a, b := x.conv(), x.conv()
	var all []sequencer.Message
	for prev := uint64(0); prev < 10; prev += 5 {
		ba := batch(a, prev, 5)
		all = append(all, ba.Messages...)
		x.mustCommit(batch(b, prev, 5), ba)
	}
	check := func(after, before uint64, limit int, from, to int) {
		t.Helper()
		got, err := x.s.ReadBefore(x.ctx, a, after, before, limit)
		if err != nil {
			t.Fatalf("ReadBefore(after %d, before %d, limit %d): %v", after, before, limit, err)
		}
		want := all[from:to]
		if len(got) != len(want) {
			t.Fatalf("ReadBefore(after %d, before %d, limit %d): %d messages, want %d", after, before, limit, len(got), len(want))
		}
		for i := range want {
			sameMessage(t, got[i], want[i])
		}
	}
	check(0, 11, 3, 7, 10)             // the newest 3
	check(0, math.MaxUint64, 3, 7, 10) // above the head: from the head
	check(0, 8, 3, 4, 7)               // seqs 5..7
	check(0, 3, 100, 0, 2)             // seqs 1..2
	check(4, 8, 100, 4, 7)             // 4 < seq < 8
	check(5, 6, 100, 5, 5)             // empty range
	check(0, 1, 100, 0, 0)             // nothing below 1
	check(0, 11, 0, 0, 0)              // limit 0
	check(math.MaxUint64-1, math.MaxUint64, 10, 10, 10)
	if ms, err := x.s.ReadBefore(x.ctx, x.conv(), 0, 100, 10); err != nil || len(ms) != 0 {
		t.Fatalf("ReadBefore of an unknown conversation = %d messages, %v", len(ms), err)
	}
}

func (x *suite) readMany(cursors []persist.Cursor, limit, total int) []persist.Page {
	x.t.Helper()
	pages, err := x.s.ReadMany(x.ctx, cursors, limit, total)
	if err != nil {
		x.t.Fatalf("ReadMany: %v", err)
	}
	if len(pages) != len(cursors) {
		x.t.Fatalf("ReadMany: %d pages for %d cursors", len(pages), len(cursors))
	}
	return pages
}

func testReadMany(x *suite) {
	t := x.t
	const n = 30
	convs := make([]string, n)
	stored := map[string][]sequencer.Message{}
	var bs []persist.ConvBatch
	for i := range convs {
		convs[i] = x.conv()
		if i%3 == 2 {
			continue // never written
		}
		b := batch(convs[i], 0, 1+i%7)
		stored[convs[i]] = b.Messages
		bs = append(bs, b)
	}
	x.mustCommit(bs...)
	// Every cursor, in reverse order, some after the head.
	cursors := make([]persist.Cursor, n)
	for i := range cursors {
		c := convs[n-1-i]
		cursors[i] = persist.Cursor{ConvID: c, AfterSeq: uint64(i % 4)}
	}
	check := func(limit, total int) {
		t.Helper()
		pages := x.readMany(cursors, limit, total)
		left := total
		for i, cur := range cursors {
			all := stored[cur.ConvID]
			if pages[i].Head != uint64(len(all)) {
				t.Fatalf("limit %d total %d: page %d (%s) head %d, want %d", limit, total, i, cur.ConvID, pages[i].Head, len(all))
			}
			var want []sequencer.Message
			if cur.AfterSeq < uint64(len(all)) {
				want = all[cur.AfterSeq:]
			}
			want = want[:min(len(want), limit, left)]
			left -= len(want)
			got := pages[i].Messages
			if len(got) != len(want) {
				t.Fatalf("limit %d total %d: page %d (%s after %d): %d messages, want %d", limit, total, i, cur.ConvID, cur.AfterSeq, len(got), len(want))
			}
			for k := range want {
				sameMessage(t, got[k], want[k])
			}
		}
	}
	check(100, 10_000)
	check(2, 10_000)
	check(100, 17) // cut part-way through, in cursor order
	check(100, 0)  // heads only
	check(0, 100)  // heads only
	one := x.readMany([]persist.Cursor{{ConvID: convs[0], AfterSeq: math.MaxUint64}}, 10, 10)
	if one[0].Head != 1 || len(one[0].Messages) != 0 {
		t.Fatalf("cursor at MaxUint64: head %d, %d messages; want 1, 0", one[0].Head, len(one[0].Messages))
	}
}

func testReadManyAfterTrim(x *suite) {
	t := x.t
	a := x.conv()
	x.mustCommit(batch(a, 0, 6))
	if err := x.s.Trim(x.ctx, a, 4); err != nil {
		t.Fatalf("Trim: %v", err)
	}
	p := x.readMany([]persist.Cursor{{ConvID: a}}, 100, 100)[0]
	if p.Head != 6 || len(p.Messages) != 2 || p.Messages[0].Seq != 5 {
		t.Fatalf("after trimming 1..4 of 6: head %d, %d messages; want head 6, seqs 5..6", p.Head, len(p.Messages))
	}
	ms, err := x.s.ReadBefore(x.ctx, a, 0, 100, 10)
	if err != nil || len(ms) != 2 || ms[0].Seq != 5 {
		t.Fatalf("ReadBefore after trim: %d messages, %v; want seqs 5..6", len(ms), err)
	}
}
