package sqlite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// manyRows is a commit of n one-row batches of conversations prefix-0 ..
// prefix-(n-1), each at seq seq, msg_ids from id.
func manyRows(prefix string, n int, seq, id uint64) []persist.ConvBatch {
	bs := make([]persist.ConvBatch, n)
	for i := range bs {
		conv := fmt.Sprintf("%s-%d", prefix, i)
		bs[i] = persist.ConvBatch{ConvID: conv, PrevHead: seq - 1, Messages: []sequencer.Message{{
			MsgID: id + uint64(i), ConvID: conv, Seq: seq, FromUID: uint64(i + 1), MsgType: 1,
			Body: []byte(strings.Repeat("b", 100)), ClientMsgID: fmt.Sprintf("%s-%d-%d", prefix, i, seq), ServerAt: time.UnixMilli(1)}}}
	}
	return bs
}

// holdWriter takes the writer connection, so that Commit calls queue up
// behind the writer goroutine; the returned function gives it back.
func holdWriter(t *testing.T, s *Store) func() {
	t.Helper()
	// The row INSERTs are prepared on the first commit: do it now, so the
	// writer goroutine then waits for the connection in the transaction.
	if err := s.Commit(context.Background(), manyRows("warm", 1, 1, 1<<40)); err != nil {
		t.Fatal(err)
	}
	conn, err := s.w.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return func() { conn.Close() }
}

// waitFor polls cond every millisecond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func queued(s *Store) int {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return len(s.queue)
}

// commitAsync starts Commit and waits until the call is queued (so calls
// queue in the order they are started).
func commitAsync(t *testing.T, s *Store, ctx context.Context, bs []persist.ConvBatch) <-chan error {
	t.Helper()
	before := s.calls.Load()
	ch := make(chan error, 1)
	go func() { ch <- s.Commit(ctx, bs) }()
	waitFor(t, "the call to be queued", func() bool { return s.calls.Load() > before })
	return ch
}

func one(conv string, prev uint64, id uint64, from uint64, key string) persist.ConvBatch {
	return persist.ConvBatch{ConvID: conv, PrevHead: prev, Messages: []sequencer.Message{{MsgID: id, ConvID: conv,
		Seq: prev + 1, FromUID: from, MsgType: 1, Body: []byte("x"), ClientMsgID: key, ServerAt: time.UnixMilli(1)}}}
}

