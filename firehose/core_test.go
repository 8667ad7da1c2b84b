package firehose

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/ring"
)

var t0 = time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)

// msgs returns conv's messages seqs from..to.
func msgs(conv string, from, to uint64) []sequencer.Message {
	var out []sequencer.Message
	for s := from; s <= to; s++ {
		out = append(out, sequencer.Message{MsgID: 1000 + s, ConvID: conv, Seq: s, ServerAt: t0.Add(time.Duration(s) * time.Millisecond)})
	}
	return out
}

// Own is OwnHoldings of parts, each of epoch 0 (the publisher always
// passes its holdings' epochs; only these tests own bare partitions).
func (c *Core) Own(parts []uint32) (added []uint32) {
	hs := make([]Holding, len(parts))
	for i, p := range parts {
		hs[i] = Holding{Partition: p}
	}
	return c.OwnHoldings(hs)
}

// Scanned is ScannedGen of a scan begun in p's current holding (the
// publisher always passes its scan's generation).
func (c *Core) Scanned(p uint32, rows []persist.OutboxRow, done bool, now time.Time) {
	c.ScannedGen(p, c.Gen(p), rows, done, now)
}

// ownedCore returns a core of 1 partition, owned and scanned empty.
func ownedCore(cfg CoreConfig) *Core {
	cfg.Partitions = 1
	c := NewCore(cfg)
	c.Own([]uint32{0})
	c.Scanned(0, nil, true, t0)
	return c
}

func next(t *testing.T, c *Core) Action {
	t.Helper()
	a, ok := c.Next()
	if !ok {
		t.Fatalf("no action, want one")
	}
	return a
}

func none(t *testing.T, c *Core) {
	t.Helper()
	if a, ok := c.Next(); ok {
		t.Fatalf("unexpected action %+v", a)
	}
}

func wantPublish(t *testing.T, a Action, conv string, seq uint64) {
	t.Helper()
	if a.Kind != Publish || a.ConvID != conv || a.Msg.Seq != seq {
		t.Fatalf("action %v %s seq %d (read after %d), want publish %s seq %d", a.Kind, a.ConvID, a.Msg.Seq, a.After, conv, seq)
	}
}

// publishThrough takes the next actions, which must publish conv's seqs
// from..to one at a time, and acknowledges each.
func publishThrough(t *testing.T, c *Core, conv string, from, to uint64) {
	t.Helper()
	for s := from; s <= to; s++ {
		a := next(t, c)
		wantPublish(t, a, conv, s)
		c.Published(a, nil)
	}
}

func TestOneInFlightPerConversationInSeqOrder(t *testing.T) {
	c := ownedCore(CoreConfig{})
	c.Live("a", msgs("a", 1, 3))
	c.Live("b", msgs("b", 1, 1))
	a1 := next(t, c)
	b1 := next(t, c)
	wantPublish(t, a1, "a", 1)
	wantPublish(t, b1, "b", 1)
	none(t, c) // a:2 waits for a:1's ack
	c.Published(a1, errors.New("timeout"))
	again := next(t, c)
	wantPublish(t, again, "a", 1) // never skipped, never overtaken
	c.Published(again, nil)
	a2 := next(t, c)
	wantPublish(t, a2, "a", 2)
	none(t, c)
	c.Published(a2, nil)
	wantPublish(t, next(t, c), "a", 3)
}

