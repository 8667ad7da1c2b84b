// Package firehose publishes every stored message to a broker (NATS
// JetStream; docs/FEED.md): after its commit, at least once, per
// conversation in seq order, none missed across kill -9, handoff or a broker
// outage. The store is the source of truth for what is unpublished: a
// commit records its conversation in the store's outbox (persist.Outbox) in
// the same transaction, and the outbox's published seq moves only after the
// broker acknowledged. The change feed's live batches (actor.Publisher) are
// only a shortcut that spares the store a read.
//
// Core is the pure part (what to publish next, when the cursor may move),
// with no goroutines, clock or I/O; Publisher runs it against a Store and
// a Sink. The package never blocks a send: Live only appends to memory and
// drops what does not fit (the outbox still has it).
package firehose

import (
	"slices"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/ring"
)

// CoreConfig bounds a Core. Zero fields take DefaultCoreConfig's.
type CoreConfig struct {
	Partitions  int // the ring's partition count (required)
	MaxInflight int // publishes and reads in flight at once
	MaxReads    int // store reads in flight at once (a drain must not queue thousands on the store's pool)
	MaxQueued   int // live messages held in memory; past it Live drops (they are read back from the store)
	ReadLimit   int // messages per store read
}

// DefaultCoreConfig returns the defaults.
func DefaultCoreConfig() CoreConfig {
	return CoreConfig{MaxInflight: 4096, MaxReads: 8, MaxQueued: 200_000, ReadLimit: 500}
}

// Kind is what an Action asks the runner to do.
type Kind int

const (
	// Publish: send Msg to partition Part's subject, then call Published.
	Publish Kind = iota + 1
	// Read: read ConvID's stored messages after After (up to Limit), then
	// call Filled.
	Read
)

// Action is one step for the runner. Token identifies it in the answer.
type Action struct {
	Kind   Kind
	Token  uint64
	Part   uint32
	ConvID string
	Msg    sequencer.Message // Publish
	After  uint64            // Read
	Limit  int               // Read
}

// Core decides, for the partitions this node owns, which message of which
// conversation goes to the broker next, and how far each conversation's
// cursor may move. Rules:
//
//   - a conversation has at most one publish in flight, and its seq n+1 is
//     published only after the broker acknowledged seq n: a failed publish
//     can never let a later one land first (conversations of one partition
//     share a subject and are published in parallel: their relative order
//     is free);
//   - nothing of a partition is published before its outbox was scanned
//     (Scanned with done): the scan says where each conversation's backlog
//     starts; a live batch of a conversation without a row starts where the
//     batch starts;
//   - the cursor (persist.OutboxMove) of a conversation moves to seq n
//     only when the broker acknowledged every seq up to n;
//   - a conversation is forgotten once its cursor is stored at its head;
//     its outbox row is kept (the next commit then writes nothing to the
//     outbox) and swept (Sweepable) once no batch of it came for a while.
//
// Not safe for concurrent use: the runner holds a lock around it.
type Core struct {
	cfg      CoreConfig
	parts    map[uint32]*partState
	convs    map[string]*convState
	ready    []*convState
	owed     map[moveKey]uint64    // acknowledged seqs not yet stored
	idle     map[moveKey]time.Time // rows published in full, since when: swept later
	inflight int
	reads    int          // Read actions in flight
	parked   []*convState // conversations waiting for a read slot, in order
	queued   int
	token    uint64
	skipped  uint64 // seqs retention removed before they were published
	gen      uint64 // the last ownership generation given out (Gen)
}

type partState struct {
	gen    uint64 // this holding of the partition (OwnHoldings gives each its own)
	epoch  uint64 // the holding's epoch (Holding)
	synced bool
	convs  map[string]*convState
}

// Holding is a partition this node holds and the epoch of that holding: a
// number that changes whenever the partition is taken again (the lease's
// epoch; 0 without a cluster, where partitions never move).
type Holding struct {
	Partition uint32
	Epoch     uint64
}

type moveKey struct {
	part uint32
	conv string
}

