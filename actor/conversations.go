// Package actor runs the conversations of one node: one protoactor actor per
// live conversation wraps the single-writer core (package conv), a node
// router (Conversations) finds or spawns the actor by conv_id, and one group-commit
// writer (package commit) merges the batches of all conversations into few
// store transactions.
//
// The package owns admission (node-wide and per-conversation bounds answer
// resource_exhausted at once), passivation of idle conversations and their
// orderly stop on handoff or shutdown. It never decides seqs or dedup (the
// core does), never talks to the store outside the calls the core asks for,
// and never lets a send be lost between the router and an actor that is
// stopping: an actor leaves the router only while no send is on its way to
// it, and only when its core is idle.
package actor

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/commit"
	"github.com/sequencer-im/sequencer/conv"
	"github.com/sequencer-im/sequencer/internal/conf"
	"github.com/sequencer-im/sequencer/internal/ratelog"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
)

// IDSource issues msg_ids (idgen.Generator implements it).
type IDSource interface{ NextID() (uint64, error) }

// Ownership is the cluster's say over this node's writes (cluster.Node
// implements it; SingleNode is the default). Each batch takes its fence
// from Fence when it is formed (the answer of ownership.Core.Writable, the
// one "may this node write" in memory); the store checks that fence in the
// commit's transaction, which is where safety lives. Both methods are called
// from the conversation's actor, never from the commit writer.
type Ownership interface {
	// Fence returns the fence commits of convID must carry, or an error
	// wrapping sequencer.ErrNotOwner / sequencer.ErrOwnershipMoving when the
	// conversation is not writable here.
	Fence(convID string) (persist.Fence, error)
	// Refused is told the fences of a commit the store refused as stale
	// (persist.StaleFenceError): the partition was taken over, and the
	// cluster steps this node down.
	Refused(fences []persist.Fence)
}

// SingleNode is the Ownership of a node without a cluster: it writes every
// conversation with the zero (unfenced) fence. A store that a cluster uses
// refuses such commits (persist.ErrUnfenced).
type SingleNode struct{}

func (SingleNode) Fence(string) (persist.Fence, error) { return persist.Fence{}, nil }
func (SingleNode) Refused([]persist.Fence)             {}

// Config configures a Conversations. Store and IDs are required. DefaultConfig holds
// every default; a zero field in the Config given to NewConversations means its
// default.
type Config struct {
	Store     persist.ConvStore
	IDs       IDSource
	Clock     clock.Clock  // server_at, passivation and re-read backoff; default the real clock
	Metrics   *metrics.Set // optional
	Ownership Ownership    // default SingleNode (unfenced)
	Logger    *slog.Logger // optional

	PassivateAfter  time.Duration // idle conversation actors stop after this
	MaxQueuePerConv int           // sends one conversation holds at once (each conv.Core's MaxQueue)
	MaxPending      int           // sends the node holds at once
	// Commit holds the group-commit writer's knobs (commit.Config:
	// Workers, MaxMessages, Timeout), under their own names; its Store,
	// Metrics and Logger are this Config's. Commit.MaxMessages also bounds
	// one conversation's batch (conv.Config.MaxBatch), so that a
	// conversation's full batch fits one transaction; Commit.Timeout also
	// bounds the actor's own store calls (head loads, lookups, Settle).
	Commit commit.Config
	// MaxPendingBytes bounds the bytes (pendingSize) of the sends the node
	// holds at once; more are refused with resource_exhausted.
	MaxPendingBytes int64
	// MaxConversations bounds the live conversation actors; a send for a
	// conversation without one is refused with resource_exhausted while
	// the node has that many (idle ones passivate).
	MaxConversations int
	// Feed, when set, is told of every batch the store acknowledged
	// (after Committed, or a re-read that found it landed), in seq order
	// per conversation, from the conversation's actor: the change feed's
	// live source (feed.Hub). It must not block.
	Feed Publisher
	// OutboxPartitions, when > 0, marks every commit for the firehose's
	// outbox (persist.Outbox) under the conversation's ring partition
	// (ring.PartitionOf with this many partitions): the store records in
	// the commit's transaction what the firehose still owes the broker.
	OutboxPartitions int
	// MaxFloors bounds how many passivated conversations' highest acked seqs
	// the node remembers to detect a store that went backwards (about 80
	// bytes each); past it the oldest are forgotten.
	MaxFloors int
	// Windows bound how late after a message's server_at it may be edited
	// or recalled (conv.CheckEvent; zero: no limit).
	Windows conv.Windows
}

