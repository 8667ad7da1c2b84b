package feed

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/internal/testwait"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// node is a store and a hub, with a writer that commits then publishes,
// as the conversation actors do.
type node struct {
	t     *testing.T
	store *memstore.Store
	hub   *Hub
	mu    sync.Mutex
	heads map[string]uint64
}

func newNode(t *testing.T, cfg Config) *node {
	return &node{t: t, store: memstore.New(), hub: NewHub(cfg, nil), heads: map[string]uint64{}}
}

// write commits n messages to conv and publishes them (publish false: a
// commit the hub never hears of, as across a handoff).
func (n *node) write(conv string, count int, publish bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	prev := n.heads[conv]
	b := persist.ConvBatch{ConvID: conv, PrevHead: prev}
	for i := 1; i <= count; i++ {
		s := prev + uint64(i)
		b.Messages = append(b.Messages, sequencer.Message{ConvID: conv, Seq: s, MsgID: uint64(conv[0])<<40 | s, FromUID: 1, ClientMsgID: fmt.Sprint(conv, s), Body: []byte{}})
	}
	if err := n.store.Commit(context.Background(), []persist.ConvBatch{b}); err != nil {
		n.t.Fatal(err)
	}
	n.heads[conv] = prev + uint64(count)
	if publish {
		n.hub.Publish(conv, b.Messages)
	}
}

// sub is a running Serve whose events land in a channel.
type sub struct {
	events chan Event
	done   chan error
	cancel context.CancelFunc
}

func (n *node) subscribe(buf int, cursors ...persist.Cursor) *sub {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sub{events: make(chan Event, buf), done: make(chan error, 1), cancel: cancel}
	go n.serve(ctx, s, Subscription{Cursors: cursors})
	n.t.Cleanup(cancel)
	return s
}

// serve runs sub on the node's hub and store, its events into s.
func (n *node) serve(ctx context.Context, s *sub, sub Subscription) {
	sub.Store, sub.Cut = n.store, s.cancel
	sub.Send = func(e Event) error {
		select {
		case s.events <- e:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.done <- n.hub.Serve(ctx, sub)
}

// collect reads events until every conversation of want reached its seq.
func (s *sub) collect(t *testing.T, want map[string]uint64) map[string][]uint64 {
	t.Helper()
	got := map[string][]uint64{}
	deadline := time.After(10 * time.Second)
	for {
		done := true
		for c, w := range want {
			if l := got[c]; len(l) == 0 && w > 0 || len(l) > 0 && l[len(l)-1] < w {
				done = false
			}
		}
		if done {
			return got
		}
		select {
		case e := <-s.events:
			if e.Kind == KindMessage {
				got[e.Msg.ConvID] = append(got[e.Msg.ConvID], e.Msg.Seq)
			}
		case err := <-s.done:
			t.Fatalf("stream ended: %v (got %v)", err, got)
		case <-deadline:
			t.Fatalf("got %v, want up to %v", got, want)
		}
	}
}

func contiguous(t *testing.T, conv string, seqs []uint64, from, to uint64) {
	t.Helper()
	if uint64(len(seqs)) != to-from+1 {
		t.Fatalf("%s: got %d seqs (%v), want %d..%d", conv, len(seqs), seqs, from, to)
	}
	for i, s := range seqs {
		if s != from+uint64(i) {
			t.Fatalf("%s: seq %d at %d, want %d (%v)", conv, s, i, from+uint64(i), seqs)
		}
	}
}

// Backlog then live across concurrent writes, commits the hub never heard
// of filled from the store: each conversation exactly once, in order.
func TestServeBacklogThenLive(t *testing.T) {
	n := newNode(t, Config{readPage: 7, readBudget: 10})
	n.write("a", 25, true)
	n.write("b", 3, true)
	s := n.subscribe(1000, persist.Cursor{ConvID: "a", AfterSeq: 5}, persist.Cursor{ConvID: "b"}, persist.Cursor{ConvID: "c"})
	var wg sync.WaitGroup
	for _, c := range []string{"a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				n.write(c, 1+i%3, i%5 != 4) // every fifth commit unpublished
			}
		}()
	}
	wg.Wait()
	n.write("a", 1, true) // a last published one makes the holes visible
	n.write("b", 1, true)
	n.write("c", 1, true)
	want := map[string]uint64{"a": n.heads["a"], "b": n.heads["b"], "c": n.heads["c"]}
	got := s.collect(t, want)
	contiguous(t, "a", got["a"], 6, want["a"])
	contiguous(t, "b", got["b"], 1, want["b"])
	contiguous(t, "c", got["c"], 1, want["c"])
}

