package feed

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

func ms(conv string, seqs ...uint64) []sequencer.Message {
	out := make([]sequencer.Message, len(seqs))
	for i, s := range seqs {
		out[i] = sequencer.Message{ConvID: conv, Seq: s, MsgID: 1000 + s}
	}
	return out
}

func span(conv string, lo, hi uint64) []sequencer.Message {
	var seqs []uint64
	for s := lo; s <= hi; s++ {
		seqs = append(seqs, s)
	}
	return ms(conv, seqs...)
}

// render writes events as "a1 a2 T(a,5) ♥".
func render(evs []Event) string {
	var b []string
	for _, e := range evs {
		switch e.Kind {
		case KindMessage:
			b = append(b, fmt.Sprintf("%s%d", e.Msg.ConvID, e.Msg.Seq))
		case KindTruncated:
			b = append(b, fmt.Sprintf("T(%s,%d)", e.ConvID, e.OldestSeq))
		case KindHeartbeat:
			b = append(b, "♥")
		}
	}
	return strings.Join(b, " ")
}

func expect(t *testing.T, tl *Tail, want string) {
	t.Helper()
	if got := render(tl.Take()); got != want {
		t.Fatalf("events %q, want %q", got, want)
	}
}

func expectReads(t *testing.T, tl *Tail, want string) []persist.Cursor {
	t.Helper()
	rs := tl.Reads(1000)
	var b []string
	for _, r := range rs {
		b = append(b, fmt.Sprintf("%s@%d", r.ConvID, r.AfterSeq))
	}
	if got := strings.Join(b, " "); got != want {
		t.Fatalf("reads %q, want %q", got, want)
	}
	return rs
}

// Live messages that arrive while the backlog is read are held, and only
// those above the backlog's end go out after it: each seq once, in order.
func TestTailBacklogThenLive(t *testing.T) {
	tl := NewTail([]persist.Cursor{{ConvID: "a"}, {ConvID: "b", AfterSeq: 7}}, 100)
	expectReads(t, tl, "a@0 b@7")
	tl.Live("a", ms("a", 3))    // committed after the read began
	tl.Live("a", ms("a", 4, 5)) // and more
	expect(t, tl, "")
	tl.Backlog("a", persist.Page{Head: 3, Messages: span("a", 1, 3)}, false) // the read saw 1..3
	expect(t, tl, "a1 a2 a3 a4 a5")
	tl.Backlog("b", persist.Page{Head: 7}, false) // b is at its head
	expect(t, tl, "")
	tl.Live("b", ms("b", 8))
	tl.Live("a", ms("a", 5, 6)) // 5 again: dropped
	expect(t, tl, "b8 a6")
	if tl.ReadDue() {
		t.Fatal("a read is due with every conversation live")
	}
}

// A live message that is not last+1 asks for a read; the read fills the
// hole and the held message follows it.
func TestTailFillsHoles(t *testing.T) {
	tl := NewTail([]persist.Cursor{{ConvID: "a", AfterSeq: 4}}, 100)
	expectReads(t, tl, "a@4")
	tl.Backlog("a", persist.Page{Head: 4}, false)
	tl.Live("a", ms("a", 7)) // 5 and 6 were never published here (a handoff)
	expect(t, tl, "")
	expectReads(t, tl, "a@4")
	tl.Live("a", ms("a", 8))
	tl.Backlog("a", persist.Page{Head: 7, Messages: span("a", 5, 7)}, false)
	expect(t, tl, "a5 a6 a7 a8")
}

// A backlog larger than one page reads again from the last seq delivered.
func TestTailPagesTheBacklog(t *testing.T) {
	tl := NewTail([]persist.Cursor{{ConvID: "a"}}, 100)
	expectReads(t, tl, "a@0")
	tl.Backlog("a", persist.Page{Head: 5, Messages: span("a", 1, 2)}, false)
	expect(t, tl, "a1 a2")
	expectReads(t, tl, "a@2")
	// The read's budget ran out before a's turn: an empty page proves
	// nothing, read again.
	tl.Backlog("a", persist.Page{Head: 5}, true)
	expect(t, tl, "")
	expectReads(t, tl, "a@2")
	tl.Backlog("a", persist.Page{Head: 6, Messages: span("a", 3, 6)}, false)
	expect(t, tl, "a3 a4 a5 a6")
	expectReads(t, tl, "")
}

// Retention: a cursor below the oldest kept seq gets Truncated first, never
// a silent skip; everything gone continues after the head.
func TestTailTruncated(t *testing.T) {
	tl := NewTail([]persist.Cursor{{ConvID: "a", AfterSeq: 1}, {ConvID: "b"}, {ConvID: "c", AfterSeq: 4}}, 100)
	expectReads(t, tl, "a@1 b@0 c@4")
	tl.Backlog("a", persist.Page{Head: 9, Messages: span("a", 5, 9)}, false)
	tl.Backlog("b", persist.Page{Head: 3}, false)
	tl.Backlog("c", persist.Page{Head: 6, Messages: span("c", 5, 6)}, false) // nothing missing
	expect(t, tl, "T(a,5) a5 a6 a7 a8 a9 T(b,4) c5 c6")
	tl.Live("b", ms("b", 4))
	expect(t, tl, "b4")
}

// The held messages are bounded: past the bound the stream must end.
func TestTailOverflow(t *testing.T) {
	tl := NewTail([]persist.Cursor{{ConvID: "a"}, {ConvID: "b"}}, 3)
	expectReads(t, tl, "a@0 b@0")
	tl.Live("a", ms("a", 1, 2))
	tl.Live("a", ms("a", 2)) // a duplicate is not held twice
	tl.Live("b", ms("b", 1))
	if tl.Overflow() {
		t.Fatal("overflow at 3 held of 3")
	}
	tl.Live("b", ms("b", 2))
	if !tl.Overflow() {
		t.Fatal("no overflow at 4 held of 3")
	}
}

// Held messages are freed as they go out: a stream that keeps up never
// overflows however long it runs.
func TestTailHeldCountDrains(t *testing.T) {
	tl := NewTail([]persist.Cursor{{ConvID: "a"}}, 2)
	for round := uint64(0); round < 50; round++ {
		expectReads(t, tl, fmt.Sprintf("a@%d", 2*round))
		tl.Live("a", ms("a", 2*round+1, 2*round+2))
		tl.Backlog("a", persist.Page{Head: 2 * round}, false)
		expect(t, tl, fmt.Sprintf("a%d a%d", 2*round+1, 2*round+2))
		tl.Resync("a")
	}
	if tl.Overflow() {
		t.Fatal("overflow")
	}
}

// A failed read is due again; Resync of a live conversation reads it.
func TestTailUnreadAndResync(t *testing.T) {
	tl := NewTail([]persist.Cursor{{ConvID: "a"}}, 10)
	rs := expectReads(t, tl, "a@0")
	expectReads(t, tl, "") // handed out once
	tl.Unread(rs)
	expectReads(t, tl, "a@0")
	tl.Backlog("a", persist.Page{Head: 1, Messages: ms("a", 1)}, false)
	expect(t, tl, "a1")
	tl.Resync("a")
	tl.Live("a", ms("a", 2)) // held until the read
	expect(t, tl, "")
	expectReads(t, tl, "a@1")
	tl.Backlog("a", persist.Page{Head: 3, Messages: ms("a", 2, 3)}, false)
	expect(t, tl, "a2 a3")
	tl.Resync("nobody")
	expectReads(t, tl, "")
}
