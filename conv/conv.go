// Package conv is the single writer of one conversation: it queues sends,
// assigns seqs head+1.. to a batch, keeps at most one batch in flight, and
// decides what each store answer means for the senders (ack, duplicate,
// retryable failure) and for the head.
//
// It is a pure state machine in the style of etcd raft's RawNode: it performs
// no I/O, starts no goroutines, reads no clock, holds no context and calls
// nothing outside itself. The caller feeds it inputs (Send, Cancel,
// HeadLoaded, Formed, Committed, Resolved, LookedUp), then takes a Ready and
// executes its effects: at most
// one store operation is outstanding at any time, and its answer comes back
// as the matching input. What a batch needs from the node (the ownership
// fence, msg_ids, the time) the core asks for (Ready.Form) and the caller
// hands back (Formed).
//
// The core must never: assign a seq before the head is known from the store;
// assign a seq while a commit's outcome is unknown; answer a send with a seq
// before its commit succeeded or a re-read proved it landed; let a failed,
// rejected, cancelled or duplicate send consume a seq.
package conv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"time"

	"github.com/sequencer-im/sequencer"
)

// Config configures one conversation's core. DefaultConfig holds every
// default; a field <= 0 given to New means its default.
type Config struct {
	ConvID string
	// MaxQueue is the most sends the conversation holds at once (queued, in
	// flight, and resends waiting on them); more are refused with
	// sequencer.ErrOverloaded.
	MaxQueue int
	// MaxBatch is the most messages in one commit.
	MaxBatch int
	// MemoSize is how many recently committed resend keys are remembered to
	// answer resends without a store round trip (older ones are answered
	// through the store's uk_from_client).
	MemoSize int
	// Floor is the highest seq a previous writer of this conversation on
	// this node acked (0: none known). A head read from the store below it
	// means the store lost acknowledged messages: the core refuses to write
	// (see Ready.Regressed) instead of reusing their seqs.
	Floor uint64
	// Windows bound how late a message may be edited or recalled (zero: no
	// limit); see CheckEvent.
	Windows Windows
	// TargetCache is how many messages' states (targets of edits and
	// recalls) the writer remembers from its own commits and reads.
	TargetCache int
}

// DefaultConfig returns every default (ConvID is still required).
func DefaultConfig() Config {
	return Config{MaxQueue: 4096, MaxBatch: 4000, MemoSize: 64, TargetCache: 16}
}

// Reply answers one Send. Exactly one Reply is produced for every Send.
type Reply struct {
	Token  any // the token given to Send
	Result sequencer.SendResult
	Err    error
}

// Resolve asks the caller to read the truth after a commit whose outcome is
// unknown: first make sure the old transaction is finished (Store.Settle),
// then read the conversation's head (LoadHead) and up to Count messages with
// seq > AfterSeq (ReadRange), answered with Resolved. Attempt counts the
// earlier tries that failed (0 on the first); the caller waits a backoff
// before a retry. The batch's senders get no answer until it is resolved:
// an error answer must mean "not stored", and only the store can say.
type Resolve struct {
	AfterSeq uint64
	Count    int
	Attempt  int
}

// Ready holds the effects the caller must execute. Replies may be delivered
// at once: every ack in them follows a durable commit. At most one of
// LoadHead, Targets, Form, Commit, Resolve and Lookup is set; its answer is
// the matching input (HeadLoaded, TargetsLoaded, Formed, Committed,
// Resolved, LookedUp).
type Ready struct {
	LoadHead bool // read the head, answer HeadLoaded
	// Targets asks for the stored messages with these msg_ids (the targets
	// of queued edits and recalls the writer does not know yet), answered
	// with TargetsLoaded.
	Targets []uint64
	// Form asks for what the next batch of Form queued sends needs from the
	// node: the ownership fence of the conversation, Form msg_ids and the
	// time; answer Formed before any other input (nothing else is asked
	// meanwhile).
	Form    int
	Commit  *sequencer.ConvBatch  // commit this batch, answer Committed
	Resolve *Resolve              // re-read after an unknown outcome, answer Resolved
	Lookup  []sequencer.ClientKey // FindByClientKey each key, answer LookedUp
	Replies []Reply
	// Regressed is set once, when the store's head fell below a seq this
	// conversation acked (sequencer.ErrHeadRegressed): the caller logs it
	// loudly and counts it. The core refuses every send from then on.
	Regressed error
}

