package persist

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sequencer-im/sequencer"
)

// Mark is one MarkRead call waiting in a MarkBatcher.
type Mark struct {
	ConvID string
	UID    uint64
	Seq    uint64
}

// MarkBatcher is the group commit of read positions: concurrent MarkRead
// calls are written together, by one statement in one transaction (one
// durable flush for all of them), the way the commit writer batches Sends.
// A call arriving while Flushes batches are being written waits for the
// next batch, which takes everything queued meanwhile (up to MaxBatch). A
// lone call is written at once: no timer, the batch size follows the load.
//
// Write must store every mark as MarkRead says (min(seq, head), never
// backwards; several marks of one (conv, uid) in a batch end at the
// highest) and answer states[i] for marks[i]; its error fails the whole
// batch (a MarkRead that failed may have landed: marking again is harmless).
type MarkBatcher struct {
	Write    func(ctx context.Context, marks []Mark) ([]ReadState, error)
	Flushes  int           // batches written at once; default 2
	MaxBatch int           // most marks per batch; default 1000
	Timeout  time.Duration // bounds one Write (it does not follow a caller's context); default 10s

	mu      sync.Mutex
	queue   []*pendingMark
	running int
}

type pendingMark struct {
	m    Mark
	st   ReadState
	err  error
	done chan struct{}
}

// MarkRead queues the mark and returns its answer once its batch is
// written, or an error wrapping ctx's when ctx ends first (the mark may
// still land).
func (b *MarkBatcher) MarkRead(ctx context.Context, m Mark) (ReadState, error) {
	p := &pendingMark{m: m, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, p)
	flushes := b.Flushes
	if flushes <= 0 {
		flushes = 2
	}
	start := b.running < flushes
	var batch []*pendingMark
	if start {
		batch = b.take()
		b.running++
	}
	b.mu.Unlock()
	if batch != nil {
		go b.flush(ctx, batch)
	}
	select {
	case <-p.done:
		return p.st, p.err
	case <-ctx.Done():
		return ReadState{}, fmt.Errorf("mark read: the caller gave up (the mark may land): %w", ctx.Err())
	}
}

// take removes the next batch from the queue (b.mu held).
func (b *MarkBatcher) take() []*pendingMark {
	n := b.MaxBatch
	if n <= 0 {
		n = 1000
	}
	n = min(n, len(b.queue))
	batch := b.queue[:n:n]
	b.queue = append([]*pendingMark(nil), b.queue[n:]...)
	return batch
}

// flush writes batch, then keeps writing what queued meanwhile.
func (b *MarkBatcher) flush(ctx context.Context, batch []*pendingMark) {
	timeout := b.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	for batch != nil {
		marks := make([]Mark, len(batch))
		for i, p := range batch {
			marks[i] = p.m
		}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		states, err := b.Write(wctx, marks)
		cancel()
		if err == nil && len(states) != len(batch) {
			err = sequencer.Errorf(sequencer.CodeInternal, "mark read: the store answered %d states for %d marks", len(states), len(batch))
		}
		for i, p := range batch {
			if err != nil {
				p.err = err
			} else {
				p.st = states[i]
			}
			close(p.done)
		}
		b.mu.Lock()
		batch = nil
		if len(b.queue) > 0 {
			batch = b.take()
		} else {
			b.running--
		}
		b.mu.Unlock()
	}
}
