package actor

import (
	"context"
	"errors"
	"runtime/debug"
	"sync/atomic"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/conv"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/ring"
)

// Messages of a conversation actor.
type (
	sendMsg struct {
		req   sequencer.SendRequest
		reply chan outcome // buffered 1: the actor never blocks on a caller
	}
	// cancelMsg: the callers of these sends gave up (their context ended,
	// for cause): the context's end as an input to the core (conv.Core.Cancel).
	cancelMsg struct {
		cause error
		sends []canceledSend
	}
	outcome struct {
		res sequencer.SendResult
		err error
	}
	headLoaded struct {
		head uint64
		err  error
	}
	committed struct{ err error }
	resolved  struct {
		head uint64
		rows []sequencer.Message
		err  error
	}
	lookedUp      struct{ results []conv.LookupResult }
	targetsLoaded struct{ results []conv.TargetResult }
	stopMsg       struct{}
	idleCheckMsg  struct{}
)

// convActor feeds one conversation's core and executes its Ready: replies
// to callers, store reads in goroutines, commits through the node's writer.
// Every answer comes back as a message, so the core is only touched here.
// It is also the router's entry for the conversation (one allocation per
// live conversation, not two).
type convActor struct {
	node *Conversations
	pid  *pa.PID    // set before the actor enters the router
	core *conv.Core // touched only by the actor (its ConvID by anyone)

	inTransit atomic.Int64 // sends routed to the actor and not yet received
	// Passivation: the node's sweeper reads lastActive (node.now() at the
	// last message handled) and posts idleCheckMsg when it is older than
	// PassivateAfter; checkPosted keeps one such message outstanding.
	// (protoactor's ReceiveTimeout races with the actor: its timer goroutine
	// writes the context.)
	lastActive  atomic.Int64
	checkPosted atomic.Bool

	// Under the shard's lock: left is set once the actor left the router;
	// gone, made by StopConversations when it waits, is closed then.
	left bool
	gone chan struct{}

	stopping bool // handoff or shutdown: leave as soon as idle

	// commitDone is the actor's commit.Done, made once (not a closure per
	// batch).
	commitDone func(err error)
	// committing is the batch handed to the writer, for the feed.
	committing []sequencer.Message
	// resolving is the re-read in flight after an unknown outcome (nil
	// when none): a stop kicks it once (kickResolve). retryNow: the kick
	// cancelled an attempt, so the next one skips its backoff.
	resolving *resolveRun
	kicked    bool
	retryNow  bool
}

// resolveRun is one re-read attempt after an unknown outcome, run beside the
// actor: its backoff wait, then the store calls.
type resolveRun struct {
	kick   chan struct{} // closed: skip the rest of the backoff
	cancel context.CancelFunc
	// started: the backoff is over and the store calls began (set by the
	// attempt's goroutine).
	started atomic.Bool
}

// committedOK is the message of every successful commit (immutable).
var committedOK = &committed{}

func (a *convActor) Receive(ctx pa.Context) {
	if a.left {
		return
	}
	defer a.recoverPanic()
	switch m := ctx.Message().(type) {
	case *pa.Started:
		a.lastActive.Store(a.node.now())
		return
	case idleCheckMsg:
		a.checkPosted.Store(false)
		idleFor := time.Duration(a.node.now() - a.lastActive.Load())
		// Passivate only when idle and no send is on its way here.
		if idleFor >= a.node.cfg.PassivateAfter && a.core.Idle() && a.node.leave(a, true) {
			ctx.Stop(ctx.Self())
		}
		return
	case *sendMsg:
		a.inTransit.Add(-1)
		a.core.Send(m, m.req)
	case *sendGroup:
		a.inTransit.Add(-1)
		for i := range m.reqs {
			a.core.Send(m.items[i], m.reqs[i])
		}
	case *cancelMsg:
		for _, s := range m.sends {
			a.core.Cancel(s.token, s.key, m.cause)
		}
	case *headLoaded:
		a.core.HeadLoaded(m.head, m.err)
	case *committed:
		// A stale fence means the partition was taken over: the cluster
		// must know at once (it steps this node down). Told from here, the
		// actor's loop, never from the commit worker.
		var sf *persist.StaleFenceError
		if errors.As(m.err, &sf) {
			a.node.cfg.Ownership.Refused(sf.Fences)
		}
		if m.err == nil && a.node.cfg.Feed != nil {
			a.node.cfg.Feed.Publish(a.core.ConvID(), a.committing)
		}
		a.committing = nil
		a.core.Committed(m.err)
	case *resolved:
		a.resolving = nil
		// What the re-read found is stored: the feed may have it (a
		// subscriber drops seqs it already has).
		if m.err == nil && a.node.cfg.Feed != nil && len(m.rows) > 0 {
			a.node.cfg.Feed.Publish(a.core.ConvID(), m.rows)
		}
		a.core.Resolved(m.head, m.rows, m.err)
	case *lookedUp:
		a.core.LookedUp(m.results)
	case *targetsLoaded:
		a.core.TargetsLoaded(m.results)
	case stopMsg:
		a.stopping = true
		a.kickResolve()
	default:
		return
	}
	a.lastActive.Store(a.node.now())
	a.execute(ctx)
	if a.stopping && a.core.Idle() && a.node.leave(a, false) {
		ctx.Stop(ctx.Self())
	}
}