// Empty reports whether r has nothing to do.
func (r *Ready) Empty() bool {
	return !r.LoadHead && len(r.Targets) == 0 && r.Form == 0 && r.Commit == nil && r.Resolve == nil && len(r.Lookup) == 0 && len(r.Replies) == 0 && r.Regressed == nil
}

// LookupResult is the answer to one key of Ready.Lookup: the stored message
// or an error (sequencer.ErrNotFound when the key is free). Results are
// matched to entries by Key, in any order.
type LookupResult struct {
	Key sequencer.ClientKey
	Msg sequencer.Message
	Err error
}

// TargetResult answers one msg_id of Ready.Targets: the stored message or
// an error (sequencer.ErrNotFound when there is none). Results are matched
// to msg_ids by Msg.MsgID or MsgID, in any order.
type TargetResult struct {
	MsgID uint64
	Msg   sequencer.Message
	Err   error
}

// Formation answers Ready.Form.
type Formation struct {
	// FenceErr: the node may not write this conversation now (not owner,
	// moving): every queued send fails with it (nothing was written).
	FenceErr error
	Fence    sequencer.Fence // the fence the commit carries (zero: unfenced)
	// IDs holds up to Form msg_ids; IDErr says why there are fewer (clock
	// moved back, worker lease lost): the sends left without an id fail.
	IDs   []uint64
	IDErr error
	Now   time.Time // server_at of the batch (kept to the millisecond, UTC)
}

type op int

const (
	opNone op = iota
	opLoad
	opForm
	opCommit
	opResolve
	opLookup
	opTargets
)

// waiter is one caller waiting for an entry's outcome.
type waiter struct {
	token    any
	canceled error // the caller gave up (Cancel): why
	resend   bool  // attached to an entry another send created
}

// entry is one row to write: the first send of a resend key and every
// resend of it that arrived while it was queued or in flight.
type entry struct {
	req     sequencer.SendRequest
	waiters []waiter          // first holds the first one: one allocation per send
	first   [1]waiter         // backing array of waiters until a resend attaches
	msg     sequencer.Message // assigned ids while in flight
	lookup  bool              // in flight: its key hit uk_from_client
	// An edit or recall: its target's state once the event is stored, and,
	// when the rules refused it, why (told after its key was looked up: a
	// resend of an event that was stored is a duplicate, not refused).
	after   Target
	refused error
}

// Core is one conversation's single writer. It is not safe for concurrent
// use: one goroutine (the conversation's actor) drives it.
type Core struct {
	cfg Config

	head      uint64 // last committed seq, valid when headKnown
	headKnown bool
	floor     uint64 // highest seq acked on this node: the store's head may never be below it
	regressed error  // set when the store's head fell below floor: refuse everything
	attempt   int    // failed re-reads of the batch being resolved

	op        op
	queue     []*entry             // not yet assigned a seq, in arrival order
	batch     []*entry             // the batch in flight (op commit/resolve/lookup)
	inflight  *sequencer.ConvBatch // its rows
	commitErr error                // the unknown-outcome error being resolved

	// pending holds the queued and in-flight entries by key; nil while
	// empty, so an idle core keeps no map.
	pending map[sequencer.ClientKey]*entry
	held    int // waiters held (all states)
	memo    memo
	// targets remembers the states of the messages this writer committed
	// or read last (the targets of edits and recalls: an event on a recent
	// message needs no read).
	targets targets
	// ev holds what edits and recalls need besides; nil until the
	// conversation's first one.
	ev *eventState

	ready Ready
}

// New returns a core for cfg.ConvID; its head is loaded from the store on
// the first send.
func New(cfg Config) (*Core, error) {
	if cfg.ConvID == "" {
		return nil, errors.New("conv: ConvID is required")
	}
	d := DefaultConfig()
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = d.MaxQueue
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = d.MaxBatch
	}
	if cfg.MemoSize <= 0 {
		cfg.MemoSize = d.MemoSize
	}
	if cfg.TargetCache <= 0 {
		cfg.TargetCache = d.TargetCache
	}
	return &Core{
		targets: targets{size: int32(min(cfg.TargetCache, 1<<20))},
		cfg:     cfg,
		memo:    newMemo(cfg.MemoSize),
		floor:   cfg.Floor,
	}, nil
}

// eventState is what a core keeps for edits and recalls.
type eventState struct {
	refused []*entry          // events the rules refused, to be looked up by key
	loaded  map[uint64]Target // targets read for the next batch (nil: none)
	asked   []uint64          // the msg_ids of the outstanding Ready.Targets
}

// ConvID returns the conversation this core writes.
func (c *Core) ConvID() string { return c.cfg.ConvID }

