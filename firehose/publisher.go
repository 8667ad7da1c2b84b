package firehose

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// Sink is a broker: NATS JetStream (firehose/natssink), a Kafka producer
// later. It must be safe for concurrent use.
type Sink interface {
	// Publish sends msg to the subject (topic) of partition part. done is
	// called exactly once, from any goroutine: nil when the broker stored
	// msg or dropped it as a duplicate of one it stored (de-duplication by
	// msg_id), else the error. Publish itself must not block for long.
	Publish(part uint32, msg sequencer.Message, done func(error))
}

// Store is what the publisher needs from the store: the outbox, and the
// messages of a backlog the live path did not bring.
type Store interface {
	persist.Outbox
	ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error)
}

// Config configures a Publisher. Store, Sink and Core.Partitions are
// required.
type Config struct {
	Store Store
	Sink  Sink
	Core  CoreConfig
	// Owned returns the partitions this node holds now, with their
	// holdings' epochs (cluster.Node's HeldLeases); nil: every partition,
	// for good (a node without a cluster).
	Owned  func() []Holding
	Logger *slog.Logger
	// ObserveLag, when set, is told each acknowledged message's time from
	// its server_at to the ack, in seconds (sequencer_feed_publish_lag_seconds).
	ObserveLag func(seconds float64)

	FlushEvery  time.Duration // how often acknowledged cursors are stored (default 100 ms)
	SweepAfter  time.Duration // how long an outbox row published in full is kept for the next commit (default 10 s)
	SweepEvery  time.Duration // how often such rows are swept (default 1 s)
	OwnEvery    time.Duration // how often Owned is asked (default 250 ms)
	RescanEvery time.Duration // how often owned partitions' outboxes are scanned again, a safety net (default 30 s)
	ScanPage    int           // outbox rows per page (default 1000)
	ScanWorkers int           // partitions scanned at once (default 4)
	OpTimeout   time.Duration // bound of one store call (default 5 s)
}

func (c Config) withDefaults() Config {
	if c.FlushEvery <= 0 {
		c.FlushEvery = 100 * time.Millisecond
	}
	if c.SweepAfter <= 0 {
		c.SweepAfter = 10 * time.Second
	}
	if c.SweepEvery <= 0 {
		c.SweepEvery = time.Second
	}
	if c.OwnEvery <= 0 {
		c.OwnEvery = 250 * time.Millisecond
	}
	if c.RescanEvery <= 0 {
		c.RescanEvery = 30 * time.Second
	}
	if c.ScanPage <= 0 {
		c.ScanPage = 1000
	}
	if c.ScanWorkers <= 0 {
		c.ScanWorkers = 4
	}
	if c.OpTimeout <= 0 {
		c.OpTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Stats are the publisher's counters and backlog (metrics, console, admin).
type Stats struct {
	Lag
	Published     uint64 // acknowledged publishes
	PublishErrors uint64
	StoreErrors   uint64
	Publishing    bool // false after a failed publish, until one succeeds
	PerPartition  map[uint32]uint64
}

// Publisher runs a Core: it takes live batches (Publish, an
// actor.Publisher), scans the outbox of the partitions it owns, publishes
// to the Sink and stores the cursors. Start it with Run.
type Publisher struct {
	cfg  Config
	log  *slog.Logger
	wake chan struct{}

	mu         sync.Mutex
	core       *Core
	published  uint64
	pubErrors  uint64
	storeErrs  uint64
	publishing bool
	pauseUntil time.Time
	backoff    time.Duration
	rescans    map[uint32]uint64 // partitions being scanned: the ownership generation of the scan
}

// New returns a Publisher; Run starts it.
func New(cfg Config) (*Publisher, error) {
	if cfg.Store == nil || cfg.Sink == nil || cfg.Core.Partitions <= 0 {
		return nil, errors.New("firehose: Store, Sink and Core.Partitions are required")
	}
	cfg = cfg.withDefaults()
	return &Publisher{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1), core: NewCore(cfg.Core),
		publishing: true, rescans: map[uint32]uint64{}}, nil
}

// SetOwned sets Config.Owned before Run (the cluster exists only after the
// publisher was wired into the conversation actors).
func (p *Publisher) SetOwned(owned func() []Holding) { p.cfg.Owned = owned }

// Publish takes a committed batch (actor.Publisher). It never blocks on
// the broker or the store.
func (p *Publisher) Publish(convID string, msgs []sequencer.Message) {
	p.mu.Lock()
	p.core.Live(convID, msgs)
	p.mu.Unlock()
	p.poke()
}

func (p *Publisher) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Stats returns the counters and the backlog.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, per := p.core.Lag()
	return Stats{Lag: l, Published: p.published, PublishErrors: p.pubErrors, StoreErrors: p.storeErrs,
		Publishing: p.publishing, PerPartition: per}
}

