package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sequencer-im/sequencer"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// gateTransport holds every forwarded batch until the test releases it
// (once on).
type gateTransport struct {
	Transport
	on    atomic.Bool
	calls chan gatedCall
}

type gatedCall struct {
	items   int
	release chan struct{}
}

func (g *gateTransport) Forward(ctx context.Context, addr string, req *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
	if !g.on.Load() {
		return g.Transport.Forward(ctx, addr, req)
	}
	c := gatedCall{items: len(req.Items), release: make(chan struct{})}
	g.calls <- c
	select {
	case <-c.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Transport.Forward(ctx, addr, req)
}

// TestForwardPolicy: the first batches to a peer leave with one item each;
// past them, items wait and leave together in the batch that follows a
// return; enough waiting items, or batches in flight for too long, make
// another batch leave while the others are still out. Every send is acked
// and stored.
func TestForwardPolicy(t *testing.T) {
	s := newSim(t)
	gate := &gateTransport{calls: make(chan gatedCall, 16)}
	s.wrap = func(id string, tr Transport) Transport {
		if id != "b" {
			return tr
		}
		gate.Transport = tr
		return gate
	}
	s.start("a")
	s.start("b")
	s.settle(6)
	var convs []string // owned by a
	for _, c := range simConvs {
		if loc, err := s.nodes["a"].node.locate(c); err == nil && loc.NodeID == "a" {
			convs = append(convs, c)
		}
	}
	if len(convs) == 0 {
		t.Fatal("a owns no conversation")
	}
	b := s.nodes["b"].node
	gate.on.Store(true)
	b.fwd.mu.Lock()
	b.fwd.policy = forwardPolicy{eager: 2, minBatch: 5, stall: time.Hour}
	b.fwd.mu.Unlock()

	type answer struct {
		req sequencer.SendRequest
		res sequencer.SendResult
		err error
	}
	answers := make(chan answer, 64)
	sent := 0
	send := func(k int) {
		for range k {
			sent++
			req := sequencer.SendRequest{ConvID: convs[sent%len(convs)], FromUID: 7, ClientMsgID: fmt.Sprintf("p%d", sent), MsgType: 1}
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				res, err := b.Send(ctx, req)
				answers <- answer{req, res, err}
			}()
		}
	}
	next := func(what string) gatedCall {
		t.Helper()
		select {
		case c := <-gate.calls:
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("no batch left: %s", what)
			return gatedCall{}
		}
	}
	// waitQueued waits until n items wait for the peer behind workers
	// batches in flight (counted when the batches were started).
	waitQueued := func(n, workers int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			b.fwd.mu.Lock()
			items, w := 0, 0
			for _, pq := range b.fwd.peers {
				items, w = pq.items, pq.workers
			}
			b.fwd.mu.Unlock()
			if items == n && w == workers {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d items wait behind %d batches, want %d behind %d", items, w, n, workers)
			}
			time.Sleep(time.Millisecond)
		}
	}

	send(1)
	c1 := next("the first item")
	send(1)
	c2 := next("the second item (2 batches leave at once)")
	if c1.items != 1 || c2.items != 1 {
		t.Fatalf("first batches carry %d and %d items, want 1 and 1", c1.items, c2.items)
	}
	send(3)
	waitQueued(3, 2) // held: no third batch started
	close(c1.release)
	c3 := next("after a batch returned")
	if c3.items != 3 {
		t.Fatalf("the batch after a return carries %d items, want the 3 that waited", c3.items)
	}
	send(5) // minBatch: another batch leaves, c2 and c3 still out
	c4 := next("5 items waiting")
	if c4.items != 5 {
		t.Fatalf("the batch for the waiting items carries %d, want 5", c4.items)
	}
	b.fwd.mu.Lock()
	b.fwd.policy.stall = time.Millisecond
	b.fwd.mu.Unlock()
	send(1) // the batches in flight stall: this one does not wait for them
	waitQueued(1, 3)
	s.clk.Advance(time.Millisecond) // the node's clock: the stall guard runs on it
	c5 := next("batches in flight stalled")
	if c5.items != 1 {
		t.Fatalf("the stall batch carries %d items, want 1", c5.items)
	}
	for _, c := range []gatedCall{c2, c3, c4, c5} {
		close(c.release)
	}
	for range sent {
		a := <-answers
		if a.err != nil {
			t.Fatalf("send %s: %v", a.req.ClientMsgID, a.err)
		}
		s.acked[a.req.Key()] = a.res
	}
	if n := len(gate.calls); n != 0 {
		t.Fatalf("%d batches more than expected", n)
	}
	s.checkAcked()
}

// TestEncodeReplies: a batch's answers encoded together read back as each
// encoded alone: results, and errors with their code and sentinel.
func TestEncodeReplies(t *testing.T) {
	at := time.UnixMilli(1700000000123).UTC()
	out := []sequencer.SendOutcome{
		{Result: sequencer.SendResult{MsgID: 11, Seq: 1, ServerAt: at}},
		{Err: sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrOwnershipMoving, "partition 3 moving")},
		{Result: sequencer.SendResult{MsgID: 12, Seq: 2, ServerAt: at, Duplicate: true}},
		{Err: sequencer.Wrap(sequencer.CodeInvalidArgument, nil, "body too large")},
		{Result: sequencer.SendResult{MsgID: 13, Seq: 3, ServerAt: at}},
	}
	wire, err := proto.Marshal(encodeReplies("a", out))
	if err != nil {
		t.Fatal(err)
	}
	var reply clusterv1.ForwardBatchReply
	if err := proto.Unmarshal(wire, &reply); err != nil {
		t.Fatal(err)
	}
	if reply.NodeId != "a" || len(reply.Results) != len(out) {
		t.Fatalf("reply from %q with %d results, want a and %d", reply.NodeId, len(reply.Results), len(out))
	}
	for i, o := range out {
		if want := encodeReply(o.Result, o.Err); !proto.Equal(reply.Results[i], want) {
			t.Fatalf("result %d: %v, want %v", i, reply.Results[i], want)
		}
		r := reply.Results[i]
		r.NodeId = reply.NodeId
		res, err := decodeReply(r)
		if o.Err == nil && (err != nil || res != o.Result) {
			t.Fatalf("result %d decoded as %+v, %v; want %+v", i, res, err, o.Result)
		}
		if o.Err != nil && sequencer.ErrorCode(err) != sequencer.ErrorCode(o.Err) {
			t.Fatalf("error %d decoded as %v (code %v), want code %v", i, err, sequencer.ErrorCode(err), sequencer.ErrorCode(o.Err))
		}
	}
	if _, err := decodeReply(reply.Results[1]); !errors.Is(err, sequencer.ErrOwnershipMoving) {
		t.Fatalf("error 1 decoded as %v, want ErrOwnershipMoving", err)
	}
}