func TestCursorMovesOnlyOverAcknowledgedSeqs(t *testing.T) {
	c := ownedCore(CoreConfig{})
	c.Live("a", msgs("a", 1, 3))
	a1 := next(t, c)
	if mv := c.Moves(); len(mv) != 0 {
		t.Fatalf("moves before any ack: %+v", mv)
	}
	c.Published(a1, nil)
	a2 := next(t, c)
	c.Published(a2, errors.New("nack"))
	mv := c.Moves()
	if len(mv) != 1 || mv[0] != (persist.OutboxMove{Partition: 0, ConvID: "a", To: 1}) {
		t.Fatalf("moves = %+v, want a to 1", mv)
	}
	c.Advanced(mv, errors.New("store down"), t0)
	if mv2 := c.Moves(); len(mv2) != 1 || mv2[0].To != 1 {
		t.Fatalf("a failed advance is not owed again: %+v", mv2)
	}
	// Everything acknowledged and stored: the conversation is forgotten,
	// and its next batch starts where the batch starts.
	for i := 0; i < 2; i++ {
		a := next(t, c)
		c.Published(a, nil)
	}
	c.Advanced(c.Moves(), nil, t0)
	if l, _ := c.Lag(); l.Messages != 0 || len(c.convs) != 0 {
		t.Fatalf("lag %+v, %d conversations kept, want none", l, len(c.convs))
	}
	c.Live("a", msgs("a", 4, 4))
	wantPublish(t, next(t, c), "a", 4)
}

func TestNothingPublishedBeforeTheScanEnds(t *testing.T) {
	c := NewCore(CoreConfig{Partitions: 1})
	c.Own([]uint32{0})
	c.Live("a", msgs("a", 6, 7)) // committed after the outbox said a owes 3..5
	none(t, c)
	c.Scanned(0, []persist.OutboxRow{{Partition: 0, ConvID: "a", Published: 2, Head: 5}}, false, t0)
	none(t, c)
	c.Scanned(0, nil, true, t0)
	rd := next(t, c)
	if rd.Kind != Read || rd.After != 2 || rd.Limit != 3 {
		t.Fatalf("action %+v, want a read of a after 2, 3 messages", rd)
	}
	none(t, c)
	c.Filled(rd, msgs("a", 3, 5), nil)
	publishThrough(t, c, "a", 3, 7)
	none(t, c)
	if l, _ := c.Lag(); l.Messages != 0 {
		t.Fatalf("lag %+v after publishing everything", l)
	}
}

// A scan that began before its partition was dropped and owned again must
// not count as the new ownership's scan: its rows may predate what another
// owner committed meanwhile. Here conversation a got its first messages
// (1..5, unpublished) from another owner after the old scan read an empty
// outbox; had the old scan's end marked the partition scanned, a's next
// live batch (6) would have started a at 6 and 1..5 would never be
// published.
func TestAScanOfAnEarlierOwnershipIsIgnored(t *testing.T) {
	c := NewCore(CoreConfig{Partitions: 1})
	c.Own([]uint32{0})
	g1 := c.Gen(0)
	c.Own(nil)
	if c.Gen(0) != 0 {
		t.Fatalf("Gen of a dropped partition = %d, want 0", c.Gen(0))
	}
	c.Own([]uint32{0})
	g2 := c.Gen(0)
	if g1 == 0 || g2 == g1 {
		t.Fatalf("generations %d then %d, want two different, non-zero", g1, g2)
	}
	c.ScannedGen(0, g1, nil, true, t0) // the old scan ends: ignored
	c.Live("a", msgs("a", 6, 6))
	none(t, c)
	if l, _ := c.Lag(); l.Syncing != 1 {
		t.Fatalf("lag %+v, want the partition still syncing", l)
	}
	c.ScannedGen(0, g2, []persist.OutboxRow{{Partition: 0, ConvID: "a", Published: 0, Head: 6}}, true, t0)
	rd := next(t, c)
	if rd.Kind != Read || rd.ConvID != "a" || rd.After != 0 || rd.Limit != 5 {
		t.Fatalf("action %+v, want a read of a after 0, 5 messages", rd)
	}
	c.Filled(rd, msgs("a", 1, 5), nil)
	publishThrough(t, c, "a", 1, 6)
	none(t, c)
}