// Head returns the last committed seq and whether it is known (loaded and
// not in doubt).
func (c *Core) Head() (uint64, bool) { return c.head, c.headKnown }

// Floor returns the highest seq acked by this conversation's writers on this
// node (to hand to the next core as Config.Floor).
func (c *Core) Floor() uint64 { return c.floor }

// Held returns the number of sends the core holds (queued or in flight).
func (c *Core) Held() int { return c.held }

// Idle reports whether the core holds nothing: no send queued or in flight,
// no store operation outstanding and no reply undelivered. Only an idle core
// may be passivated; its state is rebuilt from the store on the next send.
func (c *Core) Idle() bool {
	return c.op == opNone && c.held == 0 && len(c.queue) == 0 && c.ready.Empty()
}

// Ready returns the effects accumulated since the last call and clears
// them. The caller must execute all of them.
func (c *Core) Ready() Ready {
	rd := c.ready
	c.ready = Ready{}
	if c.op == opForm {
		// Everything queued by now goes in the batch (up to MaxBatch).
		rd.Form = min(len(c.queue), c.cfg.MaxBatch)
	}
	return rd
}

// Send queues req (already validated, req.ConvID == the core's). token is
// handed back in the Reply; it must be comparable (Cancel finds it by ==).
func (c *Core) Send(token any, req sequencer.SendRequest) {
	if req.ConvID != c.cfg.ConvID {
		c.reply(token, sequencer.SendResult{}, sequencer.Errorf(sequencer.CodeInternal,
			"conv %q: send for conversation %q routed here", c.cfg.ConvID, req.ConvID))
		return
	}
	if c.regressed != nil {
		c.reply(token, sequencer.SendResult{}, c.regressed)
		return
	}
	key := req.Key()
	if res, fp, ok := c.memo.get(key); ok {
		if fp != fingerprint(&req) {
			c.reply(token, sequencer.SendResult{}, errDifferentContent)
			return
		}
		res.Duplicate = true
		c.reply(token, res, nil)
		return
	}
	if c.held >= c.cfg.MaxQueue {
		c.reply(token, sequencer.SendResult{}, fmt.Errorf("conv %q holds %d sends: %w", c.cfg.ConvID, c.held, sequencer.ErrOverloaded))
		return
	}
	c.held++
	if req.Kind != sequencer.KindMessage && c.ev == nil {
		c.ev = &eventState{}
	}
	if e, ok := c.pending[key]; ok {
		if !sameContent(&e.req, &req) {
			c.held--
			c.reply(token, sequencer.SendResult{}, errDifferentContent)
			return
		}
		// A resend of a key still queued or in flight: answered when the
		// original's row is written (or fails).
		e.waiters = append(e.waiters, waiter{token: token, resend: true})
		return
	}
	e := &entry{req: req, first: [1]waiter{{token: token}}}
	e.waiters = e.first[:]
	if c.pending == nil {
		c.pending = make(map[sequencer.ClientKey]*entry)
	}
	c.pending[key] = e
	c.queue = append(c.queue, e)
	c.advance()
}

// Cancel says that the caller of the send with token (and resend key key)
// gave up, for cause (context.Canceled or context.DeadlineExceeded, or an
// error wrapping one): the caller's shell turns its context's end into this
// input. A send still queued when the core next starts a store operation
// is dropped then, answered canceled or deadline_exceeded, without consuming
// a seq. A send already in a batch gets its outcome (unless the batch is
// put back in the queue); an answered one is unknown to the core and the
// call does nothing.
func (c *Core) Cancel(token any, key sequencer.ClientKey, cause error) {
	e := c.pending[key]
	if e == nil {
		return
	}
	for i := range e.waiters {
		if w := &e.waiters[i]; w.token == token && w.canceled == nil {
			w.canceled = cause
			return
		}
	}
}

// HeadLoaded answers Ready.LoadHead.
func (c *Core) HeadLoaded(head uint64, err error) {
	if c.op != opLoad {
		return
	}
	c.op = opNone
	if err != nil {
		c.failQueue(retryable(err, "load head"))
		return
	}
	if head < c.floor {
		c.regress(head)
		return
	}
	c.head, c.headKnown = head, true
	c.advance()
}

