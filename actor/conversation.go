package actor

import (
	"context"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/conv"
)

// Messages of a conversation actor.
type (
	sendMsg struct {
		ctx   context.Context
		req   sequencer.SendRequest
		reply chan outcome // buffered 1: the actor never blocks on a caller
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
	lookedUp     struct{ results []conv.LookupResult }
	stopMsg      struct{}
	idleCheckMsg struct{}
)

// convActor feeds one conversation's core and executes its Ready: replies
// to callers, store reads in goroutines, commits through the node's writer.
// Every answer comes back as a message, so the core is only touched here.
type convActor struct {
	node     *Node
	ref      *convRef
	core     *conv.Core
	stopping bool // handoff or shutdown: leave as soon as idle
	left     bool

	// Passivation: protoactor's ReceiveTimeout races with the actor
	// (its timer goroutine writes the context), so the actor keeps its own
	// timer whose callback only posts idleCheckMsg; the timer is re-armed
	// only here, after its message arrived.
	idleTimer  *time.Timer
	lastActive time.Time
}

func (a *convActor) Receive(ctx pa.Context) {
	if a.left {
		return
	}
	switch m := ctx.Message().(type) {
	case *pa.Started:
		self, root := ctx.Self(), a.node.system.Root
		a.lastActive = time.Now()
		a.idleTimer = time.AfterFunc(a.node.cfg.PassivateAfter, func() { root.Send(self, idleCheckMsg{}) })
		return
	case idleCheckMsg:
		idleFor := time.Since(a.lastActive)
		// Passivate only when idle and no send is on its way here.
		if idleFor >= a.node.cfg.PassivateAfter && a.core.Idle() && a.node.leave(a.ref, true) {
			a.stop(ctx)
			return
		}
		a.idleTimer.Reset(max(a.node.cfg.PassivateAfter-idleFor, time.Millisecond))
		return
	case *sendMsg:
		a.ref.inTransit.Add(-1)
		a.core.Send(m.ctx, m, m.req)
	case *headLoaded:
		a.core.HeadLoaded(m.head, m.err)
	case *committed:
		a.core.Committed(m.err)
	case *resolved:
		a.core.Resolved(m.head, m.rows, m.err)
	case *lookedUp:
		a.core.LookedUp(m.results)
	case stopMsg:
		a.stopping = true
	default:
		return
	}
	a.lastActive = time.Now()
	a.execute(ctx)
	if a.stopping && a.core.Idle() && a.node.leave(a.ref, false) {
		a.stop(ctx)
	}
}

// stop ends the actor after it left the router.
func (a *convActor) stop(ctx pa.Context) {
	a.left = true
	a.idleTimer.Stop()
	ctx.Stop(ctx.Self())
}

// execute carries out the core's Ready.
func (a *convActor) execute(ctx pa.Context) {
	rd := a.core.Ready()
	n := a.node
	for _, r := range rd.Replies {
		m := r.Token.(*sendMsg)
		n.pending.Add(-1) // before the reply: a caller that resends at once is not counted twice
		m.reply <- outcome{res: r.Result, err: r.Err}
	}
	self := ctx.Self()
	root := n.system.Root
	convID := a.core.ConvID()
	switch {
	case rd.LoadHead:
		go func() {
			sctx, cancel := context.WithTimeout(context.Background(), n.cfg.CommitTimeout)
			defer cancel()
			head, err := n.cfg.Store.LoadHead(sctx, convID)
			root.Send(self, &headLoaded{head: head, err: err})
		}()
	case rd.Commit != nil:
		n.writer.Submit(*rd.Commit, func(err error) { root.Send(self, &committed{err: err}) })
	case rd.Resolve != nil:
		after, count := rd.Resolve.AfterSeq, rd.Resolve.Count
		go func() {
			sctx, cancel := context.WithTimeout(context.Background(), n.cfg.CommitTimeout)
			defer cancel()
			head, err := n.cfg.Store.LoadHead(sctx, convID)
			var rows []sequencer.Message
			if err == nil {
				rows, err = n.cfg.Store.ReadRange(sctx, convID, after, count)
			}
			root.Send(self, &resolved{head: head, rows: rows, err: err})
		}()
	case len(rd.Lookup) > 0:
		keys := rd.Lookup
		go func() {
			sctx, cancel := context.WithTimeout(context.Background(), n.cfg.CommitTimeout)
			defer cancel()
			results := make([]conv.LookupResult, len(keys))
			for i, k := range keys {
				results[i].Msg, results[i].Err = n.cfg.Store.FindByClientKey(sctx, k)
			}
			root.Send(self, &lookedUp{results: results})
		}()
	}
}
