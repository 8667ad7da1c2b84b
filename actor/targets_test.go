package actor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/conv"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// gateGetter is a persist.MessagesGetter over a memstore whose calls wait
// for the test's release and are recorded.
type gateGetter struct {
	*memstore.Store
	release chan struct{} // one receive per call (nil: calls pass)
	fail    error

	mu    sync.Mutex
	calls [][]uint64
	in    chan struct{} // one send per call begun
}

func (g *gateGetter) GetMessages(ctx context.Context, ids []uint64) ([]sequencer.Message, error) {
	g.mu.Lock()
	g.calls = append(g.calls, append([]uint64(nil), ids...))
	g.mu.Unlock()
	if g.in != nil {
		g.in <- struct{}{}
	}
	if g.release != nil {
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if g.fail != nil {
		return nil, g.fail
	}
	var out []sequencer.Message
	for _, id := range ids {
		if m, err := g.GetMessage(ctx, id); err == nil {
			out = append(out, m)
		}
	}
	return out, nil
}

// storedConvs numbers storeMessages' conversations.
var storedConvs atomic.Int64

func (g *gateGetter) callIDs() [][]uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([][]uint64(nil), g.calls...)
}

// storeMessages commits n more single-message conversations and returns
// their msg_ids.
func storeMessages(t *testing.T, s *memstore.Store, n int) []uint64 {
	t.Helper()
	var ids []uint64
	for range n {
		i := storedConvs.Add(1)
		m := sequencer.Message{MsgID: uint64(1000 + i), ConvID: fmt.Sprintf("c:%d", i), Seq: 1, FromUID: 7,
			ClientMsgID: fmt.Sprintf("k%d", i), ServerAt: time.Now(), Body: []byte("b")}
		if err := s.Commit(context.Background(), []persist.ConvBatch{{ConvID: m.ConvID, Messages: []sequencer.Message{m}}}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.MsgID)
	}
	return ids
}

// While maxTargetReads reads are at the store, the reads asked for meanwhile
// wait, and go as one call when one of them returns; each asker gets its
// own targets, a stored one with its message, an unknown one with neither
// message nor error.
func TestTargetReadsGroupWhileTheStoreIsBusy(t *testing.T) {
	mem := memstore.New()
	ids := storeMessages(t, mem, 12)
	g := &gateGetter{Store: mem, release: make(chan struct{}), in: make(chan struct{}, 64)}
	r := &targetReads{store: g, timeout: 10 * time.Second}
	ctx := context.Background()

	type readAnswer struct {
		i   int
		got []struct {
			id    uint64
			found bool
			err   error
		}
	}
	answers := make(chan readAnswer, 16)
	ask := func(i int, want ...uint64) {
		go func() {
			res := r.read(ctx, want)
			a := readAnswer{i: i}
			for k, x := range res {
				if x.MsgID != want[k] {
					t.Errorf("ask %d: result %d is msg_id %d, want %d", i, k, x.MsgID, want[k])
				}
				a.got = append(a.got, struct {
					id    uint64
					found bool
					err   error
				}{x.MsgID, x.Msg.MsgID == x.MsgID && x.Msg.ConvID != "", x.Err})
			}
			answers <- a
		}()
	}
	// Two reads go to the store at once and hold it.
	ask(0, ids[0])
	<-g.in
	ask(1, ids[1], ids[2])
	<-g.in
	// Ten more are asked while both are held: none reaches the store.
	for i := 2; i < 12; i++ {
		if i == 11 {
			ask(i, ids[i], 99999) // one unknown
		} else {
			ask(i, ids[i+1])
		}
	}
	waitFor(t, "ten reads queued", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.queue) == 10
	})
	if n := len(g.callIDs()); n != 2 {
		t.Fatalf("%d store calls while two are held, want 2", n)
	}
	// The first read returns: the ten waiting reads go as one call.
	g.release <- struct{}{}
	<-g.in
	calls := g.callIDs()
	if len(calls) != 3 || len(calls[2]) != 11 {
		t.Fatalf("calls %v: want the ten waiting reads (11 ids) in the third", calls)
	}
	close(g.release)
	got := map[int]readAnswer{}
	for range 12 {
		a := <-answers
		got[a.i] = a
	}
	for i, a := range got {
		for _, x := range a.got {
			if x.err != nil {
				t.Errorf("ask %d: msg_id %d: %v", i, x.id, x.err)
			}
			if x.found != (x.id != 99999) {
				t.Errorf("ask %d: msg_id %d found=%v", i, x.id, x.found)
			}
		}
	}
	if n := len(g.callIDs()); n != 3 {
		t.Errorf("%d store calls for 12 reads, want 3", n)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running != 0 || len(r.queue) != 0 {
		t.Errorf("after the reads: %d running, %d queued", r.running, len(r.queue))
	}
}

