package storetest

import (
	"sync"

	"github.com/sequencer-im/sequencer/persist"
)

// outboxCases are the persist.Outbox subtests (Run runs them): the
// firehose's durable cursor.
var outboxCases = []struct {
	name string
	fn   func(x *suite)
}{
	{"OutboxRecordsCommits", testOutboxRecords},
	{"OutboxAdvanceRaisesSweepDeletes", testOutboxAdvance},
	{"OutboxPendingPages", testOutboxPages},
	{"OutboxCommitRacesAdvanceAndSweep", testOutboxRace},
}

// outbox returns the store's Outbox (every store has one).
func (x *suite) outbox() persist.Outbox {
	x.t.Helper()
	o, ok := x.s.(persist.Outbox)
	if !ok {
		x.t.Fatalf("store %T does not implement persist.Outbox", x.s)
	}
	if _, err := o.OutboxPending(x.ctx, 0, "", 1); err != nil {
		x.t.Fatalf("OutboxPending: %v", err)
	}
	return o
}

func outboxed(b persist.ConvBatch, part uint32) persist.ConvBatch {
	b.Outbox = persist.OutboxMark{On: true, Partition: part}
	return b
}

func (x *suite) pending(o persist.Outbox, part uint32) map[string]persist.OutboxRow {
	x.t.Helper()
	out := map[string]persist.OutboxRow{}
	after := ""
	for {
		rows, err := o.OutboxPending(x.ctx, part, after, 2)
		if err != nil {
			x.t.Fatalf("OutboxPending(%d, %q): %v", part, after, err)
		}
		for _, r := range rows {
			if r.Partition != part {
				x.t.Fatalf("OutboxPending(%d) returned a row of partition %d", part, r.Partition)
			}
			if _, dup := out[r.ConvID]; dup || r.ConvID <= after {
				x.t.Fatalf("OutboxPending paging returned %q twice or out of order (after %q)", r.ConvID, after)
			}
			out[r.ConvID] = r
		}
		if len(rows) < 2 {
			return out
		}
		after = rows[len(rows)-1].ConvID
	}
}

func (x *suite) advance(o persist.Outbox, moves ...persist.OutboxMove) {
	x.t.Helper()
	if err := o.OutboxAdvance(x.ctx, moves); err != nil {
		x.t.Fatalf("OutboxAdvance: %v", err)
	}
}

func testOutboxRecords(x *suite) {
	t := x.t
	o := x.outbox()
	a, b, c := x.conv(), x.conv(), x.conv()
	x.mustCommit(batch(c, 0, 2)) // no mark: not recorded
	x.mustCommit(outboxed(batch(a, 0, 3), 7), outboxed(batch(b, 0, 1), 7), outboxed(batch(c, 2, 1), 7))
	got := x.pending(o, 7)
	want := map[string]persist.OutboxRow{
		a: {Partition: 7, ConvID: a, Published: 0, Head: 3},
		b: {Partition: 7, ConvID: b, Published: 0, Head: 1},
		c: {Partition: 7, ConvID: c, Published: 2, Head: 3}, // seqs before the first marked commit are not owed
	}
	if len(got) != len(want) {
		t.Fatalf("outbox of partition 7 = %+v, want %+v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Fatalf("outbox row of %q = %+v, want %+v", k, got[k], w)
		}
	}
	// A later commit moves only the head (the row's is the
	// conversation's); a refused one writes nothing.
	x.mustCommit(outboxed(batch(a, 3, 2), 7))
	x.commitFails(outboxed(batch(b, 0, 1), 7)) // head mismatch
	got = x.pending(o, 7)
	if got[a] != (persist.OutboxRow{Partition: 7, ConvID: a, Published: 0, Head: 5}) || got[b].Head != 1 {
		t.Fatalf("after a second commit and a refused one: %+v", got)
	}
	if n := len(x.pending(o, 8)); n != 0 {
		t.Fatalf("partition 8 has %d rows, want none", n)
	}
}

func (x *suite) sweep(o persist.Outbox, keys ...persist.OutboxKey) {
	x.t.Helper()
	if err := o.OutboxSweep(x.ctx, keys); err != nil {
		x.t.Fatalf("OutboxSweep: %v", err)
	}
}

