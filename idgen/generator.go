// Package idgen issues msg_ids: 64-bit snowflake ids, globally unique and
// never reused, and keeps the worker-id lease that makes them unique across
// processes.
//
// Layout (most significant bit first):
//
//	0 | 41 bits: ms since Epoch | 10 bits: worker id | 12 bits: sequence
//
// The sign bit is always 0, so an id fits PostgreSQL's BIGINT. 41 bits of
// milliseconds last about 69 years from Epoch (2024-01-01); one worker issues
// at most 4096 ids per millisecond (4,096,000 ids/s).
//
// A Generator owns the (last ms, sequence) state of ONE worker id and the gate
// that says which milliseconds it may use:
//   - it never issues two equal ids and its ids strictly increase;
//   - a clock that moved back by at most MaxClockRollback is waited out (via
//     the injected Clock's Sleep); a larger rollback is refused with an error
//     wrapping sequencer.ErrClockMovedBackwards (code unavailable: the client
//     retries), counted in sequencer_clock_rollbacks_total;
//   - under an Issuer it issues nothing without a valid lease, nothing for a
//     millisecond at or below the LastMs inherited from the id's previous
//     holder, and nothing for a millisecond beyond the reservation recorded in
//     the store (it renews first), so the store's LastMs bounds every id ever
//     issued, across crashes and restarts with a rolled-back clock.
//
// idgen must never assign seqs, never read or write messages, and never issue
// an id whose millisecond it has not first made durable as a reservation when
// running under an Issuer. See docs/IDGEN.md for the design and the benchmark.
package idgen

import (
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/internal/conf"
	"github.com/sequencer-im/sequencer/metrics"
)

// Epoch is the unix time in milliseconds that msg_id timestamps count from:
// 2024-01-01T00:00:00Z. Changing it would re-mean every stored id: never do.
const Epoch int64 = 1704067200000

// Layout constants.
const (
	TimeBits   = 41
	WorkerBits = 10
	SeqBits    = 12

	MaxWorkerID = 1<<WorkerBits - 1 // 1023
	MaxSeq      = 1<<SeqBits - 1    // 4095: ids per worker per ms is MaxSeq+1

	workerShift = SeqBits
	timeShift   = SeqBits + WorkerBits
	maxRelMs    = 1<<TimeBits - 1
)

// MaxClockRollback is the largest backwards clock step that is waited out;
// a larger one makes Next fail with sequencer.ErrClockMovedBackwards.
const MaxClockRollback = 5 * time.Millisecond

// EpochTime is Epoch as a time.Time.
var EpochTime = time.UnixMilli(Epoch).UTC()

// Decode splits a msg_id into the millisecond it was issued in (UTC), the
// worker id and the sequence number within that millisecond.
func Decode(id uint64) (t time.Time, worker int, seq int) {
	ms := int64(id>>timeShift) + Epoch
	return time.UnixMilli(ms).UTC(), int(id >> workerShift & MaxWorkerID), int(id & MaxSeq)
}

// Compose builds the id for (unix ms, worker, seq). It does not check ranges;
// it exists for tests and tools that need an id for a known time (e.g. a
// lower bound for "ids issued after t": Compose(t.UnixMilli(), 0, 0)).
func Compose(unixMs int64, worker, seq int) uint64 {
	return uint64(unixMs-Epoch)<<timeShift | uint64(worker)<<workerShift | uint64(seq)
}

// Config configures a Generator with a fixed worker id (New). Servers use a
// Issuer instead, which leases the worker id from the store.
type Config struct {
	// WorkerID is this generator's worker id, 0..1023. Two live generators
	// must never share one: assign it from something that guarantees that.
	WorkerID int
	// AfterMs (unix ms, optional) is a floor: no id is issued for a
	// millisecond at or below it (e.g. the last ms a previous process issued
	// ids for under this worker id). 0 means none.
	AfterMs int64
	// Clock is the time source; nil means the real clock.
	Clock clock.Clock
	// Metrics is optional; nil records nothing.
	Metrics *metrics.Set
}