// Committed answers Ready.Commit with the store's error (see persist.Committer).
func (c *Core) Committed(err error) {
	if c.op != opCommit {
		return
	}
	c.op = opNone
	b := c.inflight
	switch {
	case err == nil:
		c.land(b.LastSeq())
	case errors.Is(err, sequencer.ErrUnknownOutcome):
		c.resolve(err)
	case isConflict(err):
		ce, _ := sequencer.AsConflict(err)
		c.onConflict(ce)
	case errors.Is(err, sequencer.ErrHeadMismatch), errors.Is(err, sequencer.ErrStaleEpoch):
		// Nothing was written, but another writer may have moved the head:
		// re-read it before the next batch.
		c.headKnown = false
		c.failBatch(retryable(err, "commit"))
	case sequencer.OutcomeOf(err) == sequencer.OutcomeNotLanded:
		// Nothing was written (store unavailable before COMMIT, or the data
		// refused): the head stays at the last committed seq.
		c.failBatch(retryable(err, "commit"))
	default:
		// Unknown, or an error the store contract does not name: it may
		// have landed.
		c.resolve(err)
	}
	c.advance()
}

// Resolved answers Ready.Resolve: the stored head and the messages after
// Resolve.AfterSeq (or the error of reading them).
func (c *Core) Resolved(head uint64, rows []sequencer.Message, err error) {
	if c.op != opResolve {
		return
	}
	c.op = opNone
	b := c.inflight
	cause := c.commitErr
	c.commitErr = nil
	switch {
	case err != nil:
		// Still unknown: the batch's senders keep waiting (an error answer
		// would be a guess); the sends queued behind it were never sent to
		// the store, so they fail now. Try again after a backoff.
		c.failQueue(retryable(err, "conversation waits for the store to tell a commit's outcome"))
		c.attempt++
		c.commitErr = cause
		c.op = opResolve
		c.ready.Resolve = &Resolve{AfterSeq: b.PrevHead, Count: len(b.Messages), Attempt: c.attempt}
		return
	case head < c.floor:
		c.regress(head)
		return
	case head >= b.LastSeq() && sameRows(rows, b.Messages):
		c.land(head)
	default:
		// Not ours: it did not land (or another writer moved the head).
		// Adopt the stored head; the sends consumed no seq.
		c.head, c.headKnown = head, true
		c.failBatch(retryable(cause, "commit did not land"))
	}
	c.advance()
}

// LookedUp answers Ready.Lookup, one result per key in order.
func (c *Core) LookedUp(results []LookupResult) {
	if c.op != opLookup {
		return
	}
	c.op = opNone
	byKey := make(map[sequencer.ClientKey]LookupResult, len(results))
	for _, r := range results {
		byKey[r.Key] = r
	}
	var retry []*entry
	for _, e := range c.batch {
		if !e.lookup {
			if e.waiters != nil {
				retry = append(retry, e)
			}
			continue
		}
		e.lookup = false
		r, ok := byKey[e.req.Key()]
		if !ok {
			r.Err = sequencer.Errorf(sequencer.CodeUnavailable, "lookup of a resend key got no answer")
		}
		switch {
		case r.Err == nil && r.Msg.ConvID == c.cfg.ConvID && !storedSame(&r.Msg, &e.req):
			c.fail(e, errDifferentContent)
		case r.Err == nil && r.Msg.ConvID == c.cfg.ConvID:
			// Committed by an earlier send (before a restart or beyond the
			// memo): every waiter is a resend.
			res := resultOf(&r.Msg)
			c.memo.put(e.req.Key(), res, fingerprint(&e.req))
			c.answer(e, res, true)
		case r.Err == nil:
			// Used in another conversation: never name it (its id is
			// another user's data).
			c.fail(e, errDifferentContent)
		case errors.Is(r.Err, sequencer.ErrNotFound) && e.refused != nil:
			// A refused event that was never stored: the rules' answer.
			c.fail(e, e.refused)
		case errors.Is(r.Err, sequencer.ErrNotFound):
			// The key is free (the conflicting row did not land): retry it.
			retry = append(retry, e)
		default:
			c.fail(e, retryable(r.Err, "look up resend key"))
		}
	}
	c.batch, c.inflight = nil, nil
	c.requeue(retry)
	c.advance()
}

// advance starts the next store operation if none is outstanding.
func (c *Core) advance() {
	if c.op != opNone {
		return
	}
	c.prune()
	if c.ev != nil && len(c.ev.refused) > 0 {
		// Refused events: a resend of one that was stored is a duplicate.
		c.batch, c.ev.refused = c.ev.refused, nil
		keys := make([]sequencer.ClientKey, len(c.batch))
		for i, e := range c.batch {
			e.lookup = true
			keys[i] = e.req.Key()
		}
		c.op = opLookup
		c.ready.Lookup = keys
		return
	}
	if len(c.queue) == 0 {
		return
	}
	if !c.headKnown {
		// Another writer may have been at work: what this one knew of its
		// messages may be stale.
		c.targets.clear()
		c.op = opLoad
		c.ready.LoadHead = true
		return
	}
	if ids := c.unknownTargets(); len(ids) > 0 {
		c.op = opTargets
		c.ev.asked = ids
		c.ready.Targets = ids
		return
	}
	c.op = opForm
}

