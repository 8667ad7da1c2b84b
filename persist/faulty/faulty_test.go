package faulty

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
	"github.com/sequencer-im/sequencer/persist/storetest"
)

// stored reports whether s's inner store holds msg_id id (read past the
// faults).
func stored(t *testing.T, s *Store, id uint64) bool {
	t.Helper()
	_, err := s.Store.GetMessage(context.Background(), id)
	if err != nil && !errors.Is(err, sequencer.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// one is a commit of message id as seq 1 of its own conversation.
func one(id uint64) []persist.ConvBatch {
	conv := fmt.Sprint("c", id)
	return []persist.ConvBatch{{ConvID: conv, Messages: []sequencer.Message{{MsgID: id, ConvID: conv, Seq: 1, FromUID: 1, ClientMsgID: conv}}}}
}

func TestScriptedCommitFaults(t *testing.T) {
	s := New(nil, 1, Rates{})
	s.Inject(OpCommit, FailBefore, CommitThenFail, Drop, Delay, None)
	ctx := context.Background()
	for _, tc := range []struct {
		id      uint64
		wantErr error
		stored  bool
	}{
		{1, sequencer.ErrStoreUnavailable, false},
		{2, sequencer.ErrUnknownOutcome, true},
		{3, sequencer.ErrUnknownOutcome, false},
		{4, nil, true},
		{5, nil, true},
		{6, nil, true}, // script exhausted, zero rates: pass through
	} {
		err := s.Commit(ctx, one(tc.id))
		if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
			t.Fatalf("commit %d: got %v, want %v", tc.id, err, tc.wantErr)
		}
		if got := stored(t, s, tc.id); got != tc.stored {
			t.Fatalf("commit %d: stored=%v, want %v", tc.id, got, tc.stored)
		}
		if s.Durable(tc.id) != tc.stored {
			t.Fatalf("commit %d: Durable=%v, want %v", tc.id, s.Durable(tc.id), tc.stored)
		}
	}
	ev := s.Events()
	want := []Fault{FailBefore, CommitThenFail, Drop, Delay}
	if len(ev) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(ev), len(want), ev)
	}
	for i, f := range want {
		if ev[i].Fault != f || ev[i].Op != OpCommit || ev[i].Rows != 1 || ev[i].ConvIDs[0] != fmt.Sprint("c", i+1) {
			t.Fatalf("event %d: %+v, want %s", i, ev[i], f)
		}
	}
	if calls, n := s.Count(OpCommit, Drop); calls != 6 || n != 1 {
		t.Fatalf("count: %d calls, %d drops", calls, n)
	}
}

func TestReadFaults(t *testing.T) {
	s := New(nil, 1, Rates{})
	s.Inject(OpLoadHead, FailBefore)
	if _, err := s.LoadHead(context.Background(), "c"); !errors.Is(err, sequencer.ErrStoreUnavailable) || sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
		t.Fatalf("got %v", err)
	}
	if _, err := s.LoadHead(context.Background(), "c"); err != nil {
		t.Fatalf("second call: %v", err)
	}
}

// A delay that outlives the caller's context writes nothing.
func TestDelayHonoursContext(t *testing.T) {
	s := New(nil, 1, Rates{MaxDelay: time.Hour})
	s.Inject(OpCommit, Delay)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := s.Commit(ctx, one(1)); !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("got %v", err)
	}
	if stored(t, s, 1) {
		t.Fatal("stored after a delay past the deadline")
	}
}

// The random schedule is reproducible from its seed and honours the rates.
func TestRandomScheduleIsSeeded(t *testing.T) {
	run := func(seed uint64) []Fault {
		s := New(nil, seed, Rates{FailBefore: 0.2, CommitThenFail: 0.2, Drop: 0.2})
		var out []Fault
		for i := range 500 {
			_ = s.Commit(context.Background(), one(uint64(i+1)))
		}
		for _, e := range s.Events() {
			out = append(out, e.Fault)
		}
		return out
	}
	a, b := run(7), run(7)
	if len(a) != len(b) {
		t.Fatalf("same seed, %d vs %d faults", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed diverged at %d", i)
		}
	}
	if n := len(a); n < 220 || n > 380 { // 60% of 500, loosely
		t.Fatalf("%d faults of 500 at 60%%", n)
	}
	seen := map[Fault]bool{}
	for _, f := range a {
		seen[f] = true
	}
	if !seen[FailBefore] || !seen[CommitThenFail] || !seen[Drop] || seen[Delay] {
		t.Fatalf("faults seen: %v", seen)
	}
}

// With no faults the wrapper is the inner store: it passes the conformance
// suite over a memstore (whose test hooks the suite reaches directly).
func TestNoFaultsConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) persist.Store {
		inner := memstore.New()
		return struct {
			*Store
			storetest.Hooks
		}{New(inner, 1, Rates{}), inner}
	})
}

// Read positions pass through the inner store's; FailBefore stores nothing,
// CommitThenFail stores the mark and reports an unknown outcome, Delay
// passes through after the wait.
func TestReadPositionFaults(t *testing.T) {
	s := New(nil, 1, Rates{MaxDelay: time.Millisecond})
	ctx := context.Background()
	if err := s.Commit(ctx, one(1)); err != nil {
		t.Fatal(err)
	}
	s.Inject(OpMarkRead, FailBefore, CommitThenFail, Delay)
	s.Inject(OpReadStates, FailBefore)
	inner := s.Store.(persist.ReadPositions)
	state := func() persist.ReadState {
		t.Helper()
		st, err := inner.ReadStates(ctx, 5, []string{"c1"})
		if err != nil {
			t.Fatal(err)
		}
		return st[0]
	}
	if _, err := s.MarkRead(ctx, "c1", 5, 1); !errors.Is(err, sequencer.ErrStoreUnavailable) || state().ReadSeq != 0 {
		t.Fatalf("fail-before: %v, stored %+v", err, state())
	}
	if _, err := s.MarkRead(ctx, "c1", 5, 1); !errors.Is(err, sequencer.ErrUnknownOutcome) || state().ReadSeq != 1 {
		t.Fatalf("commit-then-fail: %v, stored %+v", err, state())
	}
	if st, err := s.MarkRead(ctx, "c1", 6, 1); err != nil || st.ReadSeq != 1 || st.Head != 1 {
		t.Fatalf("delay: %+v, %v", st, err)
	}
	if _, err := s.ReadStates(ctx, 5, []string{"c1"}); !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("read states fail-before: %v", err)
	}
	if st, err := s.ReadStates(ctx, 5, []string{"c1"}); err != nil || st[0].ReadSeq != 1 {
		t.Fatalf("read states: %+v, %v", st, err)
	}
	if calls, faulted := s.Count(OpMarkRead, CommitThenFail); calls != 3 || faulted != 1 {
		t.Fatalf("mark read calls %d, commit-then-fail %d", calls, faulted)
	}
}