// Calls that wait while a transaction runs are committed together in one.
func TestGroupCommitMergesWaitingCalls(t *testing.T) {
	s := newStore(t)
	release := holdWriter(t, s)
	groups := s.groups.Load()
	var chs []<-chan error
	for i, conv := range []string{"a", "b", "c", "d"} {
		chs = append(chs, commitAsync(t, s, context.Background(), []persist.ConvBatch{one(conv, 0, uint64(10+i), 1, conv)}))
	}
	release()
	for i, ch := range chs {
		if err := <-ch; err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := s.groups.Load() - groups; n > 2 {
		t.Fatalf("4 waiting calls took %d transactions, want at most 2 (the first, then the rest together)", n)
	}
	for _, conv := range []string{"a", "b", "c", "d"} {
		if h, err := s.LoadHead(context.Background(), conv); err != nil || h != 1 {
			t.Fatalf("%s: head %d, %v", conv, h, err)
		}
	}
}

// A merged transaction that one call's rows make fail is done again call by
// call: each call gets the answer it would have had alone, in queue order.
func TestGroupCommitRefusalAnswersEachCall(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	if err := s.Commit(ctx, []persist.ConvBatch{one("stored", 0, 100, 1, "stored")}); err != nil {
		t.Fatal(err)
	}
	release := holdWriter(t, s)
	good1 := commitAsync(t, s, ctx, []persist.ConvBatch{one("g1", 0, 1, 1, "g1")})
	waitFor(t, "the first call to be taken", func() bool { return queued(s) == 0 })
	mismatch := commitAsync(t, s, ctx, []persist.ConvBatch{one("m", 5, 2, 1, "m")})
	conflict := commitAsync(t, s, ctx, []persist.ConvBatch{one("k", 0, 100, 1, "k")}) // msg_id of "stored"
	good2 := commitAsync(t, s, ctx, []persist.ConvBatch{one("g2", 0, 3, 1, "g2")})
	x1 := commitAsync(t, s, ctx, []persist.ConvBatch{one("x", 0, 4, 1, "x1")})
	x2 := commitAsync(t, s, ctx, []persist.ConvBatch{one("x", 1, 5, 1, "x2")})      // after x1
	sameKey := commitAsync(t, s, ctx, []persist.ConvBatch{one("y", 0, 6, 1, "g2")}) // g2's client key
	if n := queued(s); n != 6 {
		t.Fatalf("%d calls queued, want 6", n)
	}
	release()
	for name, ch := range map[string]<-chan error{"good1": good1, "good2": good2, "x1": x1, "x2": x2} {
		if err := <-ch; err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	var hm *persist.HeadMismatchError
	if err := <-mismatch; !errors.As(err, &hm) || !errors.Is(err, sequencer.ErrHeadMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	for name, ch := range map[string]<-chan error{"conflict": conflict, "sameKey": sameKey} {
		var ce *persist.ConflictError
		if err := <-ch; !errors.As(err, &ce) {
			t.Fatalf("%s: %v, want a *ConflictError", name, err)
		}
	}
	for conv, want := range map[string]uint64{"g1": 1, "g2": 1, "x": 2, "m": 0, "k": 0, "y": 0} {
		if h, err := s.LoadHead(ctx, conv); err != nil || h != want {
			t.Fatalf("%s: head %d, %v; want %d", conv, h, err, want)
		}
	}
}

// A call whose context ends while it waits for the writer returns
// ErrStoreUnavailable and writes nothing; the others are not disturbed.
func TestGroupCommitCanceledWhileQueued(t *testing.T) {
	s := newStore(t)
	release := holdWriter(t, s)
	first := commitAsync(t, s, context.Background(), []persist.ConvBatch{one("a", 0, 1, 1, "a")})
	waitFor(t, "the first call to be taken", func() bool { return queued(s) == 0 })
	ctx, cancel := context.WithCancel(context.Background())
	second := commitAsync(t, s, ctx, []persist.ConvBatch{one("b", 0, 2, 1, "b")})
	cancel()
	select {
	case err := <-second:
		if !errors.Is(err, sequencer.ErrStoreUnavailable) {
			t.Fatalf("canceled call: %v, want ErrStoreUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a canceled call kept waiting for the writer")
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if _, err := s.FindByClientKey(context.Background(), sequencer.ClientKey{FromUID: 1, ClientMsgID: "b"}); !errors.Is(err, sequencer.ErrNotFound) {
		t.Fatalf("the canceled call's row: %v, want ErrNotFound", err)
	}
}

// Close commits the calls already queued, then refuses new ones.
func TestCloseCommitsQueuedCalls(t *testing.T) {
	s, err := Open(context.Background(), t.TempDir()+"/s.db", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	release := holdWriter(t, s)
	ch := commitAsync(t, s, context.Background(), []persist.ConvBatch{one("a", 0, 1, 1, "a")})
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	waitFor(t, "Close to begin", func() bool { s.qmu.Lock(); defer s.qmu.Unlock(); return s.closing })
	if err := s.Commit(context.Background(), []persist.ConvBatch{one("b", 0, 2, 1, "b")}); !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("Commit during Close: %v", err)
	}
	release()
	if err := <-ch; err != nil {
		t.Fatalf("queued call: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	s2 := openAt(t, s.Path())
	if h, err := s2.LoadHead(context.Background(), "a"); err != nil || h != 1 {
		t.Fatalf("head of a = %d, %v", h, err)
	}
}