// unknownTargets returns the msg_ids of the targets of the events of the
// next batch that the writer does not know yet.
func (c *Core) unknownTargets() []uint64 {
	var ids []uint64
	for _, e := range c.queue[:min(len(c.queue), c.cfg.MaxBatch)] {
		if e.req.Kind == sequencer.KindMessage {
			continue
		}
		if _, ok := c.target(e.req.TargetMsgID, nil); !ok && !slices.Contains(ids, e.req.TargetMsgID) {
			ids = append(ids, e.req.TargetMsgID)
		}
	}
	return ids
}

// TargetsLoaded answers Ready.Targets.
func (c *Core) TargetsLoaded(results []TargetResult) {
	if c.op != opTargets {
		return
	}
	c.op = opNone
	// Added to what was read since the last batch formed (targets of
	// events queued meanwhile are asked for in a second round).
	loaded := c.ev.loaded
	if loaded == nil {
		loaded = make(map[uint64]Target, len(results))
		c.ev.loaded = loaded
	}
	var failed map[uint64]error
	for _, r := range results {
		id := r.MsgID
		if id == 0 {
			id = r.Msg.MsgID
		}
		switch {
		case r.Err == nil && r.Msg.ConvID == c.cfg.ConvID:
			loaded[id] = TargetOf(&r.Msg)
		case r.Err == nil || errors.Is(r.Err, sequencer.ErrNotFound):
			// Not a message of this conversation (another
			// conversation's is never named).
			loaded[id] = Target{MsgID: id}
		default:
			if failed == nil {
				failed = make(map[uint64]error)
			}
			failed[id] = retryable(r.Err, "read the target of an edit or recall")
		}
	}
	// The events whose target was asked for and could not be read fail
	// (retryably; nothing was written). Events queued meanwhile with other
	// targets wait: the batch stops before them, and their targets are
	// asked for next.
	asked := c.ev.asked
	c.ev.asked = nil
	kept := c.queue[:0]
	for _, e := range c.queue {
		if e.req.Kind != sequencer.KindMessage && slices.Contains(asked, e.req.TargetMsgID) {
			if _, ok := c.target(e.req.TargetMsgID, nil); !ok {
				err := failed[e.req.TargetMsgID]
				if err == nil {
					err = sequencer.Errorf(sequencer.CodeUnavailable, "the target of an edit or recall was not read")
				}
				c.fail(e, err)
				continue
			}
		}
		kept = append(kept, e)
	}
	for i := len(kept); i < len(c.queue); i++ {
		c.queue[i] = nil
	}
	c.queue = kept
	c.advance()
}

// target returns what the writer knows of msg_id id: the state the batch
// being formed leaves it in (overlay), else as read for this batch
// (loaded), else as remembered.
func (c *Core) target(id uint64, overlay []Target) (Target, bool) {
	for i := len(overlay) - 1; i >= 0; i-- {
		if overlay[i].MsgID == id {
			return overlay[i], true
		}
	}
	if c.ev != nil {
		if t, ok := c.ev.loaded[id]; ok {
			return t, true
		}
	}
	return c.targets.get(id)
}

