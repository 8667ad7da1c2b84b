package cluster

import (
	"sync"

	"golang.org/x/time/rate"

	"github.com/sequencer-im/sequencer/ownership"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// peerServer is the peer server job of a node: what it serves to the other
// nodes (Handler: forwarded batches, wake-ups; and the change feed's
// streams, feed.go). Forwarded items go through the router.
type peerServer struct {
	*router
	wakeMu sync.Mutex
	wakes  map[string]*rate.Limiter // wake-ups accepted, by sender
}

// Wake-ups accepted per sender: a wake makes the node read (and write) the
// membership table, so a peer cannot make it do that more often than this.
const (
	wakeRate  = rate.Limit(5)
	wakeBurst = 10
)

// HandleWake implements Handler: read the table now. Wake-ups are
// rate-limited per sender: a live member (by node id) has its own budget;
// anything else shares one budget per peer address.
func (n *peerServer) HandleWake(peer string, w *clusterv1.WakeRequest) {
	member := read(n.member, func(c *ownership.Core) bool { _, ok := c.View().Member(w.GetFromNode()); return ok })
	key := "addr:" + peer
	if member {
		key = "node:" + w.GetFromNode()
	}
	n.wakeMu.Lock()
	l := n.wakes[key]
	if l == nil {
		if len(n.wakes) >= 1024 {
			clear(n.wakes)
		}
		l = rate.NewLimiter(wakeRate, wakeBurst)
		n.wakes[key] = l
	}
	ok := l.Allow()
	n.wakeMu.Unlock()
	if !ok {
		n.met.wakeDropped()
		return
	}
	n.poke(n.wakeBeat)
}
