package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// batcher coalesces the Sends to one node into SendBatch requests: at most
// MaxInFlight requests in flight; whatever queued meanwhile goes out in the
// next one (up to MaxItems / MaxBytes), so the batch size follows the load
// and an idle client adds no delay. Ordered items (SendMany's) of one
// conversation are never in two requests in flight at once: such an item
// whose conversation has an ordered item in a request still in flight waits
// in the queue for that request's answer, so they are stored in item order.
// Sends from concurrent goroutines have no order between them and may go in
// concurrent requests, so a hot conversation keeps the node busy.
type batcher struct {
	n      *node
	policy BatchPolicy
	budget time.Duration     // each request's deadline (the attempt timeout)
	saw    func(http.Header) // told every answer's headers (the membership version)

	// unsupported: the node answered SendBatch unimplemented (an older
	// server); its Sends go one by one from then on.
	unsupported atomic.Bool

	mu       sync.Mutex
	space    *sync.Cond // broadcast when the queue shrinks or a waiter's ctx ends
	queue    []*queued
	bytes    int
	inflight int            // requests in flight (flush goroutines running)
	busy     map[string]int // ordered items in flight, by conversation
}

// queued is one Send waiting for its place in a request and its answer.
type queued struct {
	msg     *sequencerv1.SendRequest
	size    int
	ordered bool            // a SendMany item: ordered with its conversation's other items
	done    chan itemAnswer // buffered 1
}

type itemAnswer struct {
	resp *sequencerv1.SendResponse
	err  error
}

// itemError is one batch item's error as the node answered it: the retry
// rules treat it like the same code answered to a unary Send, and the
// *connect.Error it wraps keeps the code and message for errors.As.
type itemError struct {
	code sequencer.Code
	ce   *connect.Error
}

func newItemError(code, msg string) *itemError {
	c := sequencer.ParseCode(code)
	var cc connect.Code
	if err := cc.UnmarshalText([]byte(code)); err != nil {
		cc = connect.CodeInternal
	}
	return &itemError{code: c, ce: connect.NewError(cc, errors.New(msg))}
}

func (e *itemError) Error() string { return e.ce.Error() }
func (e *itemError) Unwrap() error { return e.ce }

func newBatcher(n *node, p BatchPolicy, budget time.Duration, saw func(http.Header)) *batcher {
	b := &batcher{n: n, policy: p, budget: budget, saw: saw, busy: map[string]int{}}
	b.space = sync.NewCond(&b.mu)
	return b
}

// itemSize is what an item counts against the byte bounds.
func itemSize(m *sequencerv1.SendRequest) int {
	return len(m.GetBody()) + len(m.GetConvId()) + len(m.GetClientMsgId()) + 32
}

// send queues msg for the node and waits for its answer (or ctx). A full
// queue blocks until there is room or ctx ends. queuedHook is called once
// msg is queued (or failed to be). ordered: msg is never in a request
// together in flight with another request holding an ordered item of its
// conversation.
func (b *batcher) send(ctx context.Context, msg *sequencerv1.SendRequest, ordered bool, queuedHook func()) (*sequencerv1.SendResponse, error) {
	q := &queued{msg: msg, size: itemSize(msg), ordered: ordered, done: make(chan itemAnswer, 1)}
	err := b.enqueue(ctx, q)
	queuedHook()
	if err != nil {
		return nil, err
	}
	select {
	case a := <-q.done:
		return a.resp, a.err
	case <-ctx.Done():
		// The request may still store it: the outcome is unknown, and the
		// retry (same client_msg_id) tells.
		return nil, ctx.Err()
	}
}

func (b *batcher) enqueue(ctx context.Context, q *queued) error {
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		b.space.Broadcast()
		b.mu.Unlock()
	})
	defer stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.queue) > 0 && (len(b.queue) >= b.policy.MaxQueuedItems || b.bytes+q.size > b.policy.MaxQueuedBytes) {
		if err := ctx.Err(); err != nil {
			return err
		}
		b.space.Wait()
	}
	b.queue = append(b.queue, q)
	b.bytes += q.size
	if b.inflight < b.policy.MaxInFlight && !b.waits(q) {
		b.inflight++
		go b.flush()
	}
	return nil
}

// flush sends requests until nothing in the queue can go: the queue is
// empty, or each item waits for an ordered item of its conversation in a
// request still in flight (the flush goroutine of that request takes them
// after its answer).
func (b *batcher) flush() {
	if b.policy.Linger > 0 {
		time.Sleep(b.policy.Linger)
	}
	var batch []*queued
	for {
		batch = b.take(batch)
		if batch == nil {
			return
		}
		b.sendBatch(batch)
	}
}