// Formed answers Ready.Form: it assigns seqs head+1.. to the queued sends
// that got an id and hands out their commit.
func (c *Core) Formed(f Formation) {
	if c.op != opForm {
		return
	}
	c.op = opNone
	if f.FenceErr != nil {
		c.failQueue(retryable(f.FenceErr, "fence"))
		return
	}
	want := min(len(c.queue), c.cfg.MaxBatch)
	n := min(want, len(f.IDs))
	now := f.Now.Truncate(time.Millisecond).UTC()
	msgs := make([]sequencer.Message, 0, n)
	batch := make([]*entry, 0, n)
	var overlay []Target // the targets' states after this batch's events so far
	taken := 0           // queued entries consumed (in the batch or refused)
	uneditedRecalls := true
	for i, e := range c.queue[:n] {
		if e.req.Kind != sequencer.KindMessage {
			t, ok := c.target(e.req.TargetMsgID, overlay)
			if !ok {
				// Queued after its batch's targets were read: it waits
				// for the next batch (and so does everything after it).
				break
			}
			if err := CheckEvent(&e.req, t, now, c.cfg.Windows); err != nil {
				if slices.ContainsFunc(overlay, func(o Target) bool { return o.MsgID == t.MsgID }) {
					// Refused for an event of this batch (a recall), which
					// may not land: it waits for the batch's outcome (it is
					// judged again in the next batch).
					break
				}
				e.refused = err
				c.ev.refused = append(c.ev.refused, e)
				taken++
				continue
			}
			if e.req.Kind == sequencer.KindRecall && t.EditCount > 0 {
				uneditedRecalls = false
			}
			e.after = t.Apply(&e.req, now)
			overlay = append(overlay, e.after)
		}
		e.msg = sequencer.Message{
			MsgID:       f.IDs[i],
			ConvID:      c.cfg.ConvID,
			Seq:         c.head + 1 + uint64(len(msgs)),
			FromUID:     e.req.FromUID,
			MsgType:     e.req.MsgType,
			Body:        e.req.Body,
			ClientMsgID: e.req.ClientMsgID,
			ServerAt:    now,
			Kind:        e.req.Kind,
			TargetMsgID: e.req.TargetMsgID,
		}
		msgs = append(msgs, e.msg)
		batch = append(batch, e)
		taken++
	}
	if c.ev != nil {
		c.ev.loaded = nil
	}
	for i := range c.queue[:taken] {
		c.queue[i] = nil
	}
	c.queue = c.queue[taken:]
	if taken < n {
		want = n // the rest waits for the next batch; none lacks an id
	}
	if n < want {
		// No id, no seq: fail the sends that got none, and every one still
		// queued.
		idErr := f.IDErr
		if idErr == nil {
			idErr = sequencer.Errorf(sequencer.CodeUnavailable, "%d msg_ids for %d sends", len(f.IDs), want)
		}
		c.failQueue(retryable(idErr, "issue msg_id"))
	}
	if len(c.queue) == 0 {
		c.queue = nil
	}
	if len(batch) == 0 {
		c.advance() // the refused events are looked up
		return
	}
	c.batch = batch
	c.inflight = &sequencer.ConvBatch{ConvID: c.cfg.ConvID, PrevHead: c.head, Fence: f.Fence, Messages: msgs,
		RecallsOfUnedited: uneditedRecalls}
	c.op = opCommit
	c.ready.Commit = c.inflight
}

// land acks the in-flight batch: the head moved to head.
func (c *Core) land(head uint64) {
	c.head, c.headKnown = head, true
	c.floor = max(c.floor, c.inflight.LastSeq())
	for _, e := range c.batch {
		if e.req.Kind != sequencer.KindMessage {
			c.targets.put(e.after)
		} else {
			c.targets.add(TargetOf(&e.msg))
		}
		res := resultOf(&e.msg)
		c.memo.put(e.req.Key(), res, fingerprint(&e.req))
		c.answer(e, res, false)
	}
	c.batch, c.inflight = nil, nil
}

// resolve starts re-reading the truth after a commit of unknown outcome.
func (c *Core) resolve(err error) {
	c.headKnown = false
	c.commitErr = err
	c.attempt = 0
	c.op = opResolve
	c.ready.Resolve = &Resolve{AfterSeq: c.inflight.PrevHead, Count: len(c.inflight.Messages)}
}

// onConflict splits the batch after a *ConflictError: rows whose resend key
// is taken are looked up, rows whose msg_id collided fail, the rest are
// retried with fresh seqs. Nothing was written, so the head is unchanged.
func (c *Core) onConflict(ce *sequencer.ConflictError) {
	byKey := make(map[sequencer.ClientKey]*entry, len(c.batch))
	for _, e := range c.batch {
		byKey[e.req.Key()] = e
	}
	var lookups []sequencer.ClientKey
	blamed := false
	for _, cf := range ce.Conflicts {
		if cf.ConvID != c.cfg.ConvID {
			continue
		}
		e := byKey[sequencer.ClientKey{FromUID: cf.FromUID, ClientMsgID: cf.ClientMsgID}]
		if e == nil {
			e = c.entryByMsgID(cf.MsgID)
		}
		switch cf.Key {
		case sequencer.KeyConvSeq:
			// Someone else wrote seqs of this conversation: same as a head
			// mismatch.
			c.headKnown = false
			c.failBatch(retryable(ce, "commit"))
			return
		case sequencer.KeyClientMsgID:
			if e != nil && !e.lookup && e.waiters != nil {
				e.lookup = true
				lookups = append(lookups, e.req.Key())
				blamed = true
			}
		case sequencer.KeyMsgID:
			if e != nil && e.waiters != nil && !e.lookup {
				c.fail(e, sequencer.Wrap(sequencer.CodeUnavailable, ce, fmt.Sprintf("msg_id %d collided", cf.MsgID)))
				blamed = true
			}
		}
	}
	if !blamed {
		// The store blamed no row of ours: nothing was written; fail
		// retryably rather than loop.
		c.failBatch(retryable(ce, "commit conflict naming no row of "+c.cfg.ConvID))
		return
	}
	if len(lookups) > 0 {
		c.op = opLookup
		c.ready.Lookup = lookups
		return
	}
	var retry []*entry
	for _, e := range c.batch {
		if e.waiters != nil {
			retry = append(retry, e)
		}
	}
	c.batch, c.inflight = nil, nil
	c.requeue(retry)
}

