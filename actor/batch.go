package actor

import (
	"context"
	"fmt"
	"sync"

	"github.com/sequencer-im/sequencer"
)

// batchWait collects the answers of one SendBatch. Actors write answers
// under mu; once the caller gave up (abandoned) late answers are dropped, so
// the caller's slice is never written after SendBatch returned.
type batchWait struct {
	mu        sync.Mutex
	out       []sequencer.SendOutcome
	answered  []bool
	left      int
	abandoned bool
	done      chan struct{}
}

// batchItem is the core's token for one item of a batch: out[idx] of b;
// size is what it counts against MaxPendingBytes.
type batchItem struct {
	b    *batchWait
	idx  int
	size int64
}

func (w *batchWait) answer(idx int, o sequencer.SendOutcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.abandoned {
		return
	}
	w.out[idx] = o
	w.answered[idx] = true
	w.left--
	if w.left == 0 {
		close(w.done)
	}
}

// sendGroup carries the items of one batch for one conversation, in item
// order: one mailbox message per conversation, not per item.
type sendGroup struct {
	reqs  []sequencer.SendRequest
	items []*batchItem
	to    *convActor // the actor it was sent to (nil: not routed)
}

// SendBatch stores every request independently, with the semantics of Send
// for each, and writes the answer of reqs[i] to out[i]. The items of one
// conversation enter its actor as one message, in slice order, so they get
// increasing seqs (when both succeed). When ctx ends first, the items not yet
// answered get canceled / deadline_exceeded (their outcome is unknown).
func (n *Conversations) SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome) {
	if len(out) != len(reqs) {
		panic("actor: SendBatch: len(out) != len(reqs)")
	}
	w := &batchWait{out: out, answered: make([]bool, len(reqs)), done: make(chan struct{})}
	items := make([]batchItem, len(reqs))
	groups := make(map[string]*sendGroup)
	var order []*sendGroup
	admitted := 0
	for i := range reqs {
		items[i] = batchItem{b: w, idx: i, size: pendingSize(&reqs[i])}
		if err := n.admit(items[i].size); err != nil {
			out[i] = sequencer.SendOutcome{Err: err}
			w.answered[i] = true
			continue
		}
		admitted++
		g := groups[reqs[i].ConvID]
		if g == nil {
			g = &sendGroup{}
			groups[reqs[i].ConvID] = g
			order = append(order, g)
		}
		g.reqs = append(g.reqs, reqs[i])
		g.items = append(g.items, &items[i])
	}
	if admitted == 0 {
		return
	}
	w.left = admitted
	for _, g := range order {
		ref, err := n.route(g.reqs[0].ConvID)
		if err != nil {
			for _, it := range g.items {
				n.release(it.size)
				w.answer(it.idx, sequencer.SendOutcome{Err: err})
			}
			continue
		}
		g.to = ref
		n.system.Root.Send(ref.pid, g)
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		gaveUp := callerGaveUp(ctx)
		w.mu.Lock()
		if w.left > 0 {
			w.abandoned = true
			for i := range out {
				if !w.answered[i] {
					out[i].Err = gaveUp
				}
			}
			// Tell each actor which of its sends were given up on (the
			// cores drop those without a seq yet).
			for _, g := range order {
				var sends []canceledSend
				for j, it := range g.items {
					if !w.answered[it.idx] {
						sends = append(sends, canceledSend{it, g.reqs[j].Key()})
					}
				}
				if g.to != nil && len(sends) > 0 {
					n.system.Root.Send(g.to.pid, &cancelMsg{cause: ctx.Err(), sends: sends})
				}
			}
		}
		w.mu.Unlock()
	}
}

// admit checks that a send of size bytes (pendingSize) may enter:
// the node is open and has room for one more send and its bytes (both
// counted on success; release undoes it). Ownership is not asked here: the
// cluster routed the send here because it holds the partition, and the
// commit takes its fence (Ownership.Fence) when its batch is formed.
func (n *Conversations) admit(size int64) error {
	if n.closed.Load() {
		return sequencer.ErrShuttingDown
	}
	if n.pending.Add(1) > int64(n.cfg.MaxPending) {
		n.pending.Add(-1)
		return fmt.Errorf("node holds %d sends: %w", n.cfg.MaxPending, sequencer.ErrOverloaded)
	}
	if b := n.pendingBytes.Add(size); b > n.cfg.MaxPendingBytes && b != size {
		// (A single send larger than the bound still gets in alone.)
		n.release(size)
		return fmt.Errorf("node holds %d bytes of sends: %w", b-size, sequencer.ErrOverloaded)
	}
	return nil
}

// release uncounts one admitted send of size bytes.
func (n *Conversations) release(size int64) {
	n.pending.Add(-1)
	n.pendingBytes.Add(-size)
}

// pendingSize is what a send counts against MaxPendingBytes: its body and
// keys, plus a fixed overhead for the rest of the message.
func pendingSize(r *sequencer.SendRequest) int64 {
	return int64(len(r.Body) + len(r.ConvID) + len(r.ClientMsgID) + 64)
}

// callerGaveUp is the answer to a send whose caller's ctx ended before its
// outcome was known.
func callerGaveUp(ctx context.Context) error {
	code := sequencer.CodeCanceled
	if ctx.Err() == context.DeadlineExceeded {
		code = sequencer.CodeDeadlineExceeded
	}
	return sequencer.Wrap(code, ctx.Err(),
		"send: caller gave up before the outcome; resend with the same client_msg_id to learn it")
}