// sweepBatch bounds the rows of one OutboxSweep.
const sweepBatch = 1000

// Run publishes until ctx ends, then stores the cursors it owes (bounded
// by OpTimeout) and returns. The cursors are stored and the outbox swept
// beside the loop (one store call at a time), so a slow store never holds
// up a publish.
func (p *Publisher) Run(ctx context.Context) {
	own := time.NewTicker(p.cfg.OwnEvery)
	defer own.Stop()
	flush := time.NewTicker(p.cfg.FlushEvery)
	defer flush.Stop()
	rescan := time.NewTicker(p.cfg.RescanEvery)
	defer rescan.Stop()
	sem := make(chan struct{}, p.cfg.ScanWorkers)
	var scans, bg sync.WaitGroup
	storing := make(chan struct{}, 1) // a flush (and sweep) in flight
	nextSweep := time.Now().Add(p.cfg.SweepEvery)
	defer func() {
		scans.Wait()
		bg.Wait()
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.OpTimeout)
		p.flush(fctx)
		cancel()
	}()
	p.refreshOwnership(ctx, sem, &scans, false)
	var pause *time.Timer
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-own.C:
			p.refreshOwnership(ctx, sem, &scans, false)
		case <-rescan.C:
			p.refreshOwnership(ctx, sem, &scans, true)
		case now := <-flush.C:
			select {
			case storing <- struct{}{}:
				sweep := !now.Before(nextSweep)
				if sweep {
					nextSweep = now.Add(p.cfg.SweepEvery)
				}
				bg.Add(1)
				go func() {
					defer bg.Done()
					defer func() { <-storing }()
					p.flush(ctx)
					if sweep {
						p.sweep(ctx)
					}
				}()
			default: // the last one is still running
			}
		}
		if wait := p.dispatch(ctx); wait > 0 && pause == nil {
			pause = time.AfterFunc(wait, func() { p.poke() })
		} else if wait == 0 && pause != nil {
			pause.Stop()
			pause = nil
		} else if pause != nil && wait > 0 {
			pause.Reset(wait)
		}
	}
}

// refreshOwnership hands the owned partitions to the core and scans the
// new ones (all of them with again).
func (p *Publisher) refreshOwnership(ctx context.Context, sem chan struct{}, scans *sync.WaitGroup, again bool) {
	var held []Holding
	if p.cfg.Owned != nil {
		held = p.cfg.Owned()
	} else {
		held = make([]Holding, p.cfg.Core.Partitions)
		for i := range held {
			held[i] = Holding{Partition: uint32(i)}
		}
	}
	p.mu.Lock()
	added := p.core.OwnHoldings(held)
	if again {
		added = added[:0]
		for _, h := range held {
			added = append(added, h.Partition)
		}
	}
	type job struct {
		part uint32
		gen  uint64
	}
	var start []job
	for _, part := range added {
		// A scan of an earlier ownership still reading does not count:
		// its pages are ignored (Core.ScannedGen) and it stops.
		if gen := p.core.Gen(part); gen != 0 && p.rescans[part] != gen {
			p.rescans[part] = gen
			start = append(start, job{part, gen})
		}
	}
	p.mu.Unlock()
	for _, j := range start {
		scans.Add(1)
		go func() {
			defer scans.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				p.scanEnded(j.part, j.gen)
				return
			}
			defer func() { <-sem }()
			p.scan(ctx, j.part, j.gen)
		}()
	}
}

// scanEnded forgets partition part's scan of generation gen (unless a newer
// one has started).
func (p *Publisher) scanEnded(part uint32, gen uint64) {
	p.mu.Lock()
	if p.rescans[part] == gen {
		delete(p.rescans, part)
	}
	p.mu.Unlock()
}

// scan reads partition part's outbox into the core, page by page, retrying
// a failed page while the partition's ownership of generation gen lasts.
func (p *Publisher) scan(ctx context.Context, part uint32, gen uint64) {
	defer func() {
		p.scanEnded(part, gen)
		p.poke()
	}()
	after, wait := "", 50*time.Millisecond
	for ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, p.cfg.OpTimeout)
		rows, err := p.cfg.Store.OutboxPending(sctx, part, after, p.cfg.ScanPage)
		cancel()
		p.mu.Lock()
		if p.core.Gen(part) != gen { // dropped (and maybe owned again: a new scan runs)
			p.mu.Unlock()
			return
		}
		if err != nil {
			p.storeErrs++
			p.mu.Unlock()
			p.log.Warn("firehose: reading the outbox failed; retrying", "partition", part, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			wait = min(2*wait, 2*time.Second)
			continue
		}
		done := len(rows) < p.cfg.ScanPage
		p.core.ScannedGen(part, gen, rows, done, time.Now())
		p.mu.Unlock()
		if done {
			return
		}
		after = rows[len(rows)-1].ConvID
	}
}

