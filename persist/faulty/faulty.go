// Package faulty wraps a persist.Store and injects failures into its calls,
// scripted one by one or drawn from a seeded random schedule, and records
// what it did so tests can check that the sequencer never acks a send
// before its row is durable.
//
// Faults of Commit: fail before writing (sequencer.ErrStoreUnavailable),
// delay, commit then report sequencer.ErrUnknownOutcome (the rows ARE
// stored), drop (report sequencer.ErrUnknownOutcome, nothing stored), and
// land late (report sequencer.ErrUnknownOutcome at once, then commit a moment
// later in the background, like a stalled PostgreSQL backend that ignored
// the cancel). Settle waits for the late commits, as the real store's Settle
// ends a stalled backend; SetBrokenSettle makes it return at once, to show
// that a writer that answered without settling breaks "an error answer is
// final".
// Reads (LoadHead, ReadRange, FindByClientKey, GetMessage) and the read
// positions (MarkRead, ReadStates, passed to the inner store's
// persist.ReadPositions) can fail with sequencer.ErrStoreUnavailable or be
// delayed; a MarkRead can also land and report ErrUnknownOutcome. The wrapper never changes
// what the inner store stores or answers on the calls it lets through.
package faulty

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// Fault is what the wrapper does to one call.
type Fault int

const (
	None           Fault = iota // pass through
	FailBefore                  // return ErrStoreUnavailable without calling the inner store
	Delay                       // wait (Rates.MaxDelay, or until ctx ends) then pass through
	CommitThenFail              // Commit only: commit, then return ErrUnknownOutcome
	Drop                        // Commit only: return ErrUnknownOutcome without committing
	LandLate                    // Commit only: return ErrUnknownOutcome now, commit a moment later
)

func (f Fault) String() string {
	switch f {
	case None:
		return "none"
	case FailBefore:
		return "fail-before"
	case Delay:
		return "delay"
	case CommitThenFail:
		return "commit-then-fail"
	case Drop:
		return "drop"
	case LandLate:
		return "land-late"
	}
	return fmt.Sprintf("fault(%d)", int(f))
}

// Op names a Store call.
type Op string

const (
	OpCommit   Op = "commit"
	OpLoadHead Op = "load_head"
	OpFind     Op = "find_by_client_key"
	OpRange    Op = "read_range"
	OpGet      Op = "get_message"
	// OpMarkRead and OpReadStates are persist.ReadPositions' calls: they
	// take FailBefore and Delay; OpMarkRead also takes CommitThenFail (the
	// position is stored, the answer is ErrUnknownOutcome).
	OpMarkRead   Op = "mark_read"
	OpReadStates Op = "read_states"
)

// Rates is the random schedule: the probability of each fault per call.
// Faults not applicable to an op are ignored for it.
type Rates struct {
	FailBefore     float64
	Delay          float64
	CommitThenFail float64 // commits only
	Drop           float64 // commits only
	LandLate       float64 // commits only
	MaxDelay       time.Duration
}

// Event records one faulted call (calls passed through unchanged are only
// counted).
type Event struct {
	Op       Op
	Fault    Fault
	ConvIDs  []string // commit: the conversations of the transaction
	Rows     int      // commit: rows in the transaction
	InnerErr error    // the inner store's answer, when it was called
}

// Store is a fault-injecting persist.Store. Safe for concurrent use.
type Store struct {
	// Store is the inner store: calls not listed below pass through, and
	// tests read the truth from it directly, without faults.
	persist.Store

	mu      sync.Mutex
	rng     *rand.Rand
	rates   Rates
	script  map[Op][]Fault
	events  []Event
	calls   map[Op]int
	durable map[uint64]bool // msg_ids of rows the inner store committed

	late         []chan struct{} // LandLate commits: closed once each has run
	brokenSettle bool
}

// SetBrokenSettle makes Settle return at once without waiting for late
// commits (a store that breaks its contract), for tests that show the
// damage.
func (s *Store) SetBrokenSettle(broken bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.brokenSettle = broken
}

// Settle waits until every LandLate commit has run (or ctx ends), then asks
// the inner store.
func (s *Store) Settle(ctx context.Context) error {
	s.mu.Lock()
	broken := s.brokenSettle
	s.mu.Unlock()
	if !broken {
		for _, done := range s.lateCommits() {
			select {
			case <-done:
			case <-ctx.Done():
				return fmt.Errorf("faulty: settle: %w: %w", sequencer.ErrStoreUnavailable, ctx.Err())
			}
		}
	}
	return s.Store.Settle(ctx)
}

