package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// heldCall is one batch the fake transport holds until released.
type heldCall struct {
	items   int
	release chan error // nil: answer every item ok; else the transport error
}

// TestForwarderOnItsOwn drives the forwarder alone, with a fake transport
// that holds each batch and a fake clock: two batches leave at once; past
// them items wait and the batch that returns takes them all; minBatch
// waiting items make another leave; when no batch left for the stall time
// (moved on the fake clock) one more leaves; a transport error is no answer
// for its items and tells the failure detector.
func TestForwarderOnItsOwn(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC))
	calls := make(chan heldCall, 16)
	var suspected atomic.Int32
	f := newForwarder(forwarderDeps{
		clk: clk,
		forward: func(ctx context.Context, addr string, b *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
			if addr != "b:1" || b.FromNode != "a" || b.FromIncarnation != "a/1" || b.MembershipVersion != 4 {
				return nil, fmt.Errorf("batch from %s/%s at view %d to %s", b.FromNode, b.FromIncarnation, b.MembershipVersion, addr)
			}
			c := heldCall{items: len(b.Items), release: make(chan error)}
			calls <- c
			if err := <-c.release; err != nil {
				return nil, err
			}
			out := make([]sequencer.SendOutcome, len(b.Items))
			for i := range out {
				out[i].Result = sequencer.SendResult{MsgID: uint64(100 + i), Seq: uint64(1 + i)}
			}
			return encodeReplies("b", out), nil
		},
		self:    func() (string, string, uint64) { return "a", "a/1", 4 },
		suspect: func() { suspected.Add(1) },
		timeout: time.Minute,
	})
	defer f.close()
	f.mu.Lock()
	f.policy = forwardPolicy{eager: 2, minBatch: 5, stall: 20 * time.Millisecond}
	f.mu.Unlock()

	var items []*fwdItem
	send := func(k int) {
		for range k {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			t.Cleanup(cancel)
			it := newFwdItem(ctx, sequencer.SendRequest{ConvID: "c", FromUID: 1, ClientMsgID: fmt.Sprint(len(items)), MsgType: 1})
			items = append(items, it)
			f.enqueue("b:1", []*fwdItem{it})
		}
	}
	next := func(what string) heldCall {
		t.Helper()
		select {
		case c := <-calls:
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("no batch left: %s", what)
			return heldCall{}
		}
	}
	none := func(what string) {
		t.Helper()
		select {
		case c := <-calls:
			t.Fatalf("a batch of %d left: %s", c.items, what)
		case <-time.After(50 * time.Millisecond):
		}
	}
	waiting := func() (items, workers int) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if pq := f.peers["b:1"]; pq != nil {
			return pq.items, pq.workers
		}
		return 0, 0
	}

	send(1)
	c1 := next("first")
	send(1)
	c2 := next("second: two leave at once")
	if c1.items != 1 || c2.items != 1 {
		t.Fatalf("first batches carry %d and %d items, want 1 and 1", c1.items, c2.items)
	}
	send(3)
	none("3 items behind 2 batches, before the stall time")
	if n, w := waiting(); n != 3 || w != 2 {
		t.Fatalf("%d items wait behind %d batches, want 3 behind 2", n, w)
	}
	close(c1.release)
	if c3 := next("after a return"); c3.items != 3 {
		t.Fatalf("the batch after a return carries %d items, want 3", c3.items)
	} else {
		defer close(c3.release)
	}
	send(5)
	if c4 := next("5 items wait: minBatch"); c4.items != 5 {
		t.Fatalf("the minBatch batch carries %d items, want 5", c4.items)
	} else {
		defer close(c4.release)
	}
	send(1)
	none("one item, batches in flight, clock not moved")
	clk.Advance(20 * time.Millisecond)
	c5 := next("the stall guard on the fake clock")
	if c5.items != 1 {
		t.Fatalf("the stall batch carries %d items, want 1", c5.items)
	}
	c5.release <- errors.New("connection reset")
	o := <-items[len(items)-1].done
	if o.kind != fwdNoAnswer || !errors.Is(o.err, sequencer.ErrUnknownOutcome) {
		t.Fatalf("a transport error gave %+v, want no answer (unknown outcome)", o)
	}
	if suspected.Load() != 1 {
		t.Fatalf("suspect called %d times, want 1", suspected.Load())
	}
	close(c2.release)
	for i, it := range items[:2] {
		if o := <-it.done; o.kind != fwdAnswered || o.err != nil || o.res.MsgID == 0 {
			t.Fatalf("item %d: %+v", i, o)
		}
	}
}
