package firehose

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// heldScanStore is a memstore whose first OutboxPending reads the outbox,
// then holds its answer until released: a scan slow enough to outlive its
// partition's ownership.
type heldScanStore struct {
	*memstore.Store
	calls   atomic.Int32
	reading chan struct{} // closed when the first call has read
	release chan struct{}
}

func (s *heldScanStore) OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]persist.OutboxRow, error) {
	rows, err := s.Store.OutboxPending(ctx, part, after, limit)
	if s.calls.Add(1) == 1 {
		close(s.reading)
		<-s.release
	}
	return rows, err
}

// ackSink acknowledges every publish at once and records them.
type ackSink struct {
	mu  sync.Mutex
	got map[string][]uint64
}

func (s *ackSink) Publish(_ uint32, m sequencer.Message, done func(error)) {
	s.mu.Lock()
	s.got[m.ConvID] = append(s.got[m.ConvID], m.Seq)
	s.mu.Unlock()
	done(nil)
}

func (s *ackSink) seqs(conv string) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got[conv])
}

// A partition dropped and owned again while its first scan was still
// reading is scanned again: the old scan's rows predate conversation a,
// which another owner wrote meanwhile (seqs 1..5, unpublished), and a's
// next live batch (6) must not start it at 6. Before the scans had
// generations, the old scan ended the new ownership's sync and 1..5 were
// never published (the rescan, every 30 s by default, found a's cursor
// already at 6). The same when the publisher never sees the partition go,
// only its lease's new epoch (taken again between two of its polls).
func TestPublisherScansAPartitionOwnedAgainDuringItsScan(t *testing.T) {
	t.Run("dropped then owned again", func(t *testing.T) { testRetakenDuringScan(t, true) })
	t.Run("a new epoch between two polls", func(t *testing.T) { testRetakenDuringScan(t, false) })
}

// testRetakenDuringScan: the publisher holds partition 0 (epoch 1) and its
// first scan is held; the partition goes (seen by the publisher when
// gapSeen), another node writes a 1..5, and the publisher holds it again
// (epoch 2); then the old scan ends and a's 6 comes live.
func testRetakenDuringScan(t *testing.T, gapSeen bool) {
	st := &heldScanStore{Store: memstore.New(), reading: make(chan struct{}), release: make(chan struct{})}
	sink := &ackSink{got: map[string][]uint64{}}
	var owned atomic.Pointer[[]Holding]
	var asked atomic.Int64 // Owned calls since the last change
	set := func(hs []Holding) {
		owned.Store(&hs)
		asked.Store(0)
	}
	set([]Holding{{Partition: 0, Epoch: 1}})
	p, err := New(Config{Store: st, Sink: sink, Core: CoreConfig{Partitions: 1}, OwnEvery: 5 * time.Millisecond,
		FlushEvery: 5 * time.Millisecond, RescanEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	p.SetOwned(func() []Holding { asked.Add(1); return *owned.Load() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	<-st.reading // the first scan read an empty outbox and is held
	waitAsked := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for asked.Load() < 3 { // the change reached the core
			if time.Now().After(deadline) {
				t.Fatal("the publisher stopped asking for its partitions")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if gapSeen {
		set(nil)
		waitAsked()
	}
	commit := func(from, to uint64) []sequencer.Message {
		b := persist.ConvBatch{ConvID: "a", PrevHead: from - 1, Outbox: persist.OutboxMark{On: true, Partition: 0}}
		for s := from; s <= to; s++ {
			b.Messages = append(b.Messages, sequencer.Message{MsgID: 100 + s, ConvID: "a", Seq: s, FromUID: 1, MsgType: 1,
				Body: []byte("x"), ClientMsgID: fmt.Sprintf("k%d", s), ServerAt: time.Now()})
		}
		if err := st.Commit(context.Background(), []persist.ConvBatch{b}); err != nil {
			t.Fatal(err)
		}
		return b.Messages
	}
	commit(1, 5) // by another owner: never handed to this publisher live
	set([]Holding{{Partition: 0, Epoch: 2}})
	waitAsked()
	close(st.release) // the old scan ends now, with its empty page
	p.Publish("a", commit(6, 6))

	deadline := time.Now().Add(10 * time.Second)
	want := []uint64{1, 2, 3, 4, 5, 6}
	for !slices.Equal(sink.seqs("a"), want) {
		if time.Now().After(deadline) {
			t.Fatalf("published a's seqs %v, want %v", sink.seqs("a"), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
