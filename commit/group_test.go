package commit

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer/persist"
)

// groupStore is a hookStore whose conversations belong to the commit group
// named by their id's prefix up to ':' (like a distributed store's shards).
type groupStore struct{ *hookStore }

func (groupStore) CommitGroup(convID string) uint64 {
	g, _, _ := strings.Cut(convID, ":")
	return uint64(len(g))<<32 | uint64(g[0])
}

// With a Grouper store, no transaction mixes groups: queued batches of three
// groups, interleaved, go out as one transaction per group (each within
// MaxMessages), in the order of each group's oldest batch, with every batch
// of a group in queue order.
func TestGroupsNeverMix(t *testing.T) {
	gate := make(chan struct{})
	hs := newHookStore(func(ctx context.Context, call int, bs []persist.ConvBatch) error {
		if call == 0 {
			<-gate
		}
		return nil
	})
	st := groupStore{hs}
	w, err := New(Config{Store: st, Workers: 1, MaxMessages: 6})
	if err != nil {
		t.Fatal(err)
	}
	a := newAnswers(1 + 3*3)
	w.Submit(batch("x:first", 1), a.done("x:first"))
	waitFor(t, func() bool { return len(hs.Calls()) == 1 })
	var order []string
	for i := range 3 {
		for _, g := range []string{"a", "b", "c"} {
			conv := fmt.Sprintf("%s:%d", g, i)
			order = append(order, conv)
			w.Submit(batch(conv, 2), a.done(conv))
		}
	}
	close(gate)
	a.wait(t)
	calls := hs.Calls()[1:]
	if len(calls) != 3 {
		t.Fatalf("%d transactions after the first, want 3 (one per group)", len(calls))
	}
	for i, c := range calls {
		want := string("abc"[i])
		if len(c) != 3 {
			t.Fatalf("transaction %d holds %d batches, want 3", i, len(c))
		}
		for j, b := range c {
			if g, _, _ := strings.Cut(b.ConvID, ":"); g != want || b.ConvID != fmt.Sprintf("%s:%d", want, j) {
				t.Fatalf("transaction %d batch %d is %s, want %s:%d", i, j, b.ConvID, want, j)
			}
		}
	}
	for _, conv := range order {
		if err := a.err(t, conv); err != nil {
			t.Fatalf("%s: %v", conv, err)
		}
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A group's batches beyond MaxMessages wait for the next transaction, and a
// later group's batch is not pulled in to fill the room.
func TestGroupRespectsMaxMessages(t *testing.T) {
	gate := make(chan struct{})
	hs := newHookStore(func(ctx context.Context, call int, bs []persist.ConvBatch) error {
		if call == 0 {
			<-gate
		}
		return nil
	})
	w, err := New(Config{Store: groupStore{hs}, Workers: 1, MaxMessages: 5})
	if err != nil {
		t.Fatal(err)
	}
	a := newAnswers(5)
	w.Submit(batch("x:first", 1), a.done("x:first"))
	waitFor(t, func() bool { return len(hs.Calls()) == 1 })
	for _, conv := range []string{"a:1", "b:1", "a:2", "a:3"} {
		w.Submit(batch(conv, 2), a.done(conv))
	}
	close(gate)
	a.wait(t)
	var got []string
	for _, c := range hs.Calls()[1:] {
		var ids []string
		for _, b := range c {
			ids = append(ids, b.ConvID)
		}
		got = append(got, strings.Join(ids, ","))
	}
	want := []string{"a:1,a:2", "b:1", "a:3"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("transactions %q, want %q", got, want)
	}
}
