package actor

import (
	"sync/atomic"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"

	"github.com/sequencer-im/sequencer/clock"
)

// poolDispatcher runs the actors' mailboxes on a few goroutines it keeps,
// where protoactor's default dispatcher starts a new goroutine for every
// mailbox run. A new goroutine starts with a small stack, and a
// conversation's Receive (the core's Send, a batch's forming) is deep
// enough to grow it two or three times: at many, 11-14% of the server's
// CPU was copying stacks (runtime.copystack under conv.(*Core).Send and
// Formed) and 4-9% starting goroutines. A kept goroutine keeps its grown
// stack.
//
// Schedule never blocks. It queues the run; a waiting worker takes it at
// once, and when none was waiting a new worker starts, up to maxWorkers.
// The workers take runs in the order they were scheduled. A mailbox run
// rarely waits (Receive hands its waits to goroutines of their own: head
// loads, re-reads, target reads), so a few workers are all the node's
// cores can use. Where one does wait (the msg_id generator renewing a used
// up reservation in the store, up to its store timeout), runs must not
// queue behind it: while runs are queued, a check every stallAfter (on the
// real clock: goroutines' time, not the node's) starts a rescuer, which
// runs the queue until it is empty, whenever no run ended since the last
// check. Should the queue ever be full, the run gets a goroutine of its
// own, as with the default dispatcher.
type poolDispatcher struct {
	queue      chan func()
	stop       chan struct{}
	workers    atomic.Int32
	maxWorkers int32
	throughput int

	clk        clock.Clock
	stallAfter time.Duration
	ended      atomic.Uint64 // runs that ended
	watching   atomic.Bool   // a check is armed
	rescuers   atomic.Uint64 // rescuers started (tests)
}

var _ pa.Dispatcher = (*poolDispatcher)(nil)

func newPoolDispatcher(maxWorkers, queue, throughput int, stallAfter time.Duration) *poolDispatcher {
	return &poolDispatcher{queue: make(chan func(), queue), stop: make(chan struct{}),
		maxWorkers: int32(maxWorkers), throughput: throughput, clk: clock.Real{}, stallAfter: stallAfter}
}

func (d *poolDispatcher) Schedule(fn func()) {
	select {
	case d.queue <- fn:
		// A send to a waiting receiver leaves the buffer empty: something
		// left in it means no worker was waiting.
		if len(d.queue) > 0 {
			d.grow()
			d.watch()
		}
	default:
		go fn()
	}
}

// Throughput is how many messages a mailbox run takes before it yields.
func (d *poolDispatcher) Throughput() int { return d.throughput }

// grow starts a worker unless maxWorkers run.
func (d *poolDispatcher) grow() {
	for {
		n := d.workers.Load()
		if n >= d.maxWorkers {
			return
		}
		if d.workers.CompareAndSwap(n, n+1) {
			go d.work()
			return
		}
	}
}

func (d *poolDispatcher) work() {
	for {
		select {
		case fn := <-d.queue:
			d.run(fn)
		case <-d.stop:
			// Closed: run what is queued, then end. A run queued after
			// the last worker ended starts a new one (Schedule's grow).
			d.drain()
			d.workers.Add(-1)
			return
		}
	}
}

func (d *poolDispatcher) run(fn func()) {
	fn()
	d.ended.Add(1)
}

// drain runs the queue until it is empty.
func (d *poolDispatcher) drain() {
	for {
		select {
		case fn := <-d.queue:
			d.run(fn)
		default:
			return
		}
	}
}

// watch arms the stall check unless one is armed.
func (d *poolDispatcher) watch() {
	if d.watching.CompareAndSwap(false, true) {
		ended := d.ended.Load()
		d.clk.AfterFunc(d.stallAfter, func() { d.check(ended) })
	}
}

// check starts a rescuer when runs are queued and none ended since the
// last check (every worker is in a run that waits), and checks again while
// runs are queued.
func (d *poolDispatcher) check(ended uint64) {
	if len(d.queue) == 0 {
		d.watching.Store(false)
		if len(d.queue) > 0 { // queued meanwhile, unwatched
			d.watch()
		}
		return
	}
	now := d.ended.Load()
	if now == ended {
		d.rescuers.Add(1)
		go d.drain()
	}
	d.clk.AfterFunc(d.stallAfter, func() { d.check(now) })
}

// close ends the workers once the queue is empty.
func (d *poolDispatcher) close() { close(d.stop) }
