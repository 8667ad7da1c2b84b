package commit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/testwait"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// hookStore is a memstore whose Commit first runs a test hook: an error
// from the hook is the commit's answer (nothing written), nil lets the
// commit through to the store.
type hookStore struct {
	*memstore.Store
	mu     sync.Mutex
	calls  [][]persist.ConvBatch
	commit func(ctx context.Context, call int, bs []persist.ConvBatch) error
}

func newHookStore(hook func(ctx context.Context, call int, bs []persist.ConvBatch) error) *hookStore {
	return &hookStore{Store: memstore.New(), commit: hook}
}

func (s *hookStore) Commit(ctx context.Context, bs []persist.ConvBatch) error {
	s.mu.Lock()
	call := len(s.calls)
	s.calls = append(s.calls, bs)
	hook := s.commit
	s.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, call, bs); err != nil {
			return err
		}
	}
	return s.Store.Commit(ctx, bs)
}

func (s *hookStore) Calls() [][]persist.ConvBatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]persist.ConvBatch(nil), s.calls...)
}

// head is conv's stored head.
func (s *hookStore) head(t *testing.T, conv string) uint64 {
	t.Helper()
	h, err := s.LoadHead(context.Background(), conv)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

var lastMsgID atomic.Uint64

// batch is conv's first n messages, with msg_ids unique in the test binary.
func batch(conv string, n int) persist.ConvBatch {
	b := persist.ConvBatch{ConvID: conv}
	for i := range n {
		b.Messages = append(b.Messages, sequencer.Message{ConvID: conv, Seq: uint64(i + 1), MsgID: lastMsgID.Add(1), FromUID: 1, ClientMsgID: fmt.Sprint(conv, "/", i)})
	}
	return b
}

// answers collects Done calls by conversation.
type answers struct {
	mu   sync.Mutex
	errs map[string][]error
	all  chan struct{}
	want int
	got  int
}

func newAnswers(want int) *answers {
	return &answers{errs: map[string][]error{}, all: make(chan struct{}), want: want}
}

func (a *answers) done(conv string) Done {
	return func(err error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.errs[conv] = append(a.errs[conv], err)
		a.got++
		if a.got == a.want {
			close(a.all)
		}
	}
}

func (a *answers) wait(t *testing.T) {
	t.Helper()
	select {
	case <-a.all:
	case <-time.After(10 * time.Second):
		t.Fatalf("only %d of %d batches answered", a.got, a.want)
	}
}

func (a *answers) err(t *testing.T, conv string) error {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.errs[conv]) != 1 {
		t.Fatalf("%s answered %d times", conv, len(a.errs[conv]))
	}
	return a.errs[conv][0]
}

