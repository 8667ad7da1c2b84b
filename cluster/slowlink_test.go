package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
)

func TestLinkTimes(t *testing.T) {
	var l linkTimes
	t0 := time.Unix(1000, 0)
	limit := 100 * time.Millisecond
	if _, slow := l.slow("p", t0, limit); slow {
		t.Fatal("a link never measured is slow")
	}
	l.note("p", 300*time.Millisecond, t0, limit)
	if avg, slow := l.slow("p", t0.Add(10*time.Millisecond), limit); !slow || avg != 300*time.Millisecond {
		t.Fatalf("after a 300 ms forward: %v %v, want slow at 300ms", avg, slow)
	}
	if _, slow := l.slow("q", t0, limit); slow {
		t.Fatal("another peer's link is slow")
	}
	if _, slow := l.slow("p", t0, 0); slow {
		t.Fatal("slow with the check off (limit 0)")
	}
	if _, slow := l.slow("p", t0.Add(linkFresh), limit); slow {
		t.Fatal("a verdict linkFresh old still holds: the next send must measure the link")
	}
	// Above the limit the average moves by 30% of the difference: one
	// fast-ish outlier among slow forwards does not clear it...
	l.note("p", 200*time.Millisecond, t0, limit)
	if avg, _ := l.slow("p", t0, limit); avg != 270*time.Millisecond {
		t.Fatalf("average %v, want 270ms", avg)
	}
	// ...but a forward within the limit does, at once.
	l.note("p", 2*time.Millisecond, t0, limit)
	if avg, slow := l.slow("p", t0, limit); slow || avg != 2*time.Millisecond {
		t.Fatalf("after a 2 ms forward: %v %v, want not slow", avg, slow)
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