// A subscriber that stops reading is cut with resource_exhausted; the
// writer never waits; resuming from its last seq loses and repeats nothing.
func TestServeSlowConsumerCutAndResumes(t *testing.T) {
	n := newNode(t, Config{MaxQueue: 8})
	s := n.subscribe(0, persist.Cursor{ConvID: "a"})
	n.write("a", 1, true)
	first := <-s.events // then it stops reading
	for i := 0; i < 20; i++ {
		n.write("a", 1, true) // never blocks
	}
	var err error
	select {
	case err = <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow stream was not cut")
	}
	if !errors.Is(err, ErrBehind) || sequencer.ErrorCode(err) != sequencer.CodeResourceExhausted {
		t.Fatalf("cut with %v, want ErrBehind (resource_exhausted)", err)
	}
	r := n.subscribe(1000, persist.Cursor{ConvID: "a", AfterSeq: first.Msg.Seq})
	got := r.collect(t, map[string]uint64{"a": 21})
	contiguous(t, "a", got["a"], 2, 21)
	if st, f := n.hub.Stats(); st != 1 || f != 1 {
		t.Fatalf("hub holds %d streams, %d follows after the cut one ended; want 1, 1", st, f)
	}
	// The metrics' view: one cut, every message delivered once to one
	// stream or the other (the first, then 2..21 after the resume).
	// (A send is counted once it returned: the last one may still be
	// returning when collect has it.)
	var tot Totals
	testwait.For(t, 10*time.Second, time.Millisecond, "21 deliveries counted", func() bool {
		tot = n.hub.Totals()
		return tot.Delivered >= 21
	})
	if tot.Cut != 1 || tot.Delivered != 21 || tot.Streams != 1 || tot.Conversations != 1 || tot.BacklogReads < 2 || tot.BacklogMsgs < 20 {
		t.Fatalf("totals %+v: want 1 cut, 21 delivered, 1 stream on 1 conversation, >= 2 backlog reads of >= 20 messages", tot)
	}
}