type convState struct {
	id          string
	part        uint32
	stored      uint64 // the outbox's published seq, as last stored (or read)
	next        uint64 // the next seq to publish: every seq below is in the broker
	head        uint64 // the highest seq known committed
	queue       []sequencer.Message
	busy        uint64 // the token of the action in flight, 0 if none
	listed      bool   // in Core.ready
	parked      bool   // in Core.parked
	provisional bool   // created by Live before its partition's scan ended
	behindSince time.Time
}

// NewCore returns a Core owning no partition.
func NewCore(cfg CoreConfig) *Core {
	d := DefaultCoreConfig()
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = d.MaxInflight
	}
	if cfg.MaxReads <= 0 {
		cfg.MaxReads = d.MaxReads
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = d.MaxQueued
	}
	if cfg.ReadLimit <= 0 {
		cfg.ReadLimit = d.ReadLimit
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 1
	}
	return &Core{cfg: cfg, parts: map[uint32]*partState{}, convs: map[string]*convState{}, owed: map[moveKey]uint64{},
		idle: map[moveKey]time.Time{}}
}

// OwnHoldings sets the partitions this node holds. It returns the
// partitions newly owned, a partition held with another epoch than before
// included (it was taken again: another node may have held it meanwhile):
// the runner scans their outbox (ScannedGen). Partitions no longer owned,
// and the earlier holding of one taken again, are dropped at once (their
// acknowledged cursors are still owed: Moves returns them; their rows to
// sweep are left to the new holding's scan); answers to their actions in
// flight are ignored.
func (c *Core) OwnHoldings(hs []Holding) (added []uint32) {
	now := make(map[uint32]bool, len(hs))
	retaken := map[uint32]bool{}
	for _, h := range hs {
		p := h.Partition
		now[p] = true
		if ps := c.parts[p]; ps != nil && ps.epoch != h.Epoch {
			c.drop(p)
			retaken[p] = true
		}
		if c.parts[p] == nil {
			c.gen++
			c.parts[p] = &partState{gen: c.gen, epoch: h.Epoch, convs: map[string]*convState{}}
			added = append(added, p)
		}
	}
	for p := range c.parts {
		if !now[p] {
			c.drop(p)
		}
	}
	for k := range c.idle {
		if !now[k.part] || retaken[k.part] {
			delete(c.idle, k)
		}
	}
	slices.Sort(added)
	return added
}

// drop forgets partition p's holding.
func (c *Core) drop(p uint32) {
	for id, cv := range c.parts[p].convs {
		c.queued -= len(cv.queue)
		delete(c.convs, id)
	}
	delete(c.parts, p)
}

// Owned reports whether partition p is owned.
func (c *Core) Owned(p uint32) bool { return c.parts[p] != nil }

// Gen is the generation of partition p's ownership (0: not owned): every
// time OwnHoldings adds p, or sees it held with a new epoch, it gets a new
// one. A scan of p's outbox is of the generation it began in (ScannedGen):
// a partition dropped and owned again while a scan was reading must be
// scanned again, since the old scan's rows may predate what another owner
// committed meanwhile.
func (c *Core) Gen(p uint32) uint64 {
	if ps := c.parts[p]; ps != nil {
		return ps.gen
	}
	return 0
}

// Live takes a committed batch of one conversation (ascending seqs), as the
// conversation's writer hands it to the change feed.
func (c *Core) Live(convID string, msgs []sequencer.Message) {
	if len(msgs) == 0 {
		return
	}
	p := ring.PartitionOf(convID, c.cfg.Partitions)
	ps := c.parts[p]
	if ps == nil {
		return
	}
	delete(c.idle, moveKey{p, convID}) // written again: its row is kept
	cv := c.convs[convID]
	if cv == nil {
		first := msgs[0].Seq
		cv = &convState{id: convID, part: p, stored: first - 1, next: first, provisional: !ps.synced}
		c.convs[convID] = cv
		ps.convs[convID] = cv
	}
	last := msgs[len(msgs)-1].Seq
	cv.head = max(cv.head, last)
	if cv.behindSince.IsZero() {
		cv.behindSince = msgs[0].ServerAt
	}
	for _, m := range msgs {
		if m.Seq < cv.next || (len(cv.queue) > 0 && m.Seq <= cv.queue[len(cv.queue)-1].Seq) {
			continue
		}
		if c.queued >= c.cfg.MaxQueued {
			break // the store has them: a Read fetches them
		}
		cv.queue = append(cv.queue, m)
		c.queued++
	}
	c.touch(cv)
}

