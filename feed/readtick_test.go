package feed

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/persist"
)

// subscribeReads is subscribe with read ticks on; it returns once the
// stream is attached (ticks are live only).
func (n *node) subscribeReads(cursors ...persist.Cursor) *sub {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sub{events: make(chan Event, 100), done: make(chan error, 1), cancel: cancel}
	before := n.hub.readStreams.Load()
	go n.serve(ctx, s, Subscription{Cursors: cursors, ReadPositions: true})
	n.t.Cleanup(cancel)
	deadline := time.Now().Add(10 * time.Second)
	for n.hub.readStreams.Load() == before {
		if time.Now().After(deadline) {
			n.t.Fatal("the stream never attached")
		}
		time.Sleep(time.Millisecond)
	}
	return s
}

// ticks reads events until it got want ticks, and returns them with the
// message seqs seen meanwhile.
func (s *sub) ticks(t *testing.T, want int) (ticks []ReadTick, seqs []uint64) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for len(ticks) < want {
		select {
		case e := <-s.events:
			switch e.Kind {
			case KindReadPosition:
				ticks = append(ticks, ReadTick{ConvID: e.ConvID, UID: e.UID, ReadSeq: e.ReadSeq})
			case KindMessage:
				seqs = append(seqs, e.Msg.Seq)
			}
		case err := <-s.done:
			t.Fatalf("stream ended: %v (ticks %v)", err, ticks)
		case <-deadline:
			t.Fatalf("got ticks %v, want %d", ticks, want)
		}
	}
	return ticks, seqs
}

// A stream with read ticks on gets MarkRead's ticks (PublishRead, and from
// a peer DeliverRead) and its conversations' senders' ticks (the own-send
// rule, one per sender and batch at their highest seq); other
// conversations' ticks never, streams without the option never.
func TestReadTicks(t *testing.T) {
	n := newNode(t, Config{})
	plain := n.subscribe(100, persist.Cursor{ConvID: "a"})
	s := n.subscribeReads(persist.Cursor{ConvID: "a"})
	n.hub.PublishRead(ReadTick{ConvID: "b", UID: 9, ReadSeq: 1}) // not followed
	n.write("a", 3, true)                                        // uid 1 sends 1..3
	n.hub.PublishRead(ReadTick{ConvID: "a", UID: 7, ReadSeq: 2})
	n.hub.DeliverRead([]ReadTick{{ConvID: "a", UID: 8, ReadSeq: 3}})
	got, _ := s.ticks(t, 3)
	want := []ReadTick{{"a", 1, 3}, {"a", 7, 2}, {"a", 8, 3}}
	if !slices.Equal(got, want) {
		t.Fatalf("ticks = %v, want %v", got, want)
	}
	// The stream without read ticks saw the messages and nothing else.
	n.write("a", 1, true)
	for seen := 0; seen < 4; {
		select {
		case e := <-plain.events:
			if e.Kind == KindReadPosition {
				t.Fatalf("a stream without read_positions got a tick: %+v", e)
			}
			if e.Kind == KindMessage {
				seen++
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the plain stream got no messages")
		}
	}
	if got, _ := s.ticks(t, 1); !slices.Equal(got, []ReadTick{{"a", 1, 4}}) {
		t.Fatalf("tick of the fourth message = %v", got)
	}
	if n.hub.readStreams.Load() != 1 {
		t.Fatalf("read streams = %d, want 1", n.hub.readStreams.Load())
	}
	s.cancel()
	<-s.done
	if n.hub.readStreams.Load() != 0 {
		t.Fatalf("read streams after the end = %d, want 0", n.hub.readStreams.Load())
	}
}

// With the own-send rule off (--send-marks-read=false) a message is no
// tick; MarkRead's still are.
func TestReadTicksOwnSendOff(t *testing.T) {
	n := newNode(t, Config{KeepReadPositions: true})
	s := n.subscribeReads(persist.Cursor{ConvID: "a"})
	n.write("a", 2, true)
	n.hub.PublishRead(ReadTick{ConvID: "a", UID: 7, ReadSeq: 2})
	got, seqs := s.ticks(t, 1)
	if !slices.Equal(got, []ReadTick{{"a", 7, 2}}) {
		t.Fatalf("ticks = %v (messages %v), want only MarkRead's", got, seqs)
	}
}

// A peer's Tap carries MarkRead's ticks (the peer's own streams derive the
// senders' ticks from the messages), and DeliverRead never feeds a Tap.
func TestReadTicksThroughTaps(t *testing.T) {
	n := newNode(t, Config{})
	tap := n.hub.NewTap()
	defer tap.Close()
	tap.Follow([]string{"a"}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, acks, err := tap.Next(ctx); err != nil || !slices.Equal(acks, []uint64{1}) {
		t.Fatalf("first Next: %v %v", acks, err)
	}
	n.hub.DeliverRead([]ReadTick{{ConvID: "a", UID: 8, ReadSeq: 1}})
	n.write("a", 1, true)
	n.hub.PublishRead(ReadTick{ConvID: "a", UID: 7, ReadSeq: 1})
	var reads []ReadTick
	msgs := 0
	for len(reads) == 0 {
		ps, _, err := tap.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			msgs += len(p.Msgs)
			reads = append(reads, p.Reads...)
		}
	}
	if !slices.Equal(reads, []ReadTick{{"a", 7, 1}}) || msgs != 1 {
		t.Fatalf("tap got ticks %v and %d messages, want MarkRead's tick and 1 message", reads, msgs)
	}
}
