package console

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
)

// parts splits total partitions between owners, in order.
func parts(total int, owners ...string) []Partition {
	out := make([]Partition, total)
	for i := range out {
		out[i].Owner = owners[i*len(owners)/total]
	}
	return out
}

func members(ids ...string) []Member {
	var out []Member
	for _, id := range ids {
		leaving := strings.HasSuffix(id, "-")
		out = append(out, Member{NodeID: strings.TrimSuffix(id, "-"), APIAddr: "127.0.0.1:1", Leaving: leaving})
	}
	return out
}

// The story of a 3-node cluster as n1 sees it: n3 joins, n2 is killed and
// n1 takes its partitions (a failover over two samples, one event), n3
// drains and leaves and n1 takes its partitions (a handoff).
func TestObserverTellsTheStory(t *testing.T) {
	o := observer{self: "n1"}
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	steps := []struct {
		v       uint64
		members []Member
		parts   []Partition
		want    []string // kind node from partitions, of new events
	}{
		{1, members("n1", "n2"), parts(12, "n1", "n2"), nil}, // the first view is not news
		{2, members("n1", "n2", "n3"), parts(12, "n1", "n1", "n2", "n2", "n3", "n3"), []string{"join n3"}},
		{3, members("n1", "n3"), parts(12, "n1", "n1", "", "", "n3", "n3"), []string{"death n2"}}, // n2's partitions without an owner
		{3, members("n1", "n3"), parts(12, "n1", "n1", "n1", "", "n3", "n3"), []string{"failover n1 n2 2"}},
		{3, members("n1", "n3"), parts(12, "n1", "n1", "n1", "n1", "n3", "n3"), nil}, // merged into the failover: 4
		{4, members("n1", "n3-"), parts(12, "n1", "n1", "n1", "n1", "n3", "n3"), []string{"drain n3"}},
		{4, members("n1", "n3-"), parts(12, "n1"), []string{"handoff n1 n3 4"}},
		{5, members("n1"), parts(12, "n1"), []string{"leave n3"}},
	}
	seen := 0
	for i, st := range steps {
		o.observe(at(i*5), st.v, st.members, st.parts)
		var got []string
		for _, e := range o.events[seen:] {
			s := e.Kind + " " + e.Node
			if e.Kind == EventHandoff || e.Kind == EventFailover {
				s += " " + e.From + " " + itoa(e.Partitions)
			}
			got = append(got, s)
		}
		if strings.Join(got, ", ") != strings.Join(st.want, ", ") {
			t.Fatalf("step %d: events %q, want %q", i, got, st.want)
		}
		seen = len(o.events)
	}
	if f := o.events[2]; f.Kind != EventFailover || f.Partitions != 4 || !strings.Contains(f.Detail, "4 partitions of n2") || f.At != at(20) {
		t.Fatalf("failover event %+v: want 4 partitions of n2 at the last sample that took some", f)
	}
	for _, e := range o.events {
		if e.At.Location() != time.UTC || e.Observer != "n1" {
			t.Fatalf("event %+v: want UTC, observer n1", e)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// A membership event seen by several nodes is listed once (the earliest
// sighting); takes come from their taker; newest first.
func TestMergeEvents(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	n1 := []Event{{At: t0.Add(2 * time.Second), Kind: EventDeath, Node: "n3", MembershipVersion: "5", Observer: "n1"},
		{At: t0.Add(4 * time.Second), Kind: EventFailover, Node: "n1", From: "n3", Partitions: 40, Observer: "n1"}}
	n2 := []Event{{At: t0.Add(1 * time.Second), Kind: EventDeath, Node: "n3", MembershipVersion: "5", Observer: "n2"},
		{At: t0.Add(3 * time.Second), Kind: EventFailover, Node: "n2", From: "n3", Partitions: 50, Observer: "n2"}}
	got := mergeEvents(n1, n2)
	if len(got) != 3 || got[0].Node != "n1" || got[1].Node != "n2" || got[2].Kind != EventDeath || got[2].Observer != "n2" {
		t.Fatalf("merged %+v", got)
	}
}

type nopSender struct{}

func (nopSender) Send(context.Context, sequencer.SendRequest) (sequencer.SendResult, error) {
	return sequencer.SendResult{}, nil
}
func (nopSender) SendBatch(_ context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome) {
}

// The hot tables rank conversations and partitions by the sends received.
func TestHotConversationsAndPartitions(t *testing.T) {
	sc := NewSendCounter()
	s := sc.Wrap(nopSender{})
	for range 30 {
		_, _ = s.Send(context.Background(), sequencer.SendRequest{ConvID: "g:hot"})
	}
	s.SendBatch(context.Background(), []sequencer.SendRequest{{ConvID: "g:warm"}, {ConvID: "g:warm"}, {ConvID: "g:cold"}}, make([]sequencer.SendOutcome, 3))
	var h hot
	h.add(sc.take())
	h.add(sc.take()) // an empty interval
	partOf := func(c string) (uint32, bool) {
		if c == "g:hot" {
			return 7, true
		}
		return 3, true
	}
	convs := topConvs(h.sums(), 2, partOf)
	if len(convs) != 3 || convs[0].ConvID != "g:hot" || convs[0].SendsPerSec != 15 || *convs[0].Partition != 7 || convs[1].ConvID != "g:warm" {
		t.Fatalf("hot conversations %+v", convs)
	}
	perPart := map[uint32]uint64{}
	for k, v := range h.sums() {
		p, _ := partOf(k)
		perPart[p] += v
	}
	ps := topPartitions(perPart, 2)
	if len(ps) != 2 || ps[0].Partition != 7 || ps[1].Partition != 3 || ps[1].SendsPerSec != 1.5 {
		t.Fatalf("hot partitions %+v", ps)
	}
}