// waits reports whether q must wait for another request in flight.
func (b *batcher) waits(q *queued) bool {
	return q.ordered && b.busy[q.msg.GetConvId()] > 0
}

// take releases the conversations of done, the request just answered (nil
// at first), and removes the next request's items from the queue: in queue
// order, up to MaxItems / MaxBytes, skipping the ordered items whose
// conversation has ordered items in another request in flight. Nil:
// nothing can go, and this flush goroutine is no longer in flight.
func (b *batcher) take(done []*queued) []*queued {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, q := range done {
		if !q.ordered {
			continue
		}
		conv := q.msg.GetConvId()
		if b.busy[conv]--; b.busy[conv] == 0 {
			delete(b.busy, conv)
		}
	}
	batch := make([]*queued, 0, min(len(b.queue), b.policy.MaxItems))
	size, kept := 0, 0
	for i, q := range b.queue {
		if len(batch) == b.policy.MaxItems || (len(batch) > 0 && size+q.size > b.policy.MaxBytes) {
			kept += copy(b.queue[kept:], b.queue[i:]) // full: the rest stays, in order
			break
		}
		if b.waits(q) {
			b.queue[kept] = q
			kept++
			continue
		}
		batch = append(batch, q)
		size += q.size
	}
	// The busy marks go on after the scan: ordered items of one
	// conversation that both fit go in this request, in queue order.
	for _, q := range batch {
		if q.ordered {
			b.busy[q.msg.GetConvId()]++
		}
	}
	clear(b.queue[kept:])
	b.queue = b.queue[:kept]
	if len(batch) == 0 {
		b.inflight--
		return nil
	}
	b.bytes -= size
	b.space.Broadcast()
	return batch
}

func (b *batcher) sendBatch(batch []*queued) {
	req := &sequencerv1.SendBatchRequest{Items: make([]*sequencerv1.SendRequest, len(batch))}
	for i, q := range batch {
		req.Items[i] = q.msg
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.budget)
	defer cancel()
	resp, err := b.n.rpc.SendBatch(ctx, connect.NewRequest(req))
	var ce *connect.Error
	if err != nil && errors.As(err, &ce) && connect.IsWireError(err) && ce.Code() == connect.CodeUnimplemented {
		b.unsupported.Store(true)
		b.sendEach(ctx, batch)
		return
	}
	if err == nil && len(resp.Msg.GetResults()) != len(batch) {
		err = sequencer.Errorf(sequencer.CodeInternal, "SendBatch answered %d results for %d items", len(resp.Msg.GetResults()), len(batch))
	}
	if err == nil {
		b.saw(resp.Header())
	}
	if err != nil && ctx.Err() != nil {
		// The request's own budget ran out: for its items that is an
		// attempt that timed out, not their callers' deadline (which the
		// retry loop tells apart by the caller's ctx).
		err = fmt.Errorf("%w: SendBatch of %d items got no answer within %v: %w", errAttemptTimedOut, len(batch), b.budget, err)
	}
	for i, q := range batch {
		if err != nil {
			q.done <- itemAnswer{err: err}
			continue
		}
		switch r := resp.Msg.GetResults()[i].GetOutcome().(type) {
		case *sequencerv1.SendResult_Ok:
			q.done <- itemAnswer{resp: r.Ok}
		case *sequencerv1.SendResult_Error:
			q.done <- itemAnswer{err: newItemError(r.Error.GetCode(), r.Error.GetMessage())}
		default:
			q.done <- itemAnswer{err: sequencer.Errorf(sequencer.CodeInternal, "SendBatch result %d has no outcome", i)}
		}
	}
}

// sendEach sends the items one by one (a node without SendBatch).
func (b *batcher) sendEach(ctx context.Context, batch []*queued) {
	var wg sync.WaitGroup
	for _, q := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := b.n.rpc.Send(ctx, connect.NewRequest(q.msg))
			if err != nil {
				if ctx.Err() != nil {
					err = fmt.Errorf("%w: Send got no answer within %v: %w", errAttemptTimedOut, b.budget, err)
				}
				q.done <- itemAnswer{err: err}
				return
			}
			q.done <- itemAnswer{resp: resp.Msg}
		}()
	}
	wg.Wait()
}

// errAttemptTimedOut marks the failure of a request that ran out of its own
// time (the batcher's budget, the attempt timeout): an attempt that timed
// out, retried while the call's budget lasts.
var errAttemptTimedOut = errors.New("attempt timed out")

// asItemError reports whether err is a batch item's error.
func asItemError(err error) (*itemError, bool) {
	var ie *itemError
	ok := errors.As(err, &ie)
	return ie, ok
}