// ScannedGen merges a page of partition p's outbox rows read by a scan begun
// in ownership generation gen (Gen); done says the scan reached its end,
// after which the partition publishes. A page of an earlier generation is
// ignored: had it marked the partition scanned, a conversation it did not
// list (a row written by another owner after the page was read) would
// start at its next live batch and its unpublished backlog before that
// would never be published. A row published in full is to be swept,
// unless its conversation is being published.
func (c *Core) ScannedGen(p uint32, gen uint64, rows []persist.OutboxRow, done bool, now time.Time) {
	ps := c.parts[p]
	if ps == nil || ps.gen != gen {
		return
	}
	for _, r := range rows {
		if r.Partition != p {
			continue
		}
		if r.Head <= r.Published {
			if k := (moveKey{p, r.ConvID}); c.convs[r.ConvID] == nil && c.idle[k].IsZero() {
				c.idle[k] = now
			}
			continue
		}
		cv := c.convs[r.ConvID]
		switch {
		case cv == nil:
			cv = &convState{id: r.ConvID, part: p, stored: r.Published, next: r.Published + 1}
			c.convs[r.ConvID] = cv
			ps.convs[r.ConvID] = cv
		case cv.provisional:
			cv.provisional = false
			cv.stored, cv.next = r.Published, r.Published+1
		default:
			cv.stored = max(cv.stored, r.Published)
			cv.next = max(cv.next, r.Published+1)
		}
		c.dropBelow(cv)
		cv.head = max(cv.head, r.Head)
		if cv.behindSince.IsZero() || now.Before(cv.behindSince) {
			cv.behindSince = now
		}
	}
	if !done {
		return
	}
	ps.synced = true
	for _, cv := range ps.convs {
		cv.provisional = false
		c.touch(cv)
	}
}

// dropBelow removes queued messages below cv.next.
func (c *Core) dropBelow(cv *convState) {
	i := 0
	for i < len(cv.queue) && cv.queue[i].Seq < cv.next {
		i++
	}
	if i > 0 {
		c.queued -= i
		cv.queue = cv.queue[i:]
	}
}

// runnable: the conversation has something to publish or read, and may.
func (c *Core) runnable(cv *convState) bool {
	ps := c.parts[cv.part]
	return ps != nil && ps.synced && cv.busy == 0 && cv.head >= cv.next && c.convs[cv.id] == cv
}

func (c *Core) touch(cv *convState) {
	if !cv.listed && c.runnable(cv) {
		cv.listed = true
		c.ready = append(c.ready, cv)
	}
}

// Next returns the next action, or false when there is none (nothing
// runnable, or MaxInflight actions in flight). A conversation that needs a
// read while MaxReads are in flight waits for one to end (parked).
func (c *Core) Next() (Action, bool) {
	for c.inflight < c.cfg.MaxInflight && (len(c.ready) > 0 || c.unpark()) {
		cv := c.ready[0]
		c.ready[0] = nil
		c.ready = c.ready[1:]
		cv.listed = false
		if !c.runnable(cv) {
			continue
		}
		publish := len(cv.queue) > 0 && cv.queue[0].Seq == cv.next
		if !publish && c.reads >= c.cfg.MaxReads {
			if !cv.parked {
				cv.parked = true
				c.parked = append(c.parked, cv)
			}
			continue
		}
		c.token++
		cv.busy = c.token
		c.inflight++
		if publish {
			return Action{Kind: Publish, Token: c.token, Part: cv.part, ConvID: cv.id, Msg: cv.queue[0]}, true
		}
		c.reads++
		limit := c.cfg.ReadLimit
		if len(cv.queue) > 0 {
			limit = min(limit, int(cv.queue[0].Seq-cv.next))
		}
		return Action{Kind: Read, Token: c.token, Part: cv.part, ConvID: cv.id, After: cv.next - 1, Limit: limit}, true
	}
	return Action{}, false
}