// Publisher takes committed messages of one conversation (ascending seqs,
// durably stored); the slice is shared and never changed afterwards.
type Publisher interface {
	Publish(convID string, msgs []sequencer.Message)
}

// DefaultConfig returns every default (Store and IDs are still required).
// The group commit's come from commit.DefaultConfig, the per-conversation
// queue's from conv.DefaultConfig.
func DefaultConfig() Config {
	w, cv := commit.DefaultConfig(), conv.DefaultConfig()
	return Config{
		PassivateAfter:   30 * time.Second,
		MaxQueuePerConv:  cv.MaxQueue,
		MaxPending:       65536,
		Commit:           w,
		MaxPendingBytes:  256 << 20,
		MaxConversations: 1_000_000,
		MaxFloors:        100_000,
	}
}

// Validate reports every field that makes no sense, as given (zero counts
// and durations too: NewConversations fills them from DefaultConfig first). The
// group commit's fields are checked by commit.Config.Validate, reported as
// "actor: Commit.Workers" and so on.
func (c Config) Validate() error {
	ch := conf.Checker{Pkg: "actor"}
	conf.PositiveDuration(&ch, "PassivateAfter", c.PassivateAfter)
	conf.Positive(&ch, "MaxQueuePerConv", c.MaxQueuePerConv)
	conf.Positive(&ch, "MaxPending", c.MaxPending)
	conf.Positive(&ch, "MaxPendingBytes", c.MaxPendingBytes)
	conf.Positive(&ch, "MaxConversations", c.MaxConversations)
	conf.Positive(&ch, "MaxFloors", c.MaxFloors)
	for field, w := range map[string]time.Duration{"Windows.Edit": c.Windows.Edit, "Windows.Recall": c.Windows.Recall} {
		if w < 0 {
			ch.Bad(field, w, "must be >= 0 (0: no limit)")
		}
	}
	ch.Add(conf.Nest(c.Commit.Validate(), "actor", "Commit"))
	return ch.Err()
}

const shardCount = 64

// Conversations are the conversation actors of one node: it routes sends
// to them (one actor per conversation), admits them against the node's
// bounds and owns the group-commit writer they share. Safe for concurrent
// use.
type Conversations struct {
	cfg    Config
	log    *slog.Logger
	m      *metrics.Set
	system *pa.ActorSystem
	// dispatcher runs the mailboxes on kept goroutines (dispatcher.go).
	dispatcher *poolDispatcher
	writer     *commit.Writer
	// targets groups the writers' reads of their events' targets (nil: the
	// store reads one message at a time, and each writer does).
	targets *targetReads
	seed    maphash.Seed
	shards  [shardCount]shard

	floors       floors          // highest acked seq of passivated conversations (never backwards)
	logs         *ratelog.Logger // rate-limited warnings
	pending      atomic.Int64    // sends admitted and not yet answered
	pendingBytes atomic.Int64    // their pendingSize, summed
	live         atomic.Int64    // conversation actors in the router
	closed       atomic.Bool

	// Passivation: one sweeper per node (not a timer per actor) posts
	// idleCheckMsg to the actors idle for PassivateAfter.
	started    time.Time // lastActive stamps are nanoseconds since started (monotonic)
	sweepEvery time.Duration
	sweepStop  chan struct{}
	sweepDone  chan struct{}
}

// shard is one slice of the router. Its props are shared by the actors it
// spawns: the producer hands out staged, which spawn sets under mu (protoactor
// calls the producer synchronously inside Spawn).
type shard struct {
	mu     sync.RWMutex
	convs  map[string]*convActor
	closed bool
	props  *pa.Props
	staged *convActor
}