func (c *Core) entryByMsgID(id uint64) *entry {
	for _, e := range c.batch {
		if e.msg.MsgID == id {
			return e
		}
	}
	return nil
}

// requeue puts entries back at the front of the queue, ids cleared.
func (c *Core) requeue(es []*entry) {
	if len(es) == 0 {
		return
	}
	for _, e := range es {
		e.msg = sequencer.Message{}
	}
	c.queue = append(es, c.queue...)
}

// prune drops queued waiters whose caller gave up, and entries left with
// none.
func (c *Core) prune() {
	kept := c.queue[:0]
	for _, e := range c.queue {
		ws := e.waiters[:0]
		for _, w := range e.waiters {
			if w.canceled != nil {
				c.held--
				c.reply(w.token, sequencer.SendResult{}, canceled(w.canceled))
				continue
			}
			ws = append(ws, w)
		}
		e.waiters = ws
		if len(ws) == 0 {
			c.forget(e)
			continue
		}
		// The first live waiter now writes the row: it is not a resend.
		e.waiters[0].resend = false
		kept = append(kept, e)
	}
	for i := len(kept); i < len(c.queue); i++ {
		c.queue[i] = nil
	}
	c.queue = kept
}

// answer replies to every waiter of e with res; allDup marks even the first
// waiter as a resend (the row was written by an earlier send).
func (c *Core) answer(e *entry, res sequencer.SendResult, allDup bool) {
	for _, w := range e.waiters {
		r := res
		r.Duplicate = allDup || w.resend
		c.reply(w.token, r, nil)
	}
	c.release(e)
}

func (c *Core) fail(e *entry, err error) {
	for _, w := range e.waiters {
		c.reply(w.token, sequencer.SendResult{}, err)
	}
	c.release(e)
}

func (c *Core) release(e *entry) {
	c.held -= len(e.waiters)
	e.waiters, e.first = nil, [1]waiter{}
	c.forget(e)
}

// forget removes e from pending, dropping the map once it is empty.
func (c *Core) forget(e *entry) {
	delete(c.pending, e.req.Key())
	if len(c.pending) == 0 {
		c.pending = nil
	}
}

// failBatch fails every send of the in-flight batch.
func (c *Core) failBatch(err error) {
	for _, e := range c.batch {
		if e.waiters != nil {
			c.fail(e, err)
		}
	}
	c.batch, c.inflight = nil, nil
}

// failQueue fails every queued send.
func (c *Core) failQueue(err error) {
	for _, e := range c.queue {
		c.fail(e, err)
	}
	c.queue = nil
}

func (c *Core) reply(token any, res sequencer.SendResult, err error) {
	c.ready.Replies = append(c.ready.Replies, Reply{Token: token, Result: res, Err: err})
}

func resultOf(m *sequencer.Message) sequencer.SendResult {
	return sequencer.SendResult{MsgID: m.MsgID, Seq: m.Seq, ServerAt: m.ServerAt}
}

// sameRows reports whether rows are exactly the batch's messages (same seqs
// and msg_ids): then the batch landed.
func sameRows(rows, msgs []sequencer.Message) bool {
	if len(rows) < len(msgs) {
		return false
	}
	for i := range msgs {
		if rows[i].Seq != msgs[i].Seq || rows[i].MsgID != msgs[i].MsgID {
			return false
		}
	}
	return true
}

func isConflict(err error) bool {
	_, ok := sequencer.AsConflict(err)
	return ok
}