// unpark lists parked conversations, in order, for the read slots free;
// it reports whether it listed any.
func (c *Core) unpark() bool {
	n := 0
	for len(c.parked) > 0 && c.reads+n < c.cfg.MaxReads {
		cv := c.parked[0]
		c.parked[0] = nil
		c.parked = c.parked[1:]
		cv.parked = false
		if c.runnable(cv) && !cv.listed {
			c.touch(cv)
			n++
		}
	}
	return n > 0
}

// answer finds the conversation an action's answer is for (nil: dropped or
// superseded) and ends the action.
func (c *Core) answer(a Action) *convState {
	c.inflight--
	if a.Kind == Read {
		c.reads--
	}
	cv := c.convs[a.ConvID]
	if cv == nil || cv.busy != a.Token {
		return nil
	}
	cv.busy = 0
	return cv
}

// Published answers a Publish: err nil means the broker stored it (or
// dropped it as a duplicate of one it stored). After an error the
// conversation is runnable again (the runner backs off).
func (c *Core) Published(a Action, err error) {
	cv := c.answer(a)
	if cv == nil {
		if err == nil {
			c.owe(a.Part, a.ConvID, a.Msg.Seq)
		}
		return
	}
	if err == nil && a.Msg.Seq == cv.next {
		cv.next++
		c.dropBelow(cv)
		c.owe(cv.part, cv.id, a.Msg.Seq)
		cv.behindSince = time.Time{}
		if cv.head >= cv.next {
			cv.behindSince = a.Msg.ServerAt
			if len(cv.queue) > 0 && cv.queue[0].Seq == cv.next {
				cv.behindSince = cv.queue[0].ServerAt
			}
		}
	}
	c.touch(cv)
}

func (c *Core) owe(p uint32, conv string, seq uint64) {
	k := moveKey{p, conv}
	c.owed[k] = max(c.owed[k], seq)
}

// Filled answers a Read with the stored messages after a.After (ascending).
// Seqs missing at the start were removed by retention before they were
// published: they are skipped (Skipped counts them).
func (c *Core) Filled(a Action, msgs []sequencer.Message, err error) {
	cv := c.answer(a)
	if cv == nil {
		return
	}
	defer c.touch(cv)
	if err != nil {
		return
	}
	i := 0
	for i < len(msgs) && msgs[i].Seq < cv.next {
		i++
	}
	msgs = msgs[i:]
	if len(msgs) == 0 {
		if cv.head >= cv.next {
			// Nothing stored after next-1 up to the known head: retention
			// took it.
			c.skipped += cv.head - cv.next + 1
			cv.next = cv.head + 1
			c.owe(cv.part, cv.id, cv.head)
			c.dropBelow(cv)
		}
		return
	}
	if gap := msgs[0].Seq - cv.next; gap > 0 {
		c.skipped += gap
		cv.next = msgs[0].Seq
		c.owe(cv.part, cv.id, cv.next-1)
		c.dropBelow(cv)
	}
	last := msgs[len(msgs)-1].Seq
	cv.head = max(cv.head, last)
	merged := make([]sequencer.Message, 0, len(msgs)+len(cv.queue))
	merged = append(merged, msgs...)
	dropped := 0
	for _, m := range cv.queue {
		if m.Seq > last {
			merged = append(merged, m)
		} else {
			dropped++
		}
	}
	c.queued += len(merged) - len(cv.queue)
	cv.queue = merged
	if cv.queue[0].Seq == cv.next {
		cv.behindSince = cv.queue[0].ServerAt
	}
}

