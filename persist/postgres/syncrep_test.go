package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// TestSyncStandbyDownTimedOutCommitStaysInvisible: with synchronous
// replication and the standby down, a commit waits for the standby, times
// out, and is an unknown outcome. The store must not cancel the backend's
// wait (pgx sends a cancel request when a connection breaks): a cancelled
// wait makes the transaction visible on the primary although no standby has
// it, so later reads would take it as stored and a failover would lose it.
// Nor may Settle (which the writer calls before it re-reads) terminate it.
// The transaction must stay invisible until the standby is back, then land
// on both.
func TestSyncStandbyDownTimedOutCommitStaysInvisible(t *testing.T) {
	primary := pgtest.StartPrimary(t, "synchronous_standby_names=*", "synchronous_commit=on")
	standby := primary.StartStandby(t, "synchronous_standby_names=")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := primary.WaitStreaming(ctx, 1); err != nil {
		t.Fatal(err)
	}
	st, err := Open(ctx, primary.DSN("postgres"), Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(ctx, []persist.ConvBatch{msgs("c", 0, 1, 1)}); err != nil {
		t.Fatal(err)
	}

	standby.Stop()
	cctx, ccancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err = st.Commit(cctx, []persist.ConvBatch{msgs("c", 1, 1, 2)})
	ccancel()
	if !errors.Is(err, sequencer.ErrUnknownOutcome) {
		t.Fatalf("commit with the synchronous standby down: %v, want an unknown outcome", err)
	}
	// Once the broken connection is gone from the pool, pgx's cleanup
	// (where it would send the cancel request) is over.
	for st.commits.Stat().TotalConns() != 0 {
		if ctx.Err() != nil {
			t.Fatal("the broken connection never left the pool")
		}
		time.Sleep(10 * time.Millisecond) // the pool destroys connections asynchronously
	}
	var waiting int
	if err := primary.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'", &waiting); err != nil {
		t.Fatal(err)
	}
	if waiting != 1 {
		t.Fatalf("%d backends wait for the standby, want 1 (the timed-out commit's wait was cancelled)", waiting)
	}
	if h, err := st.LoadHead(ctx, "c"); err != nil || h != 1 {
		t.Fatalf("head %d (%v) while the commit waits for the standby, want 1: an unreplicated commit became visible", h, err)
	}
	// Settle (the writer's step before it re-reads) must not end the wait
	// either: it waits, and says the outcome is not final yet.
	sctx, scancel := context.WithTimeout(ctx, time.Second)
	err = st.Settle(sctx)
	scancel()
	if !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("Settle with the commit waiting for the standby: %v, want unavailable (still running)", err)
	}
	if h, err := st.LoadHead(ctx, "c"); err != nil || h != 1 {
		t.Fatalf("head %d (%v) after Settle while the standby is down, want 1: Settle published an unreplicated commit", h, err)
	}

	// The standby comes back: the commit lands, on both, and Settle returns.
	if err := standby.Start(); err != nil {
		t.Fatal(err)
	}
	if err := st.Settle(ctx); err != nil {
		t.Fatalf("Settle once the standby is back: %v", err)
	}
	for {
		h, err := st.LoadHead(ctx, "c")
		if err == nil && h == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the waiting commit never landed: head %d (%v)", h, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
	for { // flushed on the standby before it became visible; replayed soon after
		var onStandby int64
		err := standby.QueryRow(ctx, "SELECT head FROM conv_head WHERE conv_id = 'c'", &onStandby)
		if err == nil && onStandby == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("standby head %d (%v), want 2", onStandby, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}