// NewConversations starts the conversations of a node: its actor system and group-commit writer. Zero
// fields of cfg take their DefaultConfig value; a negative one is an error.
func NewConversations(cfg Config) (*Conversations, error) {
	if cfg.Store == nil {
		return nil, errors.New("actor: Config.Store is required")
	}
	if cfg.IDs == nil {
		return nil, errors.New("actor: Config.IDs is required")
	}
	conf.FillZeroNested(&cfg, DefaultConfig())
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Ownership == nil {
		cfg.Ownership = SingleNode{}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	wcfg := cfg.Commit
	wcfg.Store, wcfg.Metrics, wcfg.Logger = cfg.Store, cfg.Metrics, log
	w, err := commit.New(wcfg)
	if err != nil {
		return nil, err
	}
	n := &Conversations{cfg: cfg, log: log, m: cfg.Metrics, writer: w, seed: maphash.MakeSeed(), started: cfg.Clock.Now(),
		floors: newFloors(cfg.MaxFloors), logs: ratelog.New(log, 10*time.Second),
		sweepEvery: sweepInterval(cfg.PassivateAfter), sweepStop: make(chan struct{}), sweepDone: make(chan struct{})}
	if g, ok := cfg.Store.(persist.MessagesGetter); ok {
		n.targets = &targetReads{store: g, timeout: cfg.Commit.Timeout}
	}
	// protoactor logs dead letters and supervision at info; keep warnings.
	n.system = pa.NewActorSystem(pa.WithLoggerFactory(func(*pa.ActorSystem) *slog.Logger {
		return slog.New(warnOnly{log.Handler()}).With("lib", "protoactor")
	}))
	// The lock-free mailbox allocates a few small words per actor and a node
	// per queued message, instead of a ring of 10 slots per actor.
	mailbox := pa.WithMailbox(pa.UnboundedLockfree())
	n.dispatcher = newPoolDispatcher(mailboxWorkers, mailboxQueue, mailboxThroughput, mailboxStall)
	dispatcher := pa.WithDispatcher(n.dispatcher)
	for i := range n.shards {
		sh := &n.shards[i]
		sh.convs = make(map[string]*convActor)
		sh.props = pa.PropsFromProducer(func() pa.Actor {
			a := sh.staged
			sh.staged = nil
			if a == nil {
				// Only a restart after a panic could ask again, and
				// Receive recovers its panics: never reached.
				return orphanActor{}
			}
			return a
		}, mailbox, dispatcher)
	}
	go n.sweep()
	return n, nil
}

// The actors' dispatcher (dispatcher.go): at most mailboxWorkers
// goroutines run mailboxes (their kept stacks are a few hundred KB), over a
// queue of mailboxQueue runs; a run takes up to mailboxThroughput messages
// before it yields (protoactor's default); queued runs that saw no run end
// for mailboxStall get a rescuer.
const (
	mailboxWorkers    = 32
	mailboxQueue      = 1 << 16
	mailboxThroughput = 300
	mailboxStall      = 10 * time.Millisecond
)

// sweepInterval is how often the sweeper looks for idle actors: an eighth of
// PassivateAfter (an actor passivates at most 12.5% late), between 1 ms and
// 5 s.
func sweepInterval(passivateAfter time.Duration) time.Duration {
	return min(max(passivateAfter/8, time.Millisecond), 5*time.Second)
}

// sweep posts idleCheckMsg to every actor idle for PassivateAfter (at most
// one outstanding per actor) until Close.
func (n *Conversations) sweep() {
	defer close(n.sweepDone)
	t, tick := n.cfg.Clock.NewTicker(n.sweepEvery)
	defer t.Stop()
	idle := int64(n.cfg.PassivateAfter)
	for {
		select {
		case <-n.sweepStop:
			return
		case <-tick:
		}
		now := n.now()
		for i := range n.shards {
			sh := &n.shards[i]
			sh.mu.RLock()
			for _, a := range sh.convs {
				if now-a.lastActive.Load() >= idle && a.checkPosted.CompareAndSwap(false, true) {
					n.system.Root.Send(a.pid, idleCheckMsg{})
				}
			}
			sh.mu.RUnlock()
		}
	}
}

// formation answers a conversation core's Ready.Form: the fence of convID
// (ownership first: no id is spent on a batch that may not be written), n
// msg_ids (fewer when the generator fails) and the time.
func (n *Conversations) formation(convID string, count int) conv.Formation {
	fence, err := n.cfg.Ownership.Fence(convID)
	if err != nil {
		return conv.Formation{FenceErr: err}
	}
	f := conv.Formation{Fence: fence, IDs: make([]uint64, 0, count), Now: n.cfg.Clock.Now()}
	for range count {
		id, err := n.cfg.IDs.NextID()
		if err != nil {
			f.IDErr = err
			break
		}
		f.IDs = append(f.IDs, id)
	}
	return f
}

// now returns the node's clock for activity stamps (monotonic on the real
// clock).
func (n *Conversations) now() int64 { return int64(n.cfg.Clock.Since(n.started)) }

// Send stores req (already validated) and answers after the durable commit,
// or with a coded error: resource_exhausted when the node or the
// conversation is full, unavailable when the store, the clock, the worker
// lease or ownership forbids writing, already_exists for a resend key used
// in another conversation, canceled / deadline_exceeded when ctx ends first
// (the send may still be stored: a resend with the same client_msg_id tells).
func (n *Conversations) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	size := pendingSize(&req)
	if err := n.admit(size); err != nil {
		return sequencer.SendResult{}, err
	}
	msg := &sendMsg{req: req, reply: make(chan outcome, 1)}
	ref, err := n.route(req.ConvID)
	if err != nil {
		n.release(size)
		return sequencer.SendResult{}, err
	}
	n.system.Root.Send(ref.pid, msg)
	select {
	case o := <-msg.reply:
		return o.res, o.err
	case <-ctx.Done():
		// The core drops the send if it has no seq yet (told, not asked:
		// it holds no context).
		n.system.Root.Send(ref.pid, &cancelMsg{cause: ctx.Err(), sends: []canceledSend{{msg, req.Key()}}})
		return sequencer.SendResult{}, callerGaveUp(ctx)
	}
}