func testOutboxAdvance(x *suite) {
	t := x.t
	o := x.outbox()
	a, b := x.conv(), x.conv()
	x.mustCommit(outboxed(batch(a, 0, 5), 3), outboxed(batch(b, 0, 2), 3))
	x.advance(o, persist.OutboxMove{Partition: 3, ConvID: a, To: 3})
	x.advance(o, persist.OutboxMove{Partition: 3, ConvID: a, To: 2}) // never down
	if r := x.pending(o, 3)[a]; r.Published != 3 || r.Head != 5 {
		t.Fatalf("after advancing to 3 then 2: %+v, want published 3 head 5", r)
	}
	// An advance to the head keeps the row (the next commit writes
	// nothing); a sweep deletes it, and leaves a row with a backlog.
	x.advance(o, persist.OutboxMove{Partition: 3, ConvID: a, To: 5}, persist.OutboxMove{Partition: 3, ConvID: b, To: 1})
	got := x.pending(o, 3)
	if got[a] != (persist.OutboxRow{Partition: 3, ConvID: a, Published: 5, Head: 5}) || got[b].Published != 1 {
		t.Fatalf("after advancing a to its head and b to 1: %+v, want a kept at 5 of 5, b at 1", got)
	}
	x.sweep(o, persist.OutboxKey{Partition: 3, ConvID: a}, persist.OutboxKey{Partition: 3, ConvID: b})
	got = x.pending(o, 3)
	if _, ok := got[a]; ok || got[b] != (persist.OutboxRow{Partition: 3, ConvID: b, Published: 1, Head: 2}) {
		t.Fatalf("after a sweep: %+v, want a gone, b kept at 1 of 2", got)
	}
	// A row that is not there is not created by an advance; the next
	// commit starts one at its previous head.
	x.advance(o, persist.OutboxMove{Partition: 3, ConvID: a, To: 9})
	x.sweep(o, persist.OutboxKey{Partition: 3, ConvID: a})
	if _, ok := x.pending(o, 3)[a]; ok {
		t.Fatalf("advancing or sweeping a missing row created it")
	}
	x.mustCommit(outboxed(batch(a, 5, 1), 3))
	if r := x.pending(o, 3)[a]; r.Published != 5 || r.Head != 6 {
		t.Fatalf("after a commit on a published conversation: %+v, want published 5 head 6", r)
	}
	// A row published in full that is written again is not swept: its
	// published seq is below the new head.
	x.advance(o, persist.OutboxMove{Partition: 3, ConvID: a, To: 6})
	x.mustCommit(outboxed(batch(a, 6, 2), 3))
	x.sweep(o, persist.OutboxKey{Partition: 3, ConvID: a})
	if r := x.pending(o, 3)[a]; r != (persist.OutboxRow{Partition: 3, ConvID: a, Published: 6, Head: 8}) {
		t.Fatalf("after a commit on a row published in full, then a sweep: %+v, want published 6 head 8", r)
	}
}

func testOutboxPages(x *suite) {
	t := x.t
	o := x.outbox()
	var bs []persist.ConvBatch
	for i := 0; i < 7; i++ {
		bs = append(bs, outboxed(batch(x.conv(), 0, 1), uint32(i%2)))
	}
	x.mustCommit(bs...)
	if n0, n1 := len(x.pending(o, 0)), len(x.pending(o, 1)); n0 != 4 || n1 != 3 {
		t.Fatalf("partitions 0 and 1 hold %d and %d rows, want 4 and 3", n0, n1)
	}
}

// testOutboxRace: a publisher advances to every head it sees and sweeps
// every row it finds published in full, while commits continue; a row may
// disappear only when everything up to the head was advanced over, so at
// the end either the row is there (owing seqs above its published one, or
// none) or the advances reached the final head.
func testOutboxRace(x *suite) {
	t := x.t
	o := x.outbox()
	c := x.conv()
	const commits = 60
	var wg sync.WaitGroup
	done := make(chan struct{})
	var maxTo uint64
	sweeps := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			rows, err := o.OutboxPending(x.ctx, 1, "", 10)
			if err != nil {
				t.Errorf("OutboxPending: %v", err)
				return
			}
			for _, r := range rows {
				if r.Published >= r.Head {
					sweeps++
					if err := o.OutboxSweep(x.ctx, []persist.OutboxKey{{Partition: 1, ConvID: r.ConvID}}); err != nil {
						t.Errorf("OutboxSweep: %v", err)
						return
					}
					continue
				}
				if err := o.OutboxAdvance(x.ctx, []persist.OutboxMove{{Partition: 1, ConvID: r.ConvID, To: r.Head}}); err != nil {
					t.Errorf("OutboxAdvance: %v", err)
					return
				}
				maxTo = max(maxTo, r.Head)
			}
		}
	}()
	for i := 0; i < commits; i++ {
		x.mustCommit(outboxed(batch(c, uint64(i), 1), 1))
	}
	close(done)
	wg.Wait()
	r, ok := x.pending(o, 1)[c]
	switch {
	case ok && (r.Head != commits || r.Published > maxTo):
		t.Fatalf("row after the race = %+v (advanced to %d), want head %d and published at most %d", r, maxTo, commits, maxTo)
	case !ok && maxTo != commits:
		t.Fatalf("row deleted but the publisher only advanced to %d of %d (%d sweeps)", maxTo, commits, sweeps)
	}
	t.Logf("%d sweeps raced %d commits", sweeps, commits)
}
