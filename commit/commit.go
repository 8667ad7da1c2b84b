// Package commit is the node's group-commit writer: it merges the in-flight
// batches of many conversations into one Store.Commit (one transaction),
// over a few parallel workers, and hands each conversation the store's answer
// for its own batch.
//
// A failed shared transaction blames only the conversations the error names:
// a *ConflictError, *HeadMismatchError or *StaleFenceError fails the named
// conversations (or fences) and the others are committed again at once
// without them. A refusal of the data that names no conversation
// (persist.ErrRejected: one bad row) splits the group in halves, down to
// single conversations, so only the conversations with bad rows fail. Any
// other error reaches every member (a store outage concerns them all).
//
// The writer never assigns seqs or ids, never retries a batch whose outcome
// is unknown (its conversation must re-read the truth first), and never holds
// more than MaxMessages rows in one transaction (a single larger batch goes
// alone).
package commit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/conv"
	"github.com/sequencer-im/sequencer/internal/conf"
	"github.com/sequencer-im/sequencer/internal/ratelog"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
)

// Config configures a Writer. DefaultConfig holds every default; a zero
// field in the Config given to New means its default.
type Config struct {
	Store persist.Committer // required
	// Workers is the most transactions in flight at once (two start as
	// soon as anything is queued, a further one only when extraMinRows
	// messages wait).
	Workers int
	// MaxMessages bounds the rows of one transaction.
	MaxMessages int
	// Timeout bounds one Store.Commit; a commit that times out is reported
	// as sequencer.ErrUnknownOutcome.
	Timeout time.Duration
	Metrics *metrics.Set // optional
	Logger  *slog.Logger // optional
	// KeepReadPositions: commits leave the senders' read positions alone
	// (serve --send-marks-read=false). By default every batch is committed
	// with MarkSendersRead: a user's own messages are read.
	KeepReadPositions bool
}

// DefaultConfig returns every default (Store is still required).
func DefaultConfig() Config {
	return Config{
		Workers:     4,
		MaxMessages: conv.DefaultConfig().MaxBatch, // a conversation's full batch fits one transaction
		Timeout:     5 * time.Second,
	}
}

// Validate reports every field that makes no sense, as given (zero counts
// and durations too: New fills them from DefaultConfig first).
func (c Config) Validate() error {
	ch := conf.Checker{Pkg: "commit"}
	conf.Positive(&ch, "Workers", c.Workers)
	conf.Positive(&ch, "MaxMessages", c.MaxMessages)
	conf.PositiveDuration(&ch, "Timeout", c.Timeout)
	return ch.Err()
}

// Grouper is an optional ability of a Store whose transactions are cheap
// only within a group of conversations (a distributed store: the shards of
// one node, written on that node). When Config.Store implements it, the
// Writer never puts conversations of different groups in one transaction:
// each transaction takes the oldest queued batch and the later queued
// batches of its group (queue order kept within the group). CommitGroup
// must be pure and fast (it is called under the writer's lock).
type Grouper interface {
	CommitGroup(convID string) uint64
}

// Done receives the store's answer for one submitted batch: nil (durably
// stored) or an error concerning that batch (see persist.Store.Commit). It
// is called exactly once, from a writer goroutine, and must not block.
type Done func(err error)

type item struct {
	batch persist.ConvBatch
	done  Done
}

// Writer is the group-commit writer. Safe for concurrent use.
type Writer struct {
	cfg     Config
	grouper Grouper // cfg.Store's, or nil
	log     *slog.Logger
	logs    *ratelog.Logger

	mu     sync.Mutex
	cond   *sync.Cond
	queue  []*item
	rows   int // messages in queue
	busy   int // workers in a transaction
	closed bool
	wg     sync.WaitGroup
}

// eagerWorkers transactions start as soon as anything is queued; a further
// worker starts one only when at least extraMinRows messages wait. Without
// the rule, four idle workers split a burst (a SendBatch request's items
// arriving together) into four small transactions, and PostgreSQL's cost per
// message grows with the number of transactions: through SendBatch on
// 10,000 conversations, 4 eager workers made transactions of 54 messages
// where 2 made 93-97, and 2 stored 28-30k msg/s against 22-25k.
const (
	eagerWorkers = 2
	extraMinRows = 128
)