// While the workers are busy, submitted batches pile up and go out merged
// into few transactions, none above MaxMessages rows.
func TestMergesManyConversations(t *testing.T) {
	gate := make(chan struct{})
	st := newHookStore(func(ctx context.Context, call int, bs []persist.ConvBatch) error {
		if call == 0 {
			<-gate
		}
		return nil
	})
	m := metrics.New()
	w, err := New(Config{Store: st, Workers: 1, MaxMessages: 10, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	a := newAnswers(11)
	w.Submit(batch("first", 1), a.done("first"))
	waitFor(t, func() bool { return len(st.Calls()) == 1 })
	for i := range 10 {
		w.Submit(batch(fmt.Sprint("c", i), 3), a.done(fmt.Sprint("c", i)))
	}
	close(gate)
	a.wait(t)
	calls := st.Calls()
	// 1 + ceil(10 / 3 per tx) transactions: 3+3+3 rows fit in 10, 4th does not.
	if len(calls) != 5 {
		t.Fatalf("%d transactions, want 5", len(calls))
	}
	for _, c := range calls[1:] {
		rows := 0
		for _, b := range c {
			rows += len(b.Messages)
		}
		if rows > 10 {
			t.Fatalf("transaction of %d rows > MaxMessages", rows)
		}
	}
	for conv := range a.errs {
		if err := a.err(t, conv); err != nil || st.head(t, conv) == 0 {
			t.Fatalf("%s: %v, stored head %d", conv, err, st.head(t, conv))
		}
	}
	if n := histCount(t, m, "sequencer_commit_batch_conversations"); n != 5 {
		t.Fatalf("batch_conversations observed %d times, want 5", n)
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Two transactions start as soon as anything is queued; while two are in
// flight a third worker waits for extraMinRows messages (a burst is not
// split into many small transactions), and what it left queued goes when a
// transaction ends.
func TestExtraWorkersWaitForRows(t *testing.T) {
	gates := []chan struct{}{make(chan struct{}), make(chan struct{})}
	st := newHookStore(func(ctx context.Context, call int, bs []persist.ConvBatch) error {
		if call < len(gates) {
			<-gates[call]
		}
		return nil
	})
	w, err := New(Config{Store: st, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	a := newAnswers(5)
	w.Submit(batch("a", 1), a.done("a"))
	waitFor(t, func() bool { return len(st.Calls()) == 1 })
	w.Submit(batch("b", 1), a.done("b"))
	waitFor(t, func() bool { return len(st.Calls()) == 2 }) // the second eager worker
	w.Submit(batch("small", extraMinRows-2), a.done("small"))
	time.Sleep(20 * time.Millisecond)
	if n := len(st.Calls()); n != 2 {
		t.Fatalf("%d transactions started with two in flight and %d messages queued, want 2", n, extraMinRows-2)
	}
	w.Submit(batch("more", 2), a.done("more")) // now extraMinRows wait: a third worker goes
	waitFor(t, func() bool { return len(st.Calls()) == 3 })
	if c := st.Calls()[2]; len(c) != 2 {
		t.Fatalf("the third transaction holds %d conversations, want small and more", len(c))
	}
	w.Submit(batch("late", 1), a.done("late")) // three in flight: waits for one to end
	time.Sleep(20 * time.Millisecond)
	if n := len(st.Calls()); n != 3 {
		t.Fatalf("%d transactions started with three in flight and 1 message queued, want 3", n)
	}
	close(gates[0])
	waitFor(t, func() bool { return len(st.Calls()) == 4 }) // late went when the first transaction ended
	close(gates[1])
	a.wait(t)
	for _, conv := range []string{"a", "b", "small", "more", "late"} {
		if err := a.err(t, conv); err != nil {
			t.Fatalf("%s: %v", conv, err)
		}
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A conflict fails only the conversations it names; the others are
// committed again at once, without them, and succeed.
func TestBlameOnlyNamedConversations(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  func(bs []persist.ConvBatch) error
	}{
		{"conflict", func(bs []persist.ConvBatch) error {
			return &persist.ConflictError{Conflicts: []persist.Conflict{{Key: persist.KeyClientMsgID, ConvID: "bad", Seq: 1}}}
		}},
		{"head-mismatch", func(bs []persist.ConvBatch) error { return &persist.HeadMismatchError{ConvIDs: []string{"bad"}} }},
		{"stale-fence", func(bs []persist.ConvBatch) error {
			return fmt.Errorf("tx: %w", &persist.StaleFenceError{Fences: []persist.Fence{{Partition: 9, Owner: "old", Epoch: 1}}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newHookStore(nil)
			st.commit = func(ctx context.Context, call int, bs []persist.ConvBatch) error {
				for _, b := range bs {
					if b.ConvID == "bad" {
						return tc.err(bs)
					}
				}
				return nil
			}
			w, _ := New(Config{Store: st, Workers: 1})
			a := newAnswers(3)
			hold := make(chan struct{})
			// Queue all three before the worker takes them: the worker
			// is parked on a first commit.
			st2 := st.commit
			st.commit = func(ctx context.Context, call int, bs []persist.ConvBatch) error {
				if call == 0 {
					<-hold
					return nil
				}
				return st2(ctx, call, bs)
			}
			// Partition 9 is at epoch 2 (bad's fence is stale); the others
			// write partition 8.
			for _, f := range []persist.Fence{{Partition: 8, Owner: "n", Epoch: 1}, {Partition: 9, Owner: "old", Epoch: 2}} {
				if err := st.PutPartitionLeaseForTest(context.Background(), f); err != nil {
					t.Fatal(err)
				}
			}
			warmup := batch("warmup", 1)
			warmup.Fence = persist.Fence{Partition: 8, Owner: "n", Epoch: 1}
			w.Submit(warmup, func(error) {})
			waitFor(t, func() bool { return len(st.Calls()) == 1 })
			good1, bad, good2 := batch("good1", 2), batch("bad", 2), batch("good2", 2)
			good1.Fence = warmup.Fence
			bad.Fence = persist.Fence{Partition: 9, Owner: "old", Epoch: 1}
			good2.Fence = persist.Fence{Partition: 9, Owner: "old", Epoch: 2}
			w.Submit(good1, a.done("good1"))
			w.Submit(bad, a.done("bad"))
			w.Submit(good2, a.done("good2"))
			close(hold)
			a.wait(t)
			if err := a.err(t, "good1"); err != nil {
				t.Fatalf("good1 failed for another conversation's error: %v", err)
			}
			if err := a.err(t, "good2"); err != nil {
				t.Fatalf("good2 failed for another conversation's error: %v", err)
			}
			if err := a.err(t, "bad"); err == nil {
				t.Fatal("bad conversation committed")
			}
			if st.head(t, "good1") != 2 || st.head(t, "good2") != 2 || st.head(t, "bad") != 0 {
				t.Fatalf("stored heads good1 %d good2 %d bad %d, want 2 2 0", st.head(t, "good1"), st.head(t, "good2"), st.head(t, "bad"))
			}
			calls := st.Calls()
			if len(calls) != 3 || len(calls[1]) != 3 || len(calls[2]) != 2 {
				t.Fatalf("want the shared transaction then a retry without bad, got %d calls", len(calls))
			}
			_ = w.Close(context.Background())
		})
	}
}

// An error naming nobody in particular reaches every member.
func TestSharedFailureReachesAll(t *testing.T) {
	st := newHookStore(func(ctx context.Context, call int, bs []persist.ConvBatch) error {
		return fmt.Errorf("dial: %w", sequencer.ErrStoreUnavailable)
	})
	w, _ := New(Config{Store: st, Workers: 2})
	a := newAnswers(5)
	for i := range 5 {
		w.Submit(batch(fmt.Sprint("c", i), 1), a.done(fmt.Sprint("c", i)))
	}
	a.wait(t)
	for i := range 5 {
		if err := a.err(t, fmt.Sprint("c", i)); !errors.Is(err, sequencer.ErrStoreUnavailable) {
			t.Fatalf("c%d: %v", i, err)
		}
	}
	_ = w.Close(context.Background())
}

// A commit that runs past Timeout is an unknown outcome, whatever the
// driver said.
func TestTimeoutIsUnknownOutcome(t *testing.T) {
	st := newHookStore(func(ctx context.Context, call int, bs []persist.ConvBatch) error {
		<-ctx.Done()
		return ctx.Err()
	})
	w, _ := New(Config{Store: st, Workers: 1, Timeout: 20 * time.Millisecond})
	a := newAnswers(1)
	w.Submit(batch("c", 1), a.done("c"))
	a.wait(t)
	err := a.err(t, "c")
	if !errors.Is(err, sequencer.ErrUnknownOutcome) || sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
		t.Fatalf("got %v", err)
	}
	_ = w.Close(context.Background())
}

// Close commits what was queued, then refuses new batches.
func TestCloseDrains(t *testing.T) {
	gate := make(chan struct{})
	st := newHookStore(func(ctx context.Context, call int, bs []persist.ConvBatch) error {
		if call == 0 {
			<-gate
		}
		return nil
	})
	w, _ := New(Config{Store: st, Workers: 1})
	a := newAnswers(3)
	w.Submit(batch("a", 1), a.done("a"))
	waitFor(t, func() bool { return len(st.Calls()) == 1 })
	w.Submit(batch("b", 1), a.done("b"))
	closed := make(chan error, 1)
	go func() { closed <- w.Close(context.Background()) }()
	waitFor(t, func() bool { w.mu.Lock(); defer w.mu.Unlock(); return w.closed })
	w.Submit(batch("late", 1), a.done("late"))
	close(gate)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	a.wait(t)
	if a.err(t, "a") != nil || a.err(t, "b") != nil || st.head(t, "a") != 1 || st.head(t, "b") != 1 {
		t.Fatal("queued batches not committed on close")
	}
	if err := a.err(t, "late"); !errors.Is(err, sequencer.ErrShuttingDown) || !errors.Is(err, sequencer.ErrStoreUnavailable) ||
		sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
		t.Fatalf("late: %v", err)
	}
}

func histCount(t *testing.T, m *metrics.Set, name string) uint64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testwait.For(t, 10*time.Second, time.Millisecond, "the condition", cond)
}

// One bad row among many: the store names no conversation (ErrRejected), so
// the writer splits the group by halves; every good conversation commits,
// only the poisoned one fails, and the split takes O(log n) extra
// transactions per bad conversation, not one per conversation.
func TestRejectedRowFailsAlone(t *testing.T) {
	gate := make(chan struct{})
	st := newHookStore(func(ctx context.Context, call int, bs []persist.ConvBatch) error {
		if call == 0 {
			<-gate
		}
		for _, b := range bs {
			if b.ConvID == "poison" {
				return fmt.Errorf("postgres: commit: %w (value too long for type character varying(64))", persist.ErrRejected)
			}
		}
		return nil
	})
	w, err := New(Config{Store: st, Workers: 1, MaxMessages: 4000})
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	a := newAnswers(n + 2)
	w.Submit(batch("first", 1), a.done("first"))
	waitFor(t, func() bool { return len(st.Calls()) == 1 })
	for i := range n {
		if i == 137 {
			w.Submit(batch("poison", 2), a.done("poison"))
		}
		w.Submit(batch(fmt.Sprint("c", i), 2), a.done(fmt.Sprint("c", i)))
	}
	close(gate)
	a.wait(t)
	if err := a.err(t, "poison"); !errors.Is(err, persist.ErrRejected) || sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
		t.Fatalf("poison: %v (code %s)", err, sequencer.ErrorCode(err))
	}
	for i := range n {
		c := fmt.Sprint("c", i)
		if err := a.err(t, c); err != nil || st.head(t, c) != 2 {
			t.Fatalf("%s: %v, stored head %d", c, err, st.head(t, c))
		}
	}
	if h := st.head(t, "poison"); h != 0 {
		t.Fatalf("poison stored up to %d", h)
	}
	// 1 (first) + 1 (whole group) + about 2 per level of the split.
	if calls := len(st.Calls()); calls > 2+2*9 {
		t.Fatalf("%d transactions to isolate one bad conversation among %d", calls, n+1)
	}
}