// canceledSend names a send whose caller gave up: its token in the core and
// its resend key.
type canceledSend struct {
	token any
	key   sequencer.ClientKey
}

// StopConversations stops the actors of the conversations match selects,
// each once its in-flight batch finished and its queue drained (new sends
// are refused by Ownership before this is called, so queued ones fail at
// their fence). It returns when all of them left the router, or ctx ends.
func (n *Conversations) StopConversations(ctx context.Context, match func(convID string) bool) error {
	var refs []*convActor
	for i := range n.shards {
		sh := &n.shards[i]
		sh.mu.Lock()
		for id, ref := range sh.convs {
			if match(id) {
				if ref.gone == nil {
					ref.gone = make(chan struct{})
				}
				refs = append(refs, ref)
			}
		}
		sh.mu.Unlock()
	}
	for _, ref := range refs {
		n.system.Root.Send(ref.pid, stopMsg{})
	}
	for _, ref := range refs {
		select {
		case <-ref.gone:
		case <-ctx.Done():
			return fmt.Errorf("actor: stop conversations: %w", ctx.Err())
		}
	}
	return nil
}

// LiveConversations returns the number of conversation actors.
func (n *Conversations) LiveConversations() int { return int(n.live.Load()) }

// Load is the node's admission state and group-commit backlog (Stats).
type Load struct {
	Pending, MaxPending           int64 // sends admitted and not yet answered; Config.MaxPending
	PendingBytes, MaxPendingBytes int64 // their bytes (bodies and keys); Config.MaxPendingBytes
	CommitQueue                   int   // conversation batches waiting for a store transaction
}