// New starts a writer with cfg.Workers workers. Zero fields take their
// DefaultConfig value; a negative one is an error.
func New(cfg Config) (*Writer, error) {
	if cfg.Store == nil {
		return nil, errors.New("commit: Store is required")
	}
	conf.FillZero(&cfg, DefaultConfig())
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := &Writer{cfg: cfg, log: cfg.Logger}
	w.grouper, _ = cfg.Store.(Grouper)
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	w.logs = ratelog.New(w.log, 10*time.Second)
	w.cond = sync.NewCond(&w.mu)
	w.wg.Add(cfg.Workers)
	for range cfg.Workers {
		go w.work()
	}
	return w, nil
}

// Submit queues b for the next transaction; done gets the answer. After
// Close, done is called at once with an error wrapping
// sequencer.ErrShuttingDown and sequencer.ErrStoreUnavailable (nothing
// written).
func (w *Writer) Submit(b persist.ConvBatch, done Done) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		done(fmt.Errorf("commit %s: %w (%w)", b.ConvID, sequencer.ErrShuttingDown, sequencer.ErrStoreUnavailable))
		return
	}
	w.queue = append(w.queue, &item{batch: b, done: done})
	w.rows += len(b.Messages)
	wake := w.busy < eagerWorkers || w.rows >= extraMinRows
	w.mu.Unlock()
	if wake {
		w.cond.Signal()
	}
}

// QueueLen is the number of conversation batches queued and not yet taken
// into a transaction (for metrics).
func (w *Writer) QueueLen() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue)
}

// Close stops accepting batches, lets the workers commit everything already
// queued, and waits for them (or for ctx).
func (w *Writer) Close(ctx context.Context) error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.cond.Broadcast()
	stopped := make(chan struct{})
	go func() { w.wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("commit: close: %w", ctx.Err())
	}
}

func (w *Writer) work() {
	defer w.wg.Done()
	for {
		group := w.take()
		if group == nil {
			return
		}
		w.commit(group)
		w.mu.Lock()
		w.busy--
		w.mu.Unlock()
	}
}

// take waits for queued batches (and, when eagerWorkers others are in a
// transaction, for extraMinRows messages) and removes the longest prefix of
// the queue that fits in MaxMessages rows (at least one batch). nil: closed
// and empty.
func (w *Writer) take() []*item {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.queue) == 0 || (w.busy >= eagerWorkers && w.rows < extraMinRows && !w.closed) {
		if len(w.queue) == 0 && w.closed {
			return nil
		}
		w.cond.Wait()
	}
	var group []*item
	var rows int
	if w.grouper != nil {
		group, rows = w.takeGroup()
	} else {
		n := 0
		for n < len(w.queue) {
			k := len(w.queue[n].batch.Messages)
			if n > 0 && rows+k > w.cfg.MaxMessages {
				break
			}
			rows += k
			n++
		}
		group = make([]*item, n)
		copy(group, w.queue)
		kept := copy(w.queue, w.queue[n:])
		clear(w.queue[kept:])
		w.queue = w.queue[:kept]
	}
	rest := len(w.queue)
	w.rows -= rows
	w.busy++
	if rest > 0 && (w.busy < eagerWorkers || w.rows >= extraMinRows) {
		w.cond.Signal() // more work for another worker
	}
	return group
}

// takeGroup removes from the queue the oldest batch and, in queue order, the
// later batches of its commit group that fit in MaxMessages rows (see
// Grouper); the other batches keep their order. Called with w.mu held.
func (w *Writer) takeGroup() ([]*item, int) {
	key := w.grouper.CommitGroup(w.queue[0].batch.ConvID)
	var group []*item
	rows := 0
	kept := w.queue[:0]
	for i, it := range w.queue {
		k := len(it.batch.Messages)
		if i == 0 || (rows+k <= w.cfg.MaxMessages && w.grouper.CommitGroup(it.batch.ConvID) == key) {
			group = append(group, it)
			rows += k
			continue
		}
		kept = append(kept, it)
	}
	clear(w.queue[len(kept):])
	w.queue = kept
	return group, rows
}