// dispatch starts every action the core has; it returns how long to wait
// before trying again after failures (0: no pause).
func (p *Publisher) dispatch(ctx context.Context) time.Duration {
	p.mu.Lock()
	if wait := time.Until(p.pauseUntil); wait > 0 {
		p.mu.Unlock()
		return wait
	}
	var acts []Action
	for {
		a, ok := p.core.Next()
		if !ok {
			break
		}
		acts = append(acts, a)
	}
	p.mu.Unlock()
	for _, a := range acts {
		switch a.Kind {
		case Publish:
			p.cfg.Sink.Publish(a.Part, a.Msg, func(err error) { p.published1(a, err) })
		case Read:
			go p.read(ctx, a)
		}
	}
	return 0
}

func (p *Publisher) published1(a Action, err error) {
	p.mu.Lock()
	p.core.Published(a, err)
	switch {
	case err == nil:
		p.published++
		if p.cfg.ObserveLag != nil {
			p.cfg.ObserveLag(time.Since(a.Msg.ServerAt).Seconds())
		}
		p.backoff = 0
		if !p.publishing {
			p.publishing = true
			l, _ := p.core.Lag()
			p.log.Info("firehose: publishing again", "backlog_messages", l.Messages)
		}
	default:
		p.pubErrors++
		p.backoff = min(max(2*p.backoff, 100*time.Millisecond), 2*time.Second)
		p.pauseUntil = time.Now().Add(p.backoff)
		if p.publishing {
			p.publishing = false
			p.log.Warn("firehose: publishing stopped; sends go on, the backlog is kept in the store", "err", err)
		}
	}
	p.mu.Unlock()
	p.poke()
}

func (p *Publisher) read(ctx context.Context, a Action) {
	rctx, cancel := context.WithTimeout(ctx, p.cfg.OpTimeout)
	msgs, err := p.cfg.Store.ReadRange(rctx, a.ConvID, a.After, a.Limit)
	cancel()
	p.mu.Lock()
	p.core.Filled(a, msgs, err)
	if err != nil {
		p.storeErrs++
		p.pauseUntil = time.Now().Add(200 * time.Millisecond)
	}
	p.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		p.log.Warn("firehose: reading a backlog failed; retrying", "err", err)
	}
	p.poke()
}

// flush stores the cursors the core owes.
func (p *Publisher) flush(ctx context.Context) {
	storeCall(p, ctx, "storing the published cursors", p.core.Moves, p.cfg.Store.OutboxAdvance,
		func(moves []persist.OutboxMove, err error) { p.core.Advanced(moves, err, time.Now()) })
}

// sweep deletes the outbox rows published in full that saw no commit for
// SweepAfter (persist.Outbox.OutboxSweep), sweepBatch at a time.
func (p *Publisher) sweep(ctx context.Context) {
	take := func() []persist.OutboxKey { return p.core.Sweepable(time.Now(), p.cfg.SweepAfter, sweepBatch) }
	answer := func(keys []persist.OutboxKey, err error) { p.core.Swept(keys, err, time.Now()) }
	for ctx.Err() == nil {
		if n, err := storeCall(p, ctx, "sweeping the outbox", take, p.cfg.Store.OutboxSweep, answer); err != nil || n < sweepBatch {
			return
		}
	}
}

// storeCall takes work from the core (under p.mu), hands it to the store
// (bounded by OpTimeout) and the answer back to the core; it returns how
// much work there was.
func storeCall[T any](p *Publisher, ctx context.Context, what string, take func() []T,
	call func(context.Context, []T) error, answer func([]T, error)) (int, error) {
	p.mu.Lock()
	work := take()
	p.mu.Unlock()
	if len(work) == 0 {
		return 0, nil
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.OpTimeout)
	err := call(cctx, work)
	cancel()
	p.mu.Lock()
	answer(work, err)
	if err != nil {
		p.storeErrs++
	}
	p.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		p.log.Warn("firehose: "+what+" failed; retrying", "err", fmt.Sprint(err))
	}
	return len(work), err
}
