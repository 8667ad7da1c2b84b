package persist

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
)

// While Flushes batches are being written, later marks queue and go
// together in the next batch; every caller gets its own mark's answer, and
// a failed Write fails exactly the marks of its batch.
func TestMarkBatcherGroupsWhileWriting(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	b := &MarkBatcher{Flushes: 1, Write: func(ctx context.Context, marks []Mark) ([]ReadState, error) {
		mu.Lock()
		sizes = append(sizes, len(marks))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			<-release // the first batch is in flight until released
		}
		out := make([]ReadState, len(marks))
		for i, m := range marks {
			if m.Seq == 13 {
				return nil, sequencer.ErrStoreUnavailable
			}
			out[i] = ReadState{ConvID: m.ConvID, ReadSeq: m.Seq}
		}
		return out, nil
	}}
	ctx := context.Background()
	type answer struct {
		st  ReadState
		err error
	}
	first := make(chan answer, 1)
	go func() { st, err := b.MarkRead(ctx, Mark{ConvID: "c0", UID: 1, Seq: 100}); first <- answer{st, err} }()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes) == 1 })
	const n = 20
	answers := make([]chan answer, n)
	for i := range answers {
		answers[i] = make(chan answer, 1)
		go func(i int) {
			st, err := b.MarkRead(ctx, Mark{ConvID: fmt.Sprint("c", i+1), UID: 1, Seq: uint64(i + 1)})
			answers[i] <- answer{st, err}
		}(i)
	}
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == n })
	close(release)
	if a := <-first; a.err != nil || a.st.ReadSeq != 100 {
		t.Fatalf("first mark: %+v, %v", a.st, a.err)
	}
	for i, ch := range answers {
		a := <-ch
		// Mark 13 is in the second batch: that batch failed as a whole.
		if !errors.Is(a.err, sequencer.ErrStoreUnavailable) || a.st != (ReadState{}) {
			t.Fatalf("mark %d of the failed batch: %+v, %v", i+1, a.st, a.err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) != 2 || sizes[0] != 1 || sizes[1] != n {
		t.Fatalf("batch sizes %v, want [1 %d]", sizes, n)
	}
	// Alone again: a mark is written at once, in a batch of its own.
	mu.Unlock()
	st, err := b.MarkRead(ctx, Mark{ConvID: "c", UID: 2, Seq: 7})
	mu.Lock()
	if err != nil || st.ReadSeq != 7 || len(sizes) != 3 || sizes[2] != 1 {
		t.Fatalf("lone mark: %+v, %v, sizes %v", st, err, sizes)
	}
}

// A caller whose context ends stops waiting (its context's error: the mark
// may land); the batch still finishes for the others.
func TestMarkBatcherCallerGivesUp(t *testing.T) {
	release := make(chan struct{})
	b := &MarkBatcher{Write: func(ctx context.Context, marks []Mark) ([]ReadState, error) {
		<-release
		return make([]ReadState, len(marks)), nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := b.MarkRead(ctx, Mark{ConvID: "c", UID: 1, Seq: 1}); done <- err }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("gave up: %v, want context.Canceled", err)
	}
	close(release)
	if _, err := b.MarkRead(context.Background(), Mark{ConvID: "c", UID: 1, Seq: 2}); err != nil {
		t.Fatalf("after a caller gave up: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
