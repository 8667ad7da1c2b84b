package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/persist/pgtest"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// Read positions in a cluster: any node answers from the shared store (no
// forwarding), marks from two nodes end at the higher one, and a position
// never goes backwards across the owner's crash (failover) and its return
// (handoff).
func TestReadPositionsAcrossNodes(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a := startNode(t, "a", "--store", dsn, "--cluster-listen", freeAddr(t), "--node-id", "a")
	b := startNode(t, "b", "--store", dsn, "--cluster-listen", freeAddr(t), "--node-id", "b")
	ca, cb := a.grpcClient(), b.grpcClient()
	ctx := context.Background()
	// A conversation b owns, with 5 messages sent through a (forwarded).
	var conv string
	waitFor(t, 30*time.Second, "b to own a conversation", func() bool {
		for i := 0; i < 200; i++ {
			c := fmt.Sprintf("rp-%d", i)
			r, err := ca.Route(ctx, connect.NewRequest(&sequencerv1.RouteRequest{ConvId: c}))
			if err == nil && r.Msg.NodeId == "b" {
				if _, err := send(ctx, ca, c, 1, "m1-"+c, nil); err == nil {
					conv = c
					return true
				}
			}
		}
		return false
	})
	for i := 2; i <= 5; i++ {
		if _, err := send(ctx, ca, conv, 1, fmt.Sprintf("m%d-%s", i, conv), nil); err != nil {
			t.Fatal(err)
		}
	}
	mark := func(c sequencerv1connect.SequencerServiceClient, seq uint64) (*sequencerv1.MarkReadResponse, error) {
		r, err := c.MarkRead(ctx, connect.NewRequest(&sequencerv1.MarkReadRequest{ConvId: conv, Uid: 42, Seq: seq}))
		if err != nil {
			return nil, err
		}
		return r.Msg, nil
	}
	state := func(c sequencerv1connect.SequencerServiceClient) *sequencerv1.ReadState {
		t.Helper()
		r, err := c.GetReadState(ctx, connect.NewRequest(&sequencerv1.GetReadStateRequest{Uid: 42, ConvIds: []string{conv}}))
		if err != nil {
			t.Fatalf("GetReadState: %v", err)
		}
		return r.Msg.States[0]
	}
	if r, err := mark(cb, 4); err != nil || r.ReadSeq != 4 || r.HeadSeq != 5 || r.Unread != 1 {
		t.Fatalf("mark 4 on the owner: %v, %v", r, err)
	}
	if r, err := mark(ca, 2); err != nil || r.ReadSeq != 4 || r.Unread != 1 {
		t.Fatalf("mark 2 on the other node after 4: %v, %v (went backwards)", r, err)
	}
	if sa, sb := state(ca), state(cb); sa.ReadSeq != 4 || sb.ReadSeq != 4 || sa.HeadSeq != 5 || sb.HeadSeq != 5 {
		t.Fatalf("the nodes disagree: a %v, b %v", sa, sb)
	}

	// The owner dies: the survivor still answers the position (it never
	// needed the owner), and after the failover the conversation goes on.
	b.kill()
	if s := state(ca); s.ReadSeq != 4 {
		t.Fatalf("after the owner died: %v", s)
	}
	waitFor(t, 60*time.Second, "a send after the failover", func() bool {
		r, err := send(ctx, ca, conv, 1, "m6-"+conv, nil)
		return err == nil && r.Seq == 6
	})
	if r, err := mark(ca, 100); err != nil || r.ReadSeq != 6 || r.HeadSeq != 6 || r.Unread != 0 {
		t.Fatalf("mark past the head after the failover: %v, %v", r, err)
	}

	// b comes back and takes its partitions again (handoff): a lower mark
	// through it changes nothing.
	b.start(b.Addr)
	b.waitReady(30 * time.Second)
	if r, err := mark(b.grpcClient(), 3); err != nil || r.ReadSeq != 6 || r.HeadSeq != 6 {
		t.Fatalf("mark 3 on the returned node: %v, %v (went backwards)", r, err)
	}
}

// Read ticks in a cluster: a stream at node a with read_positions gets the
// MarkRead made at node b (carried on the peer feed) and the sender's tick
// of a message sent through b, whoever owns the conversation.
func TestReadTicksAcrossNodes(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	a := startNode(t, "a", "--store", dsn, "--cluster-listen", freeAddr(t), "--node-id", "a")
	b := startNode(t, "b", "--store", dsn, "--cluster-listen", freeAddr(t), "--node-id", "b")
	ca, cb := a.grpcClient(), b.grpcClient()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const conv = "ticks-1"
	waitFor(t, 30*time.Second, "a first message", func() bool {
		_, err := send(ctx, cb, conv, 5, "t-1", nil)
		return err == nil
	})
	st, err := ca.Subscribe(ctx, connect.NewRequest(&sequencerv1.SubscribeRequest{
		Cursors: []*sequencerv1.Cursor{{ConvId: conv, AfterSeq: 1}}, ReadPositions: true}))
	if err != nil {
		t.Fatal(err)
	}
	ticks := make(chan *sequencerv1.ReadPositionChanged, 100)
	go func() {
		for st.Receive() {
			if r := st.Msg().GetReadPosition(); r != nil {
				ticks <- r
			}
		}
		close(ticks)
	}()
	// Marks at b until a's stream shows one (the peer link and the stream
	// attach asynchronously; ticks are live only).
	want := func(what string, act func(), ok func(*sequencerv1.ReadPositionChanged) bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			act()
			select {
			case r, open := <-ticks:
				if !open {
					t.Fatalf("%s: the stream ended: %v", what, st.Err())
				}
				if ok(r) {
					return
				}
			case <-time.After(200 * time.Millisecond):
			}
		}
		t.Fatalf("%s: no tick at node a", what)
	}
	want("MarkRead at b", func() {
		if _, err := cb.MarkRead(ctx, connect.NewRequest(&sequencerv1.MarkReadRequest{ConvId: conv, Uid: 77, Seq: 1})); err != nil {
			t.Fatal(err)
		}
	}, func(r *sequencerv1.ReadPositionChanged) bool {
		return r.GetConvId() == conv && r.GetUid() == 77 && r.GetReadSeq() == 1
	})
	n := 1
	want("a send through b", func() {
		n++
		if _, err := send(ctx, cb, conv, 88, fmt.Sprintf("t-%d", n), nil); err != nil {
			t.Fatal(err)
		}
	}, func(r *sequencerv1.ReadPositionChanged) bool {
		return r.GetConvId() == conv && r.GetUid() == 88 && r.GetReadSeq() >= 2
	})
}