// lateCommits returns the LandLate commits started so far, dropping the
// finished ones from the list.
func (s *Store) lateCommits() []chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	pending := s.late[:0]
	for _, c := range s.late {
		select {
		case <-c:
		default:
			pending = append(pending, c)
		}
	}
	s.late = pending
	return append([]chan struct{}(nil), pending...)
}

// WaitLate waits until every LandLate commit has run (tests call it before
// reading the inner store back).
func (s *Store) WaitLate() {
	for _, done := range s.lateCommits() {
		<-done
	}
}

// New wraps inner with a random schedule seeded by seed (zero Rates: no
// random faults, only scripted ones). A nil inner is a new, empty
// persist/memstore.Store (in memory, not durable).
func New(inner persist.Store, seed uint64, rates Rates) *Store {
	if inner == nil {
		inner = memstore.New()
	}
	return &Store{Store: inner, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), rates: rates,
		script: map[Op][]Fault{}, calls: map[Op]int{}, durable: map[uint64]bool{}}
}

// Inject makes the next calls of op suffer faults, in order, before the
// random schedule applies again.
func (s *Store) Inject(op Op, faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script[op] = append(s.script[op], faults...)
}

// SetRates replaces the random schedule (zero Rates: faults off).
func (s *Store) SetRates(r Rates) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rates = r
}

// Events returns the faulted calls so far, in order.
func (s *Store) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.events...)
}

// Count returns how many calls of op were made and how many of them got
// fault f.
func (s *Store) Count(op Op, f Fault) (calls, faulted int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.events {
		if e.Op == op && e.Fault == f {
			faulted++
		}
	}
	return s.calls[op], faulted
}

// Durable reports whether a commit of the inner store that returned nil
// wrote msgID (whatever this wrapper then reported to its caller).
func (s *Store) Durable(msgID uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.durable[msgID]
}

func (s *Store) next(op Op) Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[op]++
	if q := s.script[op]; len(q) > 0 {
		s.script[op] = q[1:]
		return q[0]
	}
	r := s.rates
	x := s.rng.Float64()
	if x < r.FailBefore {
		return FailBefore
	}
	x -= r.FailBefore
	if x < r.Delay {
		return Delay
	}
	x -= r.Delay
	if op != OpCommit {
		return None
	}
	if x < r.CommitThenFail {
		return CommitThenFail
	}
	x -= r.CommitThenFail
	if x < r.Drop {
		return Drop
	}
	x -= r.Drop
	if x < r.LandLate {
		return LandLate
	}
	return None
}

func (s *Store) record(e Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
}

func (s *Store) delay(ctx context.Context) error {
	s.mu.Lock()
	d := s.rates.MaxDelay
	if d <= 0 {
		d = time.Millisecond
	} else {
		d = time.Duration(s.rng.Int64N(int64(d)) + 1)
	}
	s.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func unavailable(op Op) error {
	return fmt.Errorf("faulty: injected failure before %s: %w", op, sequencer.ErrStoreUnavailable)
}

// Commit applies the next commit fault.
func (s *Store) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	f := s.next(OpCommit)
	ev := Event{Op: OpCommit, Fault: f}
	for _, b := range batches {
		ev.ConvIDs = append(ev.ConvIDs, b.ConvID)
		ev.Rows += len(b.Messages)
	}
	switch f {
	case FailBefore:
		s.record(ev)
		return unavailable(OpCommit)
	case Drop:
		s.record(ev)
		return fmt.Errorf("faulty: commit dropped: %w", sequencer.ErrUnknownOutcome)
	case LandLate:
		s.record(ev)
		s.mu.Lock()
		d := time.Duration(s.rng.Int64N(int64(2*time.Millisecond))) + time.Millisecond
		s.mu.Unlock()
		rows := make([]persist.ConvBatch, len(batches))
		copy(rows, batches)
		done := make(chan struct{})
		s.mu.Lock()
		s.late = append(s.late, done)
		s.mu.Unlock()
		go func() {
			defer close(done)
			time.Sleep(d)
			if err := s.Store.Commit(context.Background(), rows); err == nil {
				s.markDurable(rows)
			}
		}()
		return fmt.Errorf("faulty: commit stalled, the answer is lost, it lands later: %w", sequencer.ErrUnknownOutcome)
	case Delay:
		if err := s.delay(ctx); err != nil {
			s.record(ev)
			return fmt.Errorf("faulty: delayed commit: %w: %w", sequencer.ErrStoreUnavailable, err)
		}
	}
	err := s.Store.Commit(ctx, batches)
	if err == nil {
		s.markDurable(batches)
	}
	if f != None {
		ev.InnerErr = err
		s.record(ev)
	}
	if f == CommitThenFail {
		if err != nil {
			return err
		}
		return fmt.Errorf("faulty: committed, then the answer was lost: %w", sequencer.ErrUnknownOutcome)
	}
	return err
}

