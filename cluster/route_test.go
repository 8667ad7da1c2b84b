package cluster

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ring"
)

// countLocal is a local writer that stores nothing and counts its calls.
type countLocal struct {
	nopLocal
	sends atomic.Int64
}

func (l *countLocal) Send(context.Context, sequencer.SendRequest) (sequencer.SendResult, error) {
	l.sends.Add(1)
	return sequencer.SendResult{Seq: 1}, nil
}

// TestCutNodeAnswersAtOnce: the write check runs once per send, in
// Dispatch. A node whose membership lease ran out unrenewed holds its
// partitions but can write nothing: Dispatch says so (Destination.Cut) and
// the router answers at once with a retryable not-owner error, without
// asking the local writer and without waiting for the handoff.
func TestCutNodeAnswersAtOnce(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Now())
	mem := membership.NewMem(clk)
	net := NewMemNetwork()
	net.IgnoreWakes = true
	n, err := New(Config{NodeID: "a", Store: mem, Transport: net.Transport("mem://a"), Clock: clk, Logger: simLogger(),
		Ring: ring.Config{Partitions: 3}, HandoffWait: time.Hour, ForwardTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	local := &countLocal{}
	if err := n.start(ctx, local); err != nil {
		t.Fatal(err)
	}
	n.reconcile(ctx)
	if n.held() != 3 {
		t.Fatalf("holds %d partitions, want 3", n.held())
	}
	req := sequencer.SendRequest{ConvID: "c", FromUID: 1, ClientMsgID: "k", MsgType: 1, Body: []byte("x")}
	if _, err := n.Send(ctx, req); err != nil || local.sends.Load() != 1 {
		t.Fatalf("send while writable: %v, local writer asked %d times, want once", err, local.sends.Load())
	}

	clk.Advance(n.cfg.MemberTTL + time.Millisecond) // no renewal
	if d, _ := n.dispatch(ring.PartitionOf("c", n.partitions)); !d.Cut {
		t.Fatalf("Dispatch of a node not renewed for MemberTTL: %+v, want cut", d)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err = n.Send(sctx, req)
	if !errors.Is(err, sequencer.ErrNotOwner) || sequencer.ErrorCode(err) != sequencer.CodeUnavailable ||
		!strings.Contains(err.Error(), "cannot write partition") {
		t.Fatalf("send on a cut node: %v, want an immediate retryable not-owner answer", err)
	}
	if local.sends.Load() != 1 {
		t.Fatalf("a cut node asked its local writer (%d calls)", local.sends.Load())
	}

	// A send redirected here after another node's attempt got no answer
	// (sequencer.WithEarlierOutcomeUnknown) may be stored already: the cut node
	// must not answer it "not stored"; with nowhere to send it, it waits
	// for a change until the caller's deadline.
	uctx, ucancel := context.WithTimeout(sequencer.WithEarlierOutcomeUnknown(ctx), 200*time.Millisecond)
	defer ucancel()
	_, err = n.Send(uctx, req)
	if !errors.Is(err, context.DeadlineExceeded) || sequencer.ErrorCode(err).Retryable() {
		t.Fatalf("a send whose earlier outcome is unknown, on a cut node: %v, want the deadline (outcome unknown), never unavailable", err)
	}
}
