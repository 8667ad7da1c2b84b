package actor

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sequencer-im/sequencer/conv"
	"github.com/sequencer-im/sequencer/persist"
)

// targetReads reads the targets of many conversations' edits and recalls
// together. A writer that does not remember its target (conv.Core's
// TargetCache: the conversation's latest messages) must read it before the
// event can be checked; at many conversations that was one store round trip
// per conversation, and a Recall of an older message ran at half a Send's
// rate (docs/BENCHMARKS.md, "Edits and recalls"). Group commit's rule,
// for reads: the reads asked for while maxTargetReads are at the store go
// as one GetMessages when one of them returns, so an idle node reads at
// once and a busy one reads in groups that grow with the load.
type targetReads struct {
	store   persist.MessagesGetter
	timeout time.Duration // of one group's store call (Commit.Timeout)

	mu      sync.Mutex
	queue   []*targetAsk
	running int
}

// maxTargetReads is how many grouped reads may be at the store at once;
// maxTargetIDs is the most msg_ids one of them names (asks are never split:
// one conversation's targets are read together).
const (
	maxTargetReads = 2
	maxTargetIDs   = 1000
)

// targetAsk is one writer's read: its msg_ids and, once done is closed,
// what the store answered.
type targetAsk struct {
	ids  []uint64
	got  []conv.TargetResult
	done chan struct{}
	gone atomic.Bool // the asker stopped waiting: its ids are not read
}

// read returns the stored state of every id, read in a group with the other
// writers' reads of the moment. A message the store does not hold comes
// back without Msg and without Err (conv.Core takes it as not found); a
// failed read gives every id its error. ctx bounds the wait; each group's
// store call is bounded by timeout on its own, so that no asker's deadline
// fails the others' reads.
func (r *targetReads) read(ctx context.Context, ids []uint64) []conv.TargetResult {
	a := &targetAsk{ids: ids, done: make(chan struct{})}
	r.mu.Lock()
	r.queue = append(r.queue, a)
	run := r.running < maxTargetReads
	if run {
		r.running++
	}
	r.mu.Unlock()
	if run {
		go r.run()
	}
	select {
	case <-a.done:
		return a.got
	case <-ctx.Done():
		a.gone.Store(true)
		return failTargets(ids, ctx.Err())
	}
}

// run reads groups, the queue's asks in order, until none is queued.
func (r *targetReads) run() {
	for {
		r.mu.Lock()
		if len(r.queue) == 0 {
			r.queue = nil
			r.running--
			r.mu.Unlock()
			return
		}
		// The asks whose askers gave up while waiting (a store slower than
		// their timeout) are dropped, not read.
		var group []*targetAsk
		n, ids := 0, 0
		for ; n < len(r.queue); n++ {
			a := r.queue[n]
			if a.gone.Load() {
				continue
			}
			if len(group) > 0 && ids+len(a.ids) > maxTargetIDs {
				break
			}
			group = append(group, a)
			ids += len(a.ids)
		}
		r.queue = r.queue[n:]
		r.mu.Unlock()
		if len(group) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		r.readGroup(ctx, group, ids)
		cancel()
	}
}

// readGroup reads the group's msg_ids in one GetMessages and answers each
// ask.
func (r *targetReads) readGroup(ctx context.Context, group []*targetAsk, n int) {
	all := make([]uint64, 0, n)
	for _, a := range group {
		all = append(all, a.ids...)
	}
	msgs, err := r.store.GetMessages(ctx, all)
	byID := make(map[uint64]int, len(msgs))
	for i := range msgs {
		byID[msgs[i].MsgID] = i
	}
	for _, a := range group {
		if err != nil {
			a.got = failTargets(a.ids, err)
		} else {
			a.got = make([]conv.TargetResult, len(a.ids))
			for i, id := range a.ids {
				a.got[i].MsgID = id
				if j, ok := byID[id]; ok {
					a.got[i].Msg = msgs[j]
				}
			}
		}
		close(a.done)
	}
}

func failTargets(ids []uint64, err error) []conv.TargetResult {
	out := make([]conv.TargetResult, len(ids))
	for i, id := range ids {
		out[i] = conv.TargetResult{MsgID: id, Err: err}
	}
	return out
}