func (s *Store) markDurable(batches []persist.ConvBatch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range batches {
		for _, m := range b.Messages {
			s.durable[m.MsgID] = true
		}
	}
}

// read applies the next read fault of op; nil means call the inner store.
func (s *Store) read(ctx context.Context, op Op) error {
	switch f := s.next(op); f {
	case FailBefore:
		s.record(Event{Op: op, Fault: f})
		return unavailable(op)
	case Delay:
		s.record(Event{Op: op, Fault: f})
		if err := s.delay(ctx); err != nil {
			return fmt.Errorf("faulty: delayed %s: %w: %w", op, sequencer.ErrStoreUnavailable, err)
		}
	}
	return nil
}

func (s *Store) LoadHead(ctx context.Context, convID string) (uint64, error) {
	if err := s.read(ctx, OpLoadHead); err != nil {
		return 0, err
	}
	return s.Store.LoadHead(ctx, convID)
}

func (s *Store) FindByClientKey(ctx context.Context, key sequencer.ClientKey) (sequencer.Message, error) {
	if err := s.read(ctx, OpFind); err != nil {
		return sequencer.Message{}, err
	}
	return s.Store.FindByClientKey(ctx, key)
}

func (s *Store) ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error) {
	if err := s.read(ctx, OpRange); err != nil {
		return nil, err
	}
	return s.Store.ReadRange(ctx, convID, afterSeq, limit)
}

func (s *Store) ReadBefore(ctx context.Context, convID string, afterSeq, beforeSeq uint64, limit int) ([]sequencer.Message, error) {
	if err := s.read(ctx, OpRange); err != nil {
		return nil, err
	}
	return s.Store.ReadBefore(ctx, convID, afterSeq, beforeSeq, limit)
}

func (s *Store) ReadMany(ctx context.Context, cursors []persist.Cursor, limit, total int) ([]persist.Page, error) {
	if err := s.read(ctx, OpRange); err != nil {
		return nil, err
	}
	return s.Store.ReadMany(ctx, cursors, limit, total)
}

func (s *Store) GetMessage(ctx context.Context, msgID uint64) (sequencer.Message, error) {
	if err := s.read(ctx, OpGet); err != nil {
		return sequencer.Message{}, err
	}
	return s.Store.GetMessage(ctx, msgID)
}

// positions is the inner store's persist.ReadPositions.
func (s *Store) positions(op Op) (persist.ReadPositions, error) {
	rp, ok := s.Store.(persist.ReadPositions)
	if !ok {
		return nil, fmt.Errorf("faulty: %s: inner store %T has no read positions", op, s.Store)
	}
	return rp, nil
}

// MarkRead implements persist.ReadPositions over the inner store.
func (s *Store) MarkRead(ctx context.Context, convID string, uid, seq uint64) (persist.ReadState, error) {
	rp, err := s.positions(OpMarkRead)
	if err != nil {
		return persist.ReadState{}, err
	}
	switch f := s.next(OpMarkRead); f {
	case FailBefore:
		s.record(Event{Op: OpMarkRead, Fault: f})
		return persist.ReadState{}, unavailable(OpMarkRead)
	case Delay:
		s.record(Event{Op: OpMarkRead, Fault: f})
		if err := s.delay(ctx); err != nil {
			return persist.ReadState{}, fmt.Errorf("faulty: delayed %s: %w: %w", OpMarkRead, sequencer.ErrStoreUnavailable, err)
		}
	case CommitThenFail:
		_, err := rp.MarkRead(ctx, convID, uid, seq)
		s.record(Event{Op: OpMarkRead, Fault: f, ConvIDs: []string{convID}, InnerErr: err})
		return persist.ReadState{}, fmt.Errorf("faulty: injected after %s: %w", OpMarkRead, sequencer.ErrUnknownOutcome)
	}
	return rp.MarkRead(ctx, convID, uid, seq)
}

// ReadStates implements persist.ReadPositions over the inner store.
func (s *Store) ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]persist.ReadState, error) {
	rp, err := s.positions(OpReadStates)
	if err != nil {
		return nil, err
	}
	if err := s.read(ctx, OpReadStates); err != nil {
		return nil, err
	}
	return rp.ReadStates(ctx, uid, convIDs)
}

var (
	_ persist.Store         = (*Store)(nil)
	_ persist.ReadPositions = (*Store)(nil)
)