// Moves returns the cursor moves owed to the store (every acknowledged seq
// not yet stored) and forgets them; the runner gives them back to Advanced.
func (c *Core) Moves() []persist.OutboxMove {
	if len(c.owed) == 0 {
		return nil
	}
	out := make([]persist.OutboxMove, 0, len(c.owed))
	for k, to := range c.owed {
		out = append(out, persist.OutboxMove{Partition: k.part, ConvID: k.conv, To: to})
	}
	clear(c.owed)
	slices.SortFunc(out, func(a, b persist.OutboxMove) int {
		if a.Partition != b.Partition {
			return int(a.Partition) - int(b.Partition)
		}
		return compare(a.ConvID, b.ConvID)
	})
	return out
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Advanced answers Moves: on error they are owed again; on success the
// conversations whose cursor reached their head are forgotten, and their
// rows are to be swept from now on.
func (c *Core) Advanced(moves []persist.OutboxMove, err error, now time.Time) {
	for _, m := range moves {
		if err != nil {
			c.owe(m.Partition, m.ConvID, m.To)
			continue
		}
		cv := c.convs[m.ConvID]
		if cv == nil || cv.part != m.Partition {
			continue
		}
		cv.stored = max(cv.stored, m.To)
		if cv.busy == 0 && len(cv.queue) == 0 && cv.stored >= cv.head && cv.next > cv.head {
			delete(c.convs, cv.id)
			delete(c.parts[cv.part].convs, cv.id)
			c.idle[moveKey{cv.part, cv.id}] = now
		}
	}
}

// Sweepable returns up to limit outbox rows published in full that saw no
// batch since before now-after (the oldest first) and forgets them; the
// runner sweeps them (persist.Outbox.OutboxSweep) and gives them back to
// Swept. A row that is written again in the meantime is not deleted by the
// sweep (its published seq is below the head) or is created again by the
// commit: sweeping too much costs an insert, never a message.
func (c *Core) Sweepable(now time.Time, after time.Duration, limit int) []persist.OutboxKey {
	type aged struct {
		k     moveKey
		since time.Time
	}
	var due []aged
	for k, since := range c.idle {
		if !since.After(now.Add(-after)) {
			due = append(due, aged{k, since})
		}
	}
	slices.SortFunc(due, func(a, b aged) int {
		if d := a.since.Compare(b.since); d != 0 {
			return d
		}
		if a.k.part != b.k.part {
			return int(a.k.part) - int(b.k.part)
		}
		return compare(a.k.conv, b.k.conv)
	})
	if len(due) > limit {
		due = due[:limit]
	}
	out := make([]persist.OutboxKey, len(due))
	for i, d := range due {
		out[i] = persist.OutboxKey{Partition: d.k.part, ConvID: d.k.conv}
		delete(c.idle, d.k)
	}
	return out
}

// Swept answers Sweepable: on error the rows of partitions still owned are
// to be swept again (as of now).
func (c *Core) Swept(keys []persist.OutboxKey, err error, now time.Time) {
	if err == nil {
		return
	}
	for _, k := range keys {
		if mk := (moveKey{k.Partition, k.ConvID}); c.parts[k.Partition] != nil && c.convs[k.ConvID] == nil && c.idle[mk].IsZero() {
			c.idle[mk] = now
		}
	}
}

// Lag is what the node owes the broker, as far as the core knows.
type Lag struct {
	Messages uint64    // committed seqs not yet acknowledged by the broker
	Oldest   time.Time // server_at (or time found) of the oldest of them; zero if none
	Convs    int       // conversations with a backlog
	Queued   int       // live messages held in memory
	Inflight int
	Skipped  uint64 // seqs retention removed before they were published
	Syncing  int    // owned partitions whose outbox scan has not ended
	Idle     int    // outbox rows published in full, not yet swept
}

// Lag returns the backlog over all owned partitions, and per partition
// (messages).
func (c *Core) Lag() (Lag, map[uint32]uint64) {
	l := Lag{Queued: c.queued, Inflight: c.inflight, Skipped: c.skipped, Idle: len(c.idle)}
	per := make(map[uint32]uint64, len(c.parts))
	for p, ps := range c.parts {
		per[p] = 0
		if !ps.synced {
			l.Syncing++
		}
	}
	for _, cv := range c.convs {
		if cv.head < cv.next {
			continue
		}
		n := cv.head - cv.next + 1
		l.Messages += n
		l.Convs++
		per[cv.part] += n
		if !cv.behindSince.IsZero() && (l.Oldest.IsZero() || cv.behindSince.Before(l.Oldest)) {
			l.Oldest = cv.behindSince
		}
	}
	return l, per
}