// Generator issues msg_ids for one worker id at a time. It is safe for
// concurrent use; Next is lock-free (one compare-and-swap on a packed state
// word per id).
type Generator struct {
	clk clock.Clock

	// state packs the last issued id's millisecond and sequence together
	// with the generation of the view it was issued under:
	//   gen (11 bits) | ms since Epoch (41 bits) | seq (12 bits)
	// A CAS on it is the only way an id is issued. An Issuer bumps gen when the
	// view's rights shrink (lease lost, released) or the worker id changes,
	// so an in-flight Next that loaded the old view cannot issue.
	state atomic.Uint64
	view  atomic.Pointer[view]

	// gate renews the reservation when Next reaches its end (nil: fixed
	// worker, unbounded view).
	gate reserver

	waited  prometheus.Counter // nil when no metrics
	refused prometheus.Counter
}

// view is what a generator may issue under, published atomically by the
// Issuer. It is immutable once published.
type view struct {
	gen       uint64 // 0..genMask, matches the state's gen
	held      bool   // a valid lease (or a fixed worker id)
	worker    uint64 // worker id, 0..1023
	floorMs   int64  // unix ms: issue only for ms > floorMs
	capMs     int64  // unix ms: issue only for ms <= capMs (the store's reservation)
	expiresMs int64  // unix ms: issue only for ms < expiresMs (the lease end)
	err       error  // why !held
}

// reserver is the Issuer seen from the generator: extend the reservation so
// that nowMs is covered, or say why not.
type reserver interface {
	reserve(nowMs int64) error
}

const (
	genShift = TimeBits + SeqBits // 53
	genMask  = 1<<(64-genShift) - 1
	msMask   = maxRelMs
)

func pack(gen uint64, rel int64, seq uint64) uint64 {
	return gen<<genShift | uint64(rel)<<SeqBits | seq
}

func unpack(s uint64) (gen uint64, rel int64, seq uint64) {
	return s >> genShift, int64(s >> SeqBits & msMask), s & MaxSeq
}

// Validate reports a WorkerID outside 0..1023. Config has no defaults (the
// zero worker id is a real one), so there is no DefaultConfig.
func (c Config) Validate() error {
	ch := conf.Checker{Pkg: "idgen"}
	conf.Range(&ch, "WorkerID", c.WorkerID, 0, MaxWorkerID)
	return ch.Err()
}

// New returns a generator for a fixed worker id. It fails if the id is
// outside 0..1023.
func New(cfg Config) (*Generator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := newGenerator(cfg.Clock, cfg.Metrics, nil)
	g.view.Store(&view{
		held:      true,
		worker:    uint64(cfg.WorkerID),
		floorMs:   cfg.AfterMs,
		capMs:     math.MaxInt64,
		expiresMs: math.MaxInt64,
	})
	return g, nil
}

func newGenerator(c clock.Clock, m *metrics.Set, gate reserver) *Generator {
	g := &Generator{clk: clock.Or(c), gate: gate}
	if m != nil {
		g.waited = m.ClockRollbacks.WithLabelValues("waited")
		g.refused = m.ClockRollbacks.WithLabelValues("refused")
	}
	// Nothing issued yet: mark ms 0 as used up so the first id is for a
	// later millisecond.
	g.state.Store(pack(0, 0, MaxSeq))
	return g
}

// WorkerID returns the worker id ids are issued under now, and whether the
// generator may issue at all (holds a lease or has a fixed id).
func (g *Generator) WorkerID() (int, bool) {
	v := g.view.Load()
	return int(v.worker), v.held
}

// LastMs returns the unix millisecond of the last id issued (0 if none).
func (g *Generator) LastMs() int64 {
	_, rel, _ := unpack(g.state.Load())
	if rel == 0 {
		return 0
	}
	return rel + Epoch
}

func (g *Generator) nowMs() int64 { return g.clk.Now().UnixMilli() }

