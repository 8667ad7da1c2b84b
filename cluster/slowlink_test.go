package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
)

func TestLinkTimes(t *testing.T) {
	var l linkTimes
	t0 := time.Unix(1000, 0)
	limit := 100 * time.Millisecond
	if _, slow, _ := l.slow("p", t0, limit); slow {
		t.Fatal("a link never measured is slow")
	}
	l.note("p", 300*time.Millisecond, t0, limit)
	if avg, slow, re := l.slow("p", t0.Add(10*time.Millisecond), limit); !slow || re || avg != 300*time.Millisecond {
		t.Fatalf("after a 300 ms forward: %v %v remeasure %v, want slow at 300ms, no remeasure", avg, slow, re)
	}
	if _, slow, _ := l.slow("q", t0, limit); slow {
		t.Fatal("another peer's link is slow")
	}
	if _, slow, _ := l.slow("p", t0, 0); slow {
		t.Fatal("slow with the check off (limit 0)")
	}
	// A verdict linkFresh old still holds, and asks one caller (not every
	// one) to measure the link again, until that measure ends or linkFresh
	// passed without it.
	stale := t0.Add(linkFresh)
	if _, slow, re := l.slow("p", stale, limit); !slow || !re {
		t.Fatalf("a verdict linkFresh old: slow %v remeasure %v, want slow and a remeasure", slow, re)
	}
	if _, slow, re := l.slow("p", stale.Add(time.Millisecond), limit); !slow || re {
		t.Fatalf("while a remeasure is under way: slow %v remeasure %v, want slow and no second remeasure", slow, re)
	}
	if _, slow, re := l.slow("p", stale.Add(linkFresh), limit); !slow || !re {
		t.Fatalf("a remeasure that never noted: slow %v remeasure %v, want another after linkFresh", slow, re)
	}
	// Above the limit the average moves by 30% of the difference: one
	// fast-ish outlier among slow forwards does not clear it...
	l.note("p", 200*time.Millisecond, t0, limit)
	if avg, _, _ := l.slow("p", t0, limit); avg != 270*time.Millisecond {
		t.Fatalf("average %v, want 270ms", avg)
	}
	// ...but a sample within the limit does, at once.
	l.note("p", 2*time.Millisecond, t0, limit)
	if avg, slow, _ := l.slow("p", t0, limit); slow || avg != 2*time.Millisecond {
		t.Fatalf("after a 2 ms forward: %v %v, want not slow", avg, slow)
	}
}

// TestForwarderRemeasuresASlowLink: once the verdict "slow" aged out, the
// forwarder keeps the sends off the link and probes it in the background
// (one probe at a time); the probe's round trip is the new sample. Before,
// the sends themselves were forwarded over the slow link until one came
// back, every linkFresh. Without a prober one send is let through instead.
func TestForwarderRemeasuresASlowLink(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC))
	probes := make(chan chan time.Duration, 4)
	f := newForwarder(forwarderDeps{
		clk: clk,
		probe: func(ctx context.Context, addr string) error {
			took := make(chan time.Duration)
			probes <- took
			clk.Advance(<-took)
			return nil
		},
		slowLink: 100 * time.Millisecond,
	})
	defer f.close()
	f.links.note("b:1", 300*time.Millisecond, clk.Now(), f.slowLink)
	if _, slow := f.linkSlow("b:1"); !slow {
		t.Fatal("a link measured at 300 ms is not slow")
	}
	clk.Advance(linkFresh)
	for i := range 3 {
		if _, slow := f.linkSlow("b:1"); !slow {
			t.Fatalf("call %d after the verdict aged out: not slow, want the sends kept off the link", i)
		}
	}
	var took chan time.Duration
	select {
	case took = <-probes:
	case <-time.After(10 * time.Second):
		t.Fatal("no probe measured the stale verdict")
	}
	select {
	case <-probes:
		t.Fatal("a second probe while the first is under way")
	case <-time.After(50 * time.Millisecond): // a probe that should not start
	}
	took <- 2 * time.Millisecond // the link healed: the probe comes back fast
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, slow := f.linkSlow("b:1"); !slow {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the link is still slow after a fast probe")
		}
		time.Sleep(time.Millisecond) // polling: the probe's goroutine notes it
	}

	// Without a prober, one send (not every one) measures the link.
	g := newForwarder(forwarderDeps{clk: clk, slowLink: 100 * time.Millisecond})
	defer g.close()
	g.links.note("b:1", 300*time.Millisecond, clk.Now(), g.slowLink)
	clk.Advance(linkFresh)
	if _, slow := g.linkSlow("b:1"); slow {
		t.Fatal("no prober: the first send after the verdict aged out is not let through")
	}
	if _, slow := g.linkSlow("b:1"); !slow {
		t.Fatal("no prober: a second send is let through while the first measures")
	}
}

// unknownIf never lets a retryable error ("not stored") answer a send whose
// earlier attempt got no answer.
func TestUnknownIf(t *testing.T) {
	moving := sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrNotOwner, "ring names n2")
	if err := unknownIf(false, moving); err != moving {
		t.Fatalf("without an unknown attempt: %v, want the error itself", err)
	}
	err := unknownIf(true, moving)
	if sequencer.ErrorCode(err) != sequencer.CodeDeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after an unknown attempt: %v (code %v), want deadline_exceeded", err, sequencer.ErrorCode(err))
	}
	// Over the wire (a forward's answer) it stays deadline_exceeded.
	if _, err := decodeReply(encodeReply(sequencer.SendResult{}, err)); sequencer.ErrorCode(err) != sequencer.CodeDeadlineExceeded {
		t.Fatalf("decoded: %v (code %v)", err, sequencer.ErrorCode(err))
	}
	final := sequencer.Wrap(sequencer.CodeInvalidArgument, sequencer.ErrNotFound, "bad")
	if err := unknownIf(true, final); err != final {
		t.Fatalf("a final error after an unknown attempt: %v, want it unchanged", err)
	}
}