// Stats reads the node's Load (for metrics; cheap: atomics and one lock).
func (n *Conversations) Stats() Load {
	return Load{
		Pending: n.pending.Load(), MaxPending: int64(n.cfg.MaxPending),
		PendingBytes: n.pendingBytes.Load(), MaxPendingBytes: n.cfg.MaxPendingBytes,
		CommitQueue: n.writer.QueueLen(),
	}
}

// Close drains the node: new sends get sequencer.ErrShuttingDown, queued and
// in-flight batches commit or fail cleanly, then actors and writer stop.
func (n *Conversations) Close(ctx context.Context) error {
	if n.closed.Swap(true) {
		return nil
	}
	for i := range n.shards {
		sh := &n.shards[i]
		sh.mu.Lock()
		sh.closed = true
		sh.mu.Unlock()
	}
	close(n.sweepStop)
	<-n.sweepDone
	err := n.StopConversations(ctx, func(string) bool { return true })
	if werr := n.writer.Close(ctx); err == nil {
		err = werr
	}
	n.system.Shutdown()
	n.dispatcher.close()
	return err
}

func (n *Conversations) shard(convID string) *shard {
	return &n.shards[maphash.String(n.seed, convID)%shardCount]
}

// route returns convID's actor, spawning it if needed, with one more send
// counted in transit to it.
func (n *Conversations) route(convID string) (*convActor, error) {
	sh := n.shard(convID)
	sh.mu.RLock()
	if ref := sh.convs[convID]; ref != nil && !sh.closed {
		ref.inTransit.Add(1)
		sh.mu.RUnlock()
		return ref, nil
	}
	sh.mu.RUnlock()

	sh.mu.Lock()
	defer sh.mu.Unlock()
	ref := sh.convs[convID]
	if ref == nil {
		if sh.closed {
			return nil, sequencer.ErrShuttingDown
		}
		if n.live.Load() >= int64(n.cfg.MaxConversations) {
			return nil, fmt.Errorf("node has %d live conversations: %w", n.cfg.MaxConversations, sequencer.ErrOverloaded)
		}
		var err error
		if ref, err = n.spawn(sh, convID); err != nil {
			return nil, err
		}
		sh.convs[convID] = ref
	}
	ref.inTransit.Add(1)
	return ref, nil
}

func (n *Conversations) spawn(sh *shard, convID string) (*convActor, error) {
	core, err := conv.New(conv.Config{ConvID: convID,
		MaxQueue: n.cfg.MaxQueuePerConv, MaxBatch: n.cfg.Commit.MaxMessages, Floor: n.floors.get(convID),
		Windows: n.cfg.Windows})
	if err != nil {
		return nil, sequencer.Wrap(sequencer.CodeInternal, err, "actor: new conversation core")
	}
	a := &convActor{node: n, core: core}
	a.lastActive.Store(n.now())
	sh.staged = a
	a.pid = n.system.Root.Spawn(sh.props)
	sh.staged = nil
	n.live.Add(1)
	if n.m != nil {
		n.m.LiveConvs.Inc()
	}
	return a, nil
}

// leave removes a from the router if no send is on its way to it. The
// actor calls it only when its core is idle; after true it must stop.
func (n *Conversations) leave(a *convActor, passivated bool) bool {
	convID := a.core.ConvID()
	sh := n.shard(convID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if a.inTransit.Load() != 0 {
		return false
	}
	if sh.convs[convID] == a {
		delete(sh.convs, convID)
	}
	n.floors.put(convID, a.core.Floor())
	a.left = true
	n.live.Add(-1)
	if n.m != nil {
		n.m.LiveConvs.Dec()
		if passivated {
			n.m.Passivations.Inc()
		}
	}
	// Last: StopConversations returns once gone is closed, and the actor is
	// then no longer counted.
	if a.gone != nil {
		close(a.gone)
	}
	return true
}

// warnOnly passes records at warning level and above.
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}
func (h warnOnly) WithAttrs(as []slog.Attr) slog.Handler { return warnOnly{h.Handler.WithAttrs(as)} }
func (h warnOnly) WithGroup(g string) slog.Handler       { return warnOnly{h.Handler.WithGroup(g)} }