// Next issues the next msg_id. Errors (all retryable, code unavailable unless
// noted):
//   - wrapping sequencer.ErrWorkerLeaseLost: no valid worker-id lease;
//   - wrapping sequencer.ErrClockMovedBackwards: the clock is more than
//     MaxClockRollback behind the last issued id, or behind the last ms the
//     worker id's previous holder may have used;
//   - the reservation could not be renewed (wraps the store's error);
//   - code internal: the clock is before Epoch or past the layout's end.
func (g *Generator) Next() (uint64, error) {
	v := g.view.Load()
	s := g.state.Load() // load the state BEFORE reading the clock (see below)
	now := g.nowMs()
	for {
		if !v.held {
			return 0, v.err
		}
		gen, lastRel, seq := unpack(s)
		if gen != v.gen {
			// An Issuer is switching views (published the view, is about
			// to bump the state, or the reverse). Take both again.
			runtime.Gosched()
			v, s, now = g.view.Load(), g.state.Load(), g.nowMs()
			continue
		}
		rel := now - Epoch
		if rel <= 0 || rel > maxRelMs {
			return 0, sequencer.Errorf(sequencer.CodeInternal, "idgen: clock %s outside the msg_id range (epoch %s, 41-bit ms)",
				time.UnixMilli(now).UTC().Format(time.RFC3339Nano), EpochTime.Format(time.RFC3339))
		}
		last := lastRel + Epoch
		if now < last {
			// The state was read before the clock, so a last ms above
			// now means the clock really moved back.
			if err := g.rolledBack(last-now, last, "last issued id"); err != nil {
				return 0, err
			}
			v, s, now = g.view.Load(), g.state.Load(), g.nowMs()
			continue
		}
		if now <= v.floorMs {
			if now < v.floorMs {
				if err := g.rolledBack(v.floorMs-now, v.floorMs, "the lease's floor (an earlier holder, an earlier run of this node, or the store's clock)"); err != nil {
					return 0, err
				}
			} else {
				g.waitPast(now)
			}
			v, s, now = g.view.Load(), g.state.Load(), g.nowMs()
			continue
		}
		if now > v.capMs || now >= v.expiresMs {
			if g.gate == nil {
				return 0, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrWorkerLeaseLost, "idgen: lease view ended")
			}
			if err := g.gate.reserve(now); err != nil {
				return 0, err
			}
			v, s, now = g.view.Load(), g.state.Load(), g.nowMs()
			continue
		}
		var nextSeq uint64
		if rel == lastRel {
			if seq == MaxSeq {
				// 4096 ids in this ms: wait for the next one.
				g.waitPast(now)
				v, s, now = g.view.Load(), g.state.Load(), g.nowMs()
				continue
			}
			nextSeq = seq + 1
		}
		if g.state.CompareAndSwap(s, pack(gen, rel, nextSeq)) {
			return uint64(rel)<<timeShift | v.worker<<workerShift | nextSeq, nil
		}
		// Lost a race with another Next. Its ms was read from the clock
		// after our state load, so it is not in the future: reuse it
		// rather than reading the clock again.
		v, s = g.view.Load(), g.state.Load()
		if _, r, _ := unpack(s); r+Epoch > now {
			now = r + Epoch
		}
	}
}

// rolledBack handles a clock that is behind `bound` by behindMs: wait it out
// if small, else refuse. `what` names the bound in the error.
func (g *Generator) rolledBack(behindMs, bound int64, what string) error {
	behind := time.Duration(behindMs) * time.Millisecond
	if behind > MaxClockRollback {
		if g.refused != nil {
			g.refused.Inc()
		}
		return sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrClockMovedBackwards,
			fmt.Sprintf("idgen: clock is %s behind the %s (ms %d), more than %s", behind, what, bound, MaxClockRollback))
	}
	if g.waited != nil {
		g.waited.Inc()
	}
	// Sleep until the clock reaches `bound` (the caller checks again).
	g.clk.Sleep(behind)
	return nil
}

// waitPast returns once the clock reads a millisecond after ms, or reads a
// millisecond before it (a step back: the caller checks again). With a
// free-running clock it spins (yielding the processor): the wait is below
// one millisecond and a timer sleep would overshoot it by far more (Go's
// timers have millisecond granularity on Linux), costing throughput. With a
// clock that does not move between two readings (clock.Fake, or a coarse
// clock) it sleeps the remainder instead.
func (g *Generator) waitPast(ms int64) {
	prev := g.clk.Now()
	for {
		runtime.Gosched()
		t := g.clk.Now()
		if t.UnixMilli() > ms {
			return
		}
		if t.UnixMilli() < ms {
			// The clock stepped back during the wait: the caller's
			// rollback rule decides (wait up to MaxClockRollback, else
			// refuse), rather than spinning until it is past ms again.
			return
		}
		if t.Equal(prev) {
			g.clk.Sleep(time.UnixMilli(ms + 1).Sub(t))
			return
		}
		prev = t
	}
}

// errNoLease is the view error before the first lease.
var errNoLease = sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrWorkerLeaseLost, "idgen: no worker id leased yet")