// recoverPanic logs a panic of Receive and keeps the actor (with its state),
// as protoactor's restart of the same actor value did: the actors share their
// shard's props, whose producer cannot hand the actor out a second time.
func (a *convActor) recoverPanic() {
	if r := recover(); r != nil {
		a.node.log.Error("conversation actor panicked", "conv_id", a.core.ConvID(), "panic", r,
			"stack", string(debug.Stack()))
	}
}

// kickResolve makes a re-read in flight try again now, once: the rest of
// its backoff is skipped, and an attempt already talking to the store is
// cancelled (its error brings the next attempt at once, see execute). A
// stop comes when the node hands off or steps down, and a step-down comes
// right after the node reached the store again (its heartbeat learned it
// was presumed dead): an attempt begun during the cut may be stuck on a
// dial until the store's connect timeout, and the rejoin waits for this
// conversation to leave.
func (a *convActor) kickResolve() {
	r := a.resolving
	if r == nil || a.kicked {
		return
	}
	a.kicked = true
	close(r.kick)
	if r.started.Load() {
		r.cancel()
		a.retryNow = true
	}
}

// resolveBackoff is the wait before the attempt-th retry of a re-read after
// an unknown outcome: 50 ms doubling, at most 1 s.
func resolveBackoff(attempt int) time.Duration {
	return min(50*time.Millisecond<<min(attempt-1, 5), time.Second)
}

// orphanActor ignores every message (see the shard's producer).
type orphanActor struct{}

func (orphanActor) Receive(pa.Context) {}