// retryable returns err with context, coded unavailable unless it already
// carries a domain code.
func retryable(err error, what string) error {
	if sequencer.ErrorCode(err) == sequencer.CodeInternal {
		return sequencer.Wrap(sequencer.CodeUnavailable, err, what)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// canceled is the answer to a send dropped because its caller gave up
// (cause, given to Cancel).
func canceled(cause error) error {
	code := sequencer.CodeCanceled
	if errors.Is(cause, context.DeadlineExceeded) {
		code = sequencer.CodeDeadlineExceeded
	}
	return sequencer.Wrap(code, cause, "send dropped before a seq was assigned")
}

// regress refuses every send from now on: the store's head (head) is below
// a seq this node acked (c.floor), so the store lost acknowledged messages
// (for example an asynchronous replica was promoted). Writing on would give
// new messages the seqs of acked ones.
func (c *Core) regress(head uint64) {
	c.regressed = fmt.Errorf("conversation %q: store head %d is below acked seq %d: %w",
		c.cfg.ConvID, head, c.floor, sequencer.ErrHeadRegressed)
	c.headKnown = false
	c.ready.Regressed = c.regressed
	c.failBatch(c.regressed)
	c.failQueue(c.regressed)
}

// errDifferentContent answers a send whose (from_uid, client_msg_id) was
// already used for a different message: another conversation, msg_type or
// body. It names nothing of the other message.
var errDifferentContent error = sequencer.ErrAlreadyExists

// sameContent reports whether two sends of one key carry the same message.
func sameContent(a, b *sequencer.SendRequest) bool {
	return a.ConvID == b.ConvID && a.MsgType == b.MsgType && a.Kind == b.Kind &&
		a.TargetMsgID == b.TargetMsgID && bytes.Equal(a.Body, b.Body)
}

// storedSame reports whether the stored message m is what req sends.
// A message edited or recalled since (an edit event too: a recall of its
// target removes its body) no longer holds the body it was sent with: its
// kind, target and msg_type must match.
func storedSame(m *sequencer.Message, req *sequencer.SendRequest) bool {
	if m.ConvID != req.ConvID || m.MsgType != req.MsgType || m.Kind != req.Kind || m.TargetMsgID != req.TargetMsgID {
		return false
	}
	return m.Recalled || m.EditCount > 0 || bytes.Equal(m.Body, req.Body)
}

// fingerprintSeed keys the memo's content fingerprints (per process).
var fingerprintSeed = maphash.MakeSeed()

// fingerprint is a 64-bit hash of what a resend must repeat (msg_type and
// body; the memo is per conversation): the memo keeps it instead of the body.
func fingerprint(r *sequencer.SendRequest) uint64 {
	var h maphash.Hash
	h.SetSeed(fingerprintSeed)
	h.WriteByte(byte(r.MsgType))
	h.WriteByte(byte(r.MsgType >> 8))
	if r.Kind != sequencer.KindMessage {
		h.WriteByte(byte(r.Kind))
		for i := 0; i < 64; i += 8 {
			h.WriteByte(byte(r.TargetMsgID >> i))
		}
	}
	h.Write(r.Body)
	return h.Sum64()
}

// memo remembers the results of the last size committed resend keys
// (FIFO). It is a ring searched linearly (size is small, 64 by default) and
// grows on demand: an idle conversation that committed one message holds one
// slot, not a map.
type memo struct {
	size int
	ring []memoSlot
	next int // the oldest slot once the ring is full
}

type memoSlot struct {
	key sequencer.ClientKey
	res sequencer.SendResult
	fp  uint64 // fingerprint of the message
}

func newMemo(size int) memo { return memo{size: size} }

func (m *memo) find(k sequencer.ClientKey) int {
	for i := range m.ring {
		if s := &m.ring[i]; s.key.FromUID == k.FromUID && s.key.ClientMsgID == k.ClientMsgID {
			return i
		}
	}
	return -1
}

func (m *memo) get(k sequencer.ClientKey) (sequencer.SendResult, uint64, bool) {
	if i := m.find(k); i >= 0 {
		return m.ring[i].res, m.ring[i].fp, true
	}
	return sequencer.SendResult{}, 0, false
}

func (m *memo) put(k sequencer.ClientKey, r sequencer.SendResult, fp uint64) {
	if i := m.find(k); i >= 0 {
		m.ring[i].res, m.ring[i].fp = r, fp
		return
	}
	if len(m.ring) < m.size {
		m.ring = append(m.ring, memoSlot{key: k, res: r, fp: fp})
		return
	}
	m.ring[m.next] = memoSlot{key: k, res: r, fp: fp}
	m.next = (m.next + 1) % len(m.ring)
}
