package actor

import (
	"context"
	"testing"

	"github.com/sequencer-im/sequencer/commit"
)

// Stats reads the pending sends and bytes against their limits, and the
// batches waiting for the group-commit writer.
func TestStatsPendingAndCommitQueue(t *testing.T) {
	st := newGateStore()
	n := newNode(t, Config{Store: st, Commit: commit.Config{Workers: 1}, MaxPending: 100, MaxPendingBytes: 1 << 20})
	ctx := context.Background()
	r1, r2 := req("s:a", "k1"), req("s:b", "k2")
	size := pendingSize(&r1) + pendingSize(&r2)
	a1 := sendAsync(n, ctx, r1)
	waitFor(t, "commit in flight", func() bool { return st.waiting.Load() == 1 })
	a2 := sendAsync(n, ctx, r2) // another conversation: queued behind the only worker
	waitFor(t, "one batch queued", func() bool { return n.Stats().CommitQueue == 1 })
	l := n.Stats()
	if l.Pending != 2 || l.PendingBytes != size || l.MaxPending != 100 || l.MaxPendingBytes != 1<<20 {
		t.Fatalf("stats %+v, want 2 pending sends of %d bytes, limits 100 and 1 MiB", l, size)
	}
	close(st.gate)
	for _, ch := range []<-chan answer{a1, a2} {
		if a := <-ch; a.err != nil {
			t.Fatal(a.err)
		}
	}
	if l := n.Stats(); l.Pending != 0 || l.PendingBytes != 0 || l.CommitQueue != 0 {
		t.Fatalf("stats %+v after all answered", l)
	}
}