// execute carries out the core's Ready.
func (a *convActor) execute(ctx pa.Context) {
	rd := a.core.Ready()
	n := a.node
	for rd.Form > 0 {
		// What the batch needs from the node, handed back at once: the core
		// asks nothing else meanwhile.
		a.core.Formed(n.formation(a.core.ConvID(), rd.Form))
		more := a.core.Ready()
		more.Replies = append(rd.Replies, more.Replies...)
		if more.Regressed == nil {
			more.Regressed = rd.Regressed
		}
		rd = more
	}
	if rd.Regressed != nil {
		n.log.Error("conversation refused: the store lost acknowledged messages (see docs: never backwards)",
			"conv_id", a.core.ConvID(), "err", rd.Regressed)
		if n.m != nil {
			n.m.HeadRegressions.Inc()
		}
	}
	for _, r := range rd.Replies {
		// Uncounted before the reply: a caller that resends at once is not
		// counted twice.
		switch t := r.Token.(type) {
		case *sendMsg:
			n.release(pendingSize(&t.req))
			t.reply <- outcome{res: r.Result, err: r.Err}
		case *batchItem:
			n.release(t.size)
			t.b.answer(t.idx, sequencer.SendOutcome{Result: r.Result, Err: r.Err})
		}
	}
	self := ctx.Self()
	root := n.system.Root
	convID := a.core.ConvID()
	switch {
	case rd.LoadHead:
		go func() {
			sctx, cancel := context.WithTimeout(context.Background(), n.cfg.Commit.Timeout)
			defer cancel()
			head, err := n.cfg.Store.LoadHead(sctx, convID)
			root.Send(self, &headLoaded{head: head, err: err})
		}()
	case rd.Commit != nil:
		if a.commitDone == nil {
			a.commitDone = func(err error) {
				if err == nil {
					root.Send(self, committedOK)
					return
				}
				root.Send(self, &committed{err: err})
			}
		}
		a.committing = rd.Commit.Messages
		b := *rd.Commit
		if n.cfg.OutboxPartitions > 0 {
			b.Outbox = persist.OutboxMark{On: true, Partition: ring.PartitionOf(convID, n.cfg.OutboxPartitions)}
		}
		n.writer.Submit(b, a.commitDone)
	case rd.Resolve != nil:
		after, count, attempt := rd.Resolve.AfterSeq, rd.Resolve.Count, rd.Resolve.Attempt
		// After a kick that cancelled an attempt, the next one goes at
		// once; otherwise the backoff (which a kick ends early).
		wait := attempt > 0 && !a.retryNow
		a.retryNow = false
		rctx, rcancel := context.WithCancel(context.Background())
		run := &resolveRun{kick: make(chan struct{}), cancel: rcancel}
		a.resolving = run
		go func() {
			defer rcancel()
			if wait {
				t, fired := n.cfg.Clock.NewTimer(resolveBackoff(attempt))
				select {
				case <-fired:
				case <-run.kick:
				}
				t.Stop()
			}
			run.started.Store(true)
			sctx, cancel := context.WithTimeout(rctx, n.cfg.Commit.Timeout)
			defer cancel()
			// The old transaction must be finished before the re-read, or
			// the answer could be a guess (persist.Store.Settle; only this
			// conversation's when the store can tell them apart).
			var err error
			if cs, ok := n.cfg.Store.(persist.ConvSettler); ok {
				err = cs.SettleConvs(sctx, []string{convID})
			} else {
				err = n.cfg.Store.Settle(sctx)
			}
			var head uint64
			var rows []sequencer.Message
			if err == nil {
				head, err = n.cfg.Store.LoadHead(sctx, convID)
			}
			if err == nil {
				rows, err = n.cfg.Store.ReadRange(sctx, convID, after, count)
			}
			if err != nil && rctx.Err() == nil { // a kicked attempt is tried again at once, not worth a WARN
				n.logs.Warn("store", "a commit's outcome is still unknown; its senders wait", "conv_id", convID, "attempt", attempt+1, "err", err)
			}
			root.Send(self, &resolved{head: head, rows: rows, err: err})
		}()
	case len(rd.Targets) > 0:
		ids := rd.Targets
		go func() {
			sctx, cancel := context.WithTimeout(context.Background(), n.cfg.Commit.Timeout)
			defer cancel()
			var results []conv.TargetResult
			if n.targets != nil {
				results = n.targets.read(sctx, ids) // with the other writers' reads of the moment
			} else {
				results = make([]conv.TargetResult, len(ids))
				for i, id := range ids {
					results[i].MsgID = id
					results[i].Msg, results[i].Err = n.cfg.Store.GetMessage(sctx, id)
				}
			}
			root.Send(self, &targetsLoaded{results: results})
		}()
	case len(rd.Lookup) > 0:
		keys := rd.Lookup
		go func() {
			sctx, cancel := context.WithTimeout(context.Background(), n.cfg.Commit.Timeout)
			defer cancel()
			results := make([]conv.LookupResult, len(keys))
			scoped, _ := n.cfg.Store.(persist.ConvScopedKeys)
			for i, k := range keys {
				results[i].Key = k
				if scoped != nil && scoped.ClientKeysPerConversation() {
					// Keys are unique per conversation (Citus): look
					// in this one.
					results[i].Msg, results[i].Err = scoped.FindByClientKeyIn(sctx, convID, k)
					continue
				}
				results[i].Msg, results[i].Err = n.cfg.Store.FindByClientKey(sctx, k)
			}
			root.Send(self, &lookedUp{results: results})
		}()
	}
}