// commit writes group in one transaction; on an error that names some of
// its conversations, those get the error and the rest are committed again.
func (w *Writer) commit(group []*item) {
	for len(group) > 0 {
		batches := make([]persist.ConvBatch, len(group))
		rows := 0
		for i, it := range group {
			batches[i] = it.batch
			batches[i].MarkSendersRead = !w.cfg.KeepReadPositions
			rows += len(it.batch.Messages)
		}
		ctx, cancel := context.WithTimeout(context.Background(), w.cfg.Timeout)
		start := time.Now() // a metric's own timing (commit latency), not the clock
		err := w.cfg.Store.Commit(ctx, batches)
		timedOut := ctx.Err() != nil
		cancel()
		if err != nil && timedOut && !nothingWritten(err) {
			err = fmt.Errorf("commit timed out after %v: %w: %w", w.cfg.Timeout, sequencer.ErrUnknownOutcome, err)
		}
		w.observe(rows, len(group), time.Since(start), err) // metric timing
		if err == nil {
			for _, it := range group {
				it.done(nil)
			}
			return
		}
		blamed := blame(err, group)
		if len(blamed) == 0 && errors.Is(err, persist.ErrRejected) && len(group) > 1 {
			// A bad row somewhere: find it by halves; the others commit.
			w.logs.Warn("rejected", "the store refused a row of a group commit; splitting the group to fail only its conversation",
				"conversations", len(group), "messages", rows, "err", err)
			half := len(group) / 2
			w.commit(group[:half:half])
			w.commit(group[half:])
			return
		}
		if len(blamed) == 0 || len(blamed) == len(group) {
			switch {
			case errors.Is(err, persist.ErrRejected):
				w.logs.Warn("rejected", "the store refused a conversation's rows", "conv_id", group[0].batch.ConvID, "err", err)
			case !nothingWritten(err):
				w.logs.Warn("unknown", "group commit outcome unknown; its conversations re-read the store", "conversations", len(group), "messages", rows, "err", err)
			case errors.Is(err, sequencer.ErrStoreUnavailable):
				w.logs.Warn("unavailable", "group commit failed: store unavailable", "conversations", len(group), "messages", rows, "err", err)
			}
			for _, it := range group {
				it.done(err)
			}
			return
		}
		rest := group[:0:0]
		for _, it := range group {
			if blamed[it] {
				it.done(err)
			} else {
				rest = append(rest, it)
			}
		}
		group = rest
	}
}

// blame returns the members an error names (nil: the error concerns all).
func blame(err error, group []*item) map[*item]bool {
	var convs map[string]bool
	var (
		ce *persist.ConflictError
		he *persist.HeadMismatchError
		se *persist.StaleFenceError
	)
	switch {
	case errors.As(err, &ce):
		convs = make(map[string]bool, len(ce.Conflicts))
		for _, c := range ce.Conflicts {
			convs[c.ConvID] = true
		}
	case errors.As(err, &he):
		convs = make(map[string]bool, len(he.ConvIDs))
		for _, c := range he.ConvIDs {
			convs[c] = true
		}
	case errors.As(err, &se):
		blamed := map[*item]bool{}
		for _, it := range group {
			for _, f := range se.Fences {
				if it.batch.Fence == f {
					blamed[it] = true
				}
			}
		}
		return blamed
	default:
		return nil
	}
	blamed := map[*item]bool{}
	for _, it := range group {
		if convs[it.batch.ConvID] {
			blamed[it] = true
		}
	}
	return blamed
}

// nothingWritten reports errors after which the store guarantees nothing of
// the commit was written.
func nothingWritten(err error) bool { return persist.OutcomeOf(err) == persist.NotLanded }

// Result labels of metrics.CommitSeconds.
func result(err error) string {
	if err == nil {
		return "ok"
	}
	_, conflict := persist.AsConflict(err)
	switch {
	case errors.Is(err, sequencer.ErrUnknownOutcome):
		return "unknown"
	case conflict:
		return "conflict"
	case errors.Is(err, sequencer.ErrHeadMismatch):
		return "head_mismatch"
	case errors.Is(err, sequencer.ErrStaleEpoch):
		return "stale_fence"
	case errors.Is(err, sequencer.ErrStoreUnavailable):
		return "unavailable"
	default:
		return "error"
	}
}

func (w *Writer) observe(rows, convs int, d time.Duration, err error) {
	m := w.cfg.Metrics
	if m == nil {
		return
	}
	m.BatchMessages.Observe(float64(rows))
	m.BatchConvs.Observe(float64(convs))
	m.CommitSeconds.WithLabelValues(result(err)).Observe(d.Seconds())
}