// The node's subscription bound refuses a stream that would pass it.
func TestServeSubscriptionBound(t *testing.T) {
	n := newNode(t, Config{MaxSubscriptions: 3})
	first := n.subscribe(10, persist.Cursor{ConvID: "a"}, persist.Cursor{ConvID: "b"})
	n.write("a", 1, true)
	first.collect(t, map[string]uint64{"a": 1}) // attached (Serve runs on its own goroutine)
	s := n.subscribe(10, persist.Cursor{ConvID: "a"})
	s.collect(t, map[string]uint64{"a": 1}) // 3 of 3: served
	over := n.subscribe(10, persist.Cursor{ConvID: "c"})
	select {
	case err := <-over.done:
		if sequencer.ErrorCode(err) != sequencer.CodeResourceExhausted {
			t.Fatalf("over the bound: %v, want resource_exhausted", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a stream over the bound was served")
	}
	if tot := n.hub.Totals(); tot.Refused != 1 || tot.Follows != 3 {
		t.Fatalf("totals %+v: want 1 refused, 3 follows", tot)
	}
}

// A silent stream gets a heartbeat each interval of the (fake) clock.
func TestServeHeartbeat(t *testing.T) {
	fk := clock.NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	n := newNode(t, Config{Heartbeat: 10 * time.Second, Clock: fk})
	s := n.subscribe(10, persist.Cursor{ConvID: "a"})
	n.write("a", 1, true)
	s.collect(t, map[string]uint64{"a": 1})
	deadline := time.After(10 * time.Second)
	for beats := 0; beats < 2; {
		fk.Advance(5 * time.Second)
		select {
		case e := <-s.events:
			if e.Kind != KindHeartbeat {
				t.Fatalf("event %v, want a heartbeat", e)
			}
			beats++
		case <-deadline:
			t.Fatal("no heartbeat")
		default:
		}
	}
}

// A store that fails ends the stream with its (retryable) code.
func TestServeStoreDown(t *testing.T) {
	n := newNode(t, Config{})
	n.store.Close()
	s := n.subscribe(10, persist.Cursor{ConvID: "a"})
	select {
	case err := <-s.done:
		if sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
			t.Fatalf("store down: %v, want unavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end")
	}
}

// upstreamLog records the Upstream's calls in order; Unfollow waits for
// release once entered is closed (a slow Upstream).
type upstreamLog struct {
	mu      sync.Mutex
	calls   []string // "+conv" / "-conv"
	entered chan struct{}
	release chan struct{}
}

func (u *upstreamLog) Follow(convIDs []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range convIDs {
		u.calls = append(u.calls, "+"+c)
	}
}

func (u *upstreamLog) Unfollow(convIDs []string) {
	close(u.entered)
	<-u.release
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range convIDs {
		u.calls = append(u.calls, "-"+c)
	}
}

// TestHubInterestOrder: a conversation's last stream detaching while a
// new first one attaches reaches the Upstream as Unfollow then Follow, in
// the order the hub decided them, even when the Unfollow call is slow: the
// Upstream's last word is Follow, so the new stream still gets the other
// nodes' live messages. (Before the hub ordered its calls, the attach's
// Follow overtook the detach's Unfollow and the peers stopped sending the
// conversation to a node that still had a subscriber on it.)
func TestHubInterestOrder(t *testing.T) {
	up := &upstreamLog{entered: make(chan struct{}), release: make(chan struct{})}
	h := NewHub(Config{}, up)
	cur := []persist.Cursor{{ConvID: "x"}}
	a, err := h.attach(cur, nil)
	if err != nil {
		t.Fatal(err)
	}
	detached := make(chan struct{})
	go func() { h.detach(a, cur); close(detached) }()
	<-up.entered // the hub decided "x" is gone and is telling the Upstream
	attached := make(chan error, 1)
	go func() { _, err := h.attach(cur, nil); attached <- err }()
	// Give the attach its chance to overtake (it must not: it waits for
	// the Unfollow to be told).
	select {
	case err := <-attached:
		attached <- err
	case <-time.After(100 * time.Millisecond):
	}
	close(up.release)
	<-detached
	if err := <-attached; err != nil {
		t.Fatal(err)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if want := []string{"+x", "-x", "+x"}; !slices.Equal(up.calls, want) {
		t.Fatalf("the Upstream was told %v, want %v: the hub follows x but its peers were told last to stop", up.calls, want)
	}
}

// stuckStore's reads never answer until their context ends, as a store
// read on a connection whose packets are dropped (a blackholed link).
type stuckStore struct{}

func (stuckStore) ReadMany(ctx context.Context, _ []persist.Cursor, _, _ int) ([]persist.Page, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A backlog read that the store does not answer ends the stream with
// unavailable after ReadTimeout, instead of holding it open and silent (no
// message, no heartbeat) for as long as the store's connection hangs: the
// subscriber resumes at another node. (Seen in CI: a Subscribe served by a
// node whose MySQL link had been blackholed stayed open and silent for
// minutes.)
func TestServeEndsAStreamWhoseBacklogReadHangs(t *testing.T) {
	n := newNode(t, Config{ReadTimeout: 50 * time.Millisecond, Heartbeat: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- n.hub.Serve(ctx, Subscription{Cursors: []persist.Cursor{{ConvID: "a"}}, Store: stuckStore{},
			Send: func(Event) error { return nil }})
	}()
	select {
	case err := <-done:
		if sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
			t.Fatalf("stream ended with %v (code %v); want unavailable", err, sequencer.ErrorCode(err))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream is still open 10 s after its backlog read hung (ReadTimeout 50 ms)")
	}
}
