package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ring"
)

// nopLocal is a local writer that is never asked to write.
type nopLocal struct{}

func (nopLocal) Send(context.Context, sequencer.SendRequest) (sequencer.SendResult, error) {
	return sequencer.SendResult{}, sequencer.ErrNotOwner
}
func (nopLocal) SendBatch(_ context.Context, _ []sequencer.SendRequest, out []sequencer.SendOutcome) {
	for i := range out {
		out[i].Err = sequencer.ErrNotOwner
	}
}
func (nopLocal) StopConversations(context.Context, func(string) bool) error { return nil }

// TestRenewalWithANewViewReconcilesAtOnce: a renewal that brings a new
// membership view (a member joined, left or expired) wakes the partition
// reconciliation at once, so what moved is taken or handed off without
// waiting for the next reconcile tick; a renewal with the same view does
// not.
func TestRenewalWithANewViewReconcilesAtOnce(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Now())
	mem := membership.NewMem(clk)
	net := NewMemNetwork()
	net.IgnoreWakes = true
	n, err := New(Config{NodeID: "a", Store: mem, Transport: net.Transport("mem://a"), Clock: clk, Logger: simLogger(),
		Ring: ring.Config{Partitions: 7}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.start(ctx, nopLocal{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.wakeRecon: // whatever start left
	default:
	}
	n.beat(ctx)
	if len(n.wakeRecon) != 0 {
		t.Fatal("a renewal with the same view woke the reconciliation")
	}
	if _, err := mem.Join(ctx, membership.Member{NodeID: "b", Incarnation: "b/1", ClusterAddr: "mem://b", Partitions: 7, Protocol: ProtocolVersion},
		n.cfg.MemberTTL, false); err != nil {
		t.Fatal(err)
	}
	n.beat(ctx)
	if len(n.wakeRecon) != 1 {
		t.Fatal("a renewal that brought a new member did not wake the reconciliation")
	}
}