// A failed group read fails every target of every ask in it (the core
// fails those events retryably); an asker whose context ends stops waiting,
// and its ids are not read when it gave up before its group formed.
func TestTargetReadsFailures(t *testing.T) {
	mem := memstore.New()
	ids := storeMessages(t, mem, 2)
	boom := errors.New("store down")
	r := &targetReads{store: &gateGetter{Store: mem, fail: boom}, timeout: time.Second}
	for _, x := range r.read(context.Background(), ids) {
		if !errors.Is(x.Err, boom) {
			t.Errorf("msg_id %d: err %v, want the store's", x.MsgID, x.Err)
		}
	}

	// Two reads hold the store; a third asker gives up while it waits, a
	// fourth does not: the next call reads only the fourth's ids.
	more := storeMessages(t, mem, 4)
	held := &gateGetter{Store: mem, release: make(chan struct{}), in: make(chan struct{}, 8)}
	r = &targetReads{store: held, timeout: 10 * time.Second}
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, id := range more[:2] {
		wg.Add(1)
		go func() { defer wg.Done(); r.read(ctx, []uint64{id}) }()
		<-held.in
	}
	gaveUp, cancel := context.WithCancel(ctx)
	done := make(chan []conv.TargetResult)
	go func() { done <- r.read(gaveUp, []uint64{more[2]}) }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if res := r.read(ctx, []uint64{more[3]}); res[0].Err != nil || res[0].Msg.MsgID != more[3] {
			t.Errorf("the fourth read: %+v", res[0])
		}
	}()
	waitFor(t, "two reads queued", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.queue) == 2
	})
	cancel()
	if res := <-done; !errors.Is(res[0].Err, context.Canceled) {
		t.Fatalf("the read given up: %+v, want canceled", res[0])
	}
	close(held.release)
	wg.Wait()
	calls := held.callIDs()
	if len(calls) != 3 || len(calls[2]) != 1 || calls[2][0] != more[3] {
		t.Fatalf("calls %v: want the third to read only msg_id %d (the read given up dropped)", calls, more[3])
	}
	waitFor(t, "the reads to end", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.running == 0 && len(r.queue) == 0
	})
}

// A node on a store that reads many messages at once reads its writers'
// uncached targets through it: recalls of messages the writers no longer
// remember, in many conversations at once, all land.
func TestRecallsOfForgottenTargetsReadTogether(t *testing.T) {
	mem := memstore.New()
	g := &gateGetter{Store: mem}
	n := newNode(t, Config{Store: g})
	ctx := context.Background()
	const convs = 40
	targets := make([]uint64, convs)
	for i := range convs {
		conv := fmt.Sprintf("g:%d", i)
		m, err := n.Send(ctx, req(conv, conv+"/first"))
		if err != nil {
			t.Fatal(err)
		}
		targets[i] = m.MsgID
		// Push the first message out of the writer's memory.
		for k := range 20 {
			if _, err := n.Send(ctx, req(conv, fmt.Sprintf("%s/more-%d", conv, k))); err != nil {
				t.Fatal(err)
			}
		}
	}
	var wg sync.WaitGroup
	for i := range convs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := n.Send(ctx, recallReq(fmt.Sprintf("g:%d", i), fmt.Sprintf("g:%d/recall", i), 1, targets[i]))
			if err != nil || r.Seq != 22 {
				t.Errorf("recall in g:%d: %+v %v", i, r, err)
			}
		}()
	}
	wg.Wait()
	read := 0
	for _, c := range g.callIDs() {
		read += len(c)
	}
	if read != convs {
		t.Errorf("the writers read %d targets through GetMessages, want %d (one per recall)", read, convs)
	}
	for _, id := range targets {
		if m, _ := mem.GetMessage(ctx, id); !m.Recalled {
			t.Errorf("msg_id %d not recalled", id)
		}
	}
}
