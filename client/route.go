package client

import (
	"container/list"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sequencer-im/sequencer"

	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// Route is the owner of a conversation as a node sees it now (the domain
// type: NodeID, Address "" if the owner advertised none, Partition, Epoch 0
// while not taken yet or unknown, MembershipVersion).
type Route = sequencer.Route

// node is one sequencer node the client talks to: a configured entry point
// (Config.Addrs) or an owner learned from Route.
type node struct {
	url       string
	rpc       sequencerv1connect.SequencerServiceClient
	batch     *batcher // nil when batching is disabled
	entry     bool
	downUntil atomic.Int64 // unix nanos; the node failed at the transport level until then
}

func (n *node) down(now time.Time) bool { return now.UnixNano() < n.downUntil.Load() }

func (n *node) markDown(until time.Time) { n.downUntil.Store(until.UnixNano()) }

// owner is a partition's owner as last learned.
type owner struct {
	node              *node
	nodeID            string
	epoch             uint64
	membershipVersion uint64
}

// newer reports whether o is at least as recent a view as p.
func (o owner) newer(p owner) bool {
	if o.membershipVersion != p.membershipVersion {
		return o.membershipVersion > p.membershipVersion
	}
	return o.epoch >= p.epoch
}

// routeCache remembers conv_id -> partition (bounded, least recently used
// forgotten) and partition -> owner. The partition of a conversation never
// changes in a cluster's life, so only owners are ever invalidated; the
// partition table is bounded by the cluster's partition count.
type routeCache struct {
	// seen is the newest membership version a node named in a Send answer
	// (header Sequencer-Membership-Version): an owner learned under an
	// older view is not used, its conversation asks Route again.
	seen atomic.Uint64

	mu     sync.Mutex
	max    int
	lru    *list.List               // of *convEntry, most recent first
	convs  map[string]*list.Element // conv_id -> element of lru
	owners map[uint32]owner
}

type convEntry struct {
	convID    string
	partition uint32
}

func newRouteCache(max int) *routeCache {
	return &routeCache{max: max, lru: list.New(), convs: map[string]*list.Element{}, owners: map[uint32]owner{}}
}

// saw records the membership version a node answered with.
func (c *routeCache) saw(version uint64) {
	for {
		cur := c.seen.Load()
		if version <= cur || c.seen.CompareAndSwap(cur, version) {
			return
		}
	}
}

// lookup returns the cached owner of convID, unless it was learned under
// an older membership view than one seen since.
func (c *routeCache) lookup(convID string) (*node, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.convs[convID]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(el)
	o, ok := c.owners[el.Value.(*convEntry).partition]
	if !ok || o.node == nil || o.membershipVersion < c.seen.Load() {
		return nil, false
	}
	return o.node, true
}

// learn records a Route answer. An answer from an older membership view
// than the one cached for the partition (a lagging node) does not replace
// it. A nil owner node (no usable address) forgets the partition's owner.
// It returns the owner now cached for the partition, if any.
func (c *routeCache) learn(convID string, partition uint32, o owner) *node {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.max > 0 {
		if el, ok := c.convs[convID]; ok {
			el.Value.(*convEntry).partition = partition
			c.lru.MoveToFront(el)
		} else {
			c.convs[convID] = c.lru.PushFront(&convEntry{convID: convID, partition: partition})
			for c.lru.Len() > c.max {
				last := c.lru.Back()
				c.lru.Remove(last)
				delete(c.convs, last.Value.(*convEntry).convID)
			}
		}
	}
	if cur, ok := c.owners[partition]; ok && !o.newer(cur) {
		return cur.node
	}
	if o.node == nil {
		delete(c.owners, partition)
		return nil
	}
	c.owners[partition] = o
	return o.node
}

// forgetConv drops the cached owner of convID's partition (the owner
// answered unavailable or timed out: ownership may be moving).
func (c *routeCache) forgetConv(convID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.convs[convID]; ok {
		delete(c.owners, el.Value.(*convEntry).partition)
	}
}

// forgetNode drops every partition owned by n (n is unreachable) and
// returns how many.
func (c *routeCache) forgetNode(n *node) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	dropped := 0
	for p, o := range c.owners {
		if o.node == n {
			delete(c.owners, p)
			dropped++
		}
	}
	return dropped
}

// reset forgets every owner (their nodes are being replaced).
func (c *routeCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.owners)
}