// A partition held with a new epoch was taken again (another node may
// have held it between two polls): it is a new holding, dropped and added,
// with a new generation, to be scanned before it publishes; the same epoch
// again changes nothing.
func TestANewEpochIsANewHolding(t *testing.T) {
	c := NewCore(CoreConfig{Partitions: 2})
	if added := c.OwnHoldings([]Holding{{0, 1}, {1, 1}}); len(added) != 2 {
		t.Fatalf("added %v, want both", added)
	}
	c.Scanned(0, nil, true, t0)
	c.Scanned(1, nil, true, t0)
	p0 := ring.PartitionOf("a", 2)
	c.Live("a", msgs("a", 1, 1))
	g := c.Gen(p0)
	if added := c.OwnHoldings([]Holding{{0, 1}, {1, 1}}); len(added) != 0 {
		t.Fatalf("the same epochs again: added %v, want none", added)
	}
	hs := []Holding{{0, 1}, {1, 1}}
	hs[p0].Epoch = 2
	if added := c.OwnHoldings(hs); len(added) != 1 || added[0] != p0 {
		t.Fatalf("a new epoch of partition %d: added %v", p0, added)
	}
	if c.Gen(p0) == g {
		t.Fatalf("partition %d kept its generation %d under a new epoch", p0, g)
	}
	none(t, c) // a's live batch went with the old holding; nothing before the new scan
	if l, _ := c.Lag(); l.Syncing != 1 || l.Convs != 0 {
		t.Fatalf("lag %+v, want one partition syncing and no conversation", l)
	}
}

func TestLiveOverflowIsReadBack(t *testing.T) {
	c := ownedCore(CoreConfig{MaxQueued: 2})
	c.Live("a", msgs("a", 1, 5)) // only 1..2 kept in memory
	a1 := next(t, c)
	c.Published(a1, nil)
	a2 := next(t, c)
	c.Published(a2, nil)
	rd := next(t, c)
	if rd.Kind != Read || rd.After != 2 {
		t.Fatalf("action %+v, want a read after 2", rd)
	}
	c.Filled(rd, msgs("a", 3, 5), nil)
	publishThrough(t, c, "a", 3, 5)
}

func TestRetentionGapIsSkippedAndCounted(t *testing.T) {
	c := NewCore(CoreConfig{Partitions: 1})
	c.Own([]uint32{0})
	c.Scanned(0, []persist.OutboxRow{{ConvID: "a", Published: 0, Head: 6}}, true, t0)
	rd := next(t, c)
	c.Filled(rd, msgs("a", 4, 6), nil) // 1..3 were trimmed before they were published
	wantPublish(t, next(t, c), "a", 4)
	if l, _ := c.Lag(); l.Skipped != 3 {
		t.Fatalf("skipped = %d, want 3", l.Skipped)
	}
}

func TestDisownedPartitionStopsAndKeepsItsAcks(t *testing.T) {
	const parts = 4
	c := NewCore(CoreConfig{Partitions: parts})
	conv := "x"
	p := ring.PartitionOf(conv, parts)
	c.Own([]uint32{p})
	c.Scanned(p, nil, true, t0)
	c.Live(conv, msgs(conv, 1, 2))
	a1 := next(t, c)
	c.Own(nil) // handed off while a1 was in flight
	c.Published(a1, nil)
	none(t, c)
	mv := c.Moves()
	if len(mv) != 1 || mv[0].To != 1 || mv[0].Partition != p {
		t.Fatalf("moves after disowning = %+v, want %s to 1 in partition %d", mv, conv, p)
	}
	// Taken back: the outbox says where to start again; the old answer
	// cannot unlock the new publish.
	if added := c.Own([]uint32{p}); len(added) != 1 {
		t.Fatalf("Own again added %v", added)
	}
	c.Scanned(p, []persist.OutboxRow{{Partition: p, ConvID: conv, Published: 1, Head: 2}}, true, t0)
	rd := next(t, c)
	c.Published(a1, errors.New("late answer of the old action"))
	none(t, c)
	c.Filled(rd, msgs(conv, 2, 2), nil)
	wantPublish(t, next(t, c), conv, 2)
}

func TestInflightBound(t *testing.T) {
	c := ownedCore(CoreConfig{MaxInflight: 3})
	for i := 0; i < 5; i++ {
		conv := fmt.Sprintf("c%d", i)
		c.Live(conv, msgs(conv, 1, 1))
	}
	var acts []Action
	for {
		a, ok := c.Next()
		if !ok {
			break
		}
		acts = append(acts, a)
	}
	if len(acts) != 3 {
		t.Fatalf("%d actions in flight, want 3", len(acts))
	}
	c.Published(acts[0], nil)
	next(t, c)
	none(t, c)
}

// TestSweepOnlyRowsIdleForAWhile: a conversation published in full is
// swept after SweepAfter without a batch; a batch in between keeps its row;
// a row the scan finds published in full is swept too; a failed sweep is
// retried; a partition handed off is left to its new owner.
func TestSweepOnlyRowsIdleForAWhile(t *testing.T) {
	c := ownedCore(CoreConfig{})
	publishAll := func(conv string, from, to uint64, at time.Time) {
		c.Live(conv, msgs(conv, from, to))
		for s := from; s <= to; s++ {
			c.Published(next(t, c), nil)
		}
		c.Advanced(c.Moves(), nil, at)
	}
	publishAll("a", 1, 2, t0)
	publishAll("b", 1, 1, t0)
	if k := c.Sweepable(t0.Add(5*time.Second), 10*time.Second, 100); len(k) != 0 {
		t.Fatalf("swept %+v after 5 s, want nothing before 10 s", k)
	}
	c.Live("b", msgs("b", 2, 2)) // written again: kept
	c.Scanned(0, []persist.OutboxRow{{ConvID: "c", Published: 4, Head: 4}, {ConvID: "d", Published: 1, Head: 3}}, true, t0)
	k := c.Sweepable(t0.Add(10*time.Second), 10*time.Second, 100)
	want := []persist.OutboxKey{{ConvID: "a"}, {ConvID: "c"}}
	if fmt.Sprint(k) != fmt.Sprint(want) {
		t.Fatalf("swept %+v, want %+v (b was written again, d owes 2 and 3)", k, want)
	}
	if k := c.Sweepable(t0.Add(20*time.Second), 10*time.Second, 100); len(k) != 0 {
		t.Fatalf("swept %+v again before Swept answered", k)
	}
	c.Swept(want, errors.New("store down"), t0.Add(10*time.Second))
	if k := c.Sweepable(t0.Add(20*time.Second), 10*time.Second, 1); len(k) != 1 || k[0].ConvID != "a" {
		t.Fatalf("after a failed sweep, limit 1: %+v, want a", k)
	}
	c.Own(nil)
	if k := c.Sweepable(t0.Add(time.Hour), 10*time.Second, 100); len(k) != 0 {
		t.Fatalf("swept %+v of a partition handed off", k)
	}
}

// TestReadsBoundedByMaxReads: conversations that need a store read wait
// for a read slot (a drain of thousands of conversations must not queue
// thousands of reads on the store's pool); publishes do not wait.
func TestReadsBoundedByMaxReads(t *testing.T) {
	c := NewCore(CoreConfig{Partitions: 1, MaxReads: 1})
	c.Own([]uint32{0})
	c.Scanned(0, []persist.OutboxRow{{ConvID: "a", Head: 2}, {ConvID: "b", Head: 1}}, true, t0)
	c.Live("c", msgs("c", 1, 1))
	var reads []Action
	for a, ok := c.Next(); ok; a, ok = c.Next() {
		switch a.Kind {
		case Read:
			reads = append(reads, a)
		case Publish:
			wantPublish(t, a, "c", 1)
		}
	}
	if len(reads) != 1 {
		t.Fatalf("%d reads in flight, want 1 (MaxReads)", len(reads))
	}
	heads := map[string]uint64{"a": 2, "b": 1}
	c.Filled(reads[0], msgs(reads[0].ConvID, 1, heads[reads[0].ConvID]), nil)
	got := map[Kind]int{}
	for a, ok := c.Next(); ok; a, ok = c.Next() {
		got[a.Kind]++
	}
	if got[Read] != 1 || got[Publish] != 1 {
		t.Fatalf("after the read: %v, want the parked conversation's read and the read one's publish", got)
	}
}
