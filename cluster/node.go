// Package cluster is the I/O shell around one node's ownership core
// (package ownership, the pure state machine of its right to write): it
// carries out the core's rounds against the shared membership table (a
// leased member row renewed by heartbeats; fenced partition leases taken and
// released by the rules of package membership; the handoff of partitions
// when the ring moves them), asks the core the one question "may this node
// write" (ownership.Core.Writable, via Fence and Dispatch), and routes sends
// to the owner: local, or through its forwarder (batches over a connect-go
// service between the nodes, mutual TLS or loopback h2c).
//
// Safety never rests on nodes agreeing: a node writes a conversation only
// with a persist.Fence (partition, its incarnation, epoch) that every store
// commit checks, and a partition is taken from another incarnation only when
// that incarnation released it or is no longer a live member, which bumps the
// epoch and fences out the old writer. A node that finds itself presumed dead
// (its member row gone) or fenced steps down: it drops every partition, stops
// their conversations and rejoins as a new incarnation.
//
// This package never assigns seqs or msg_ids, never writes messages, never
// decides ownership from anything but the shared table and the ring, and
// never answers "may this node write" other than through the core.
package cluster

import (
	"context"
	"fmt"

	"golang.org/x/time/rate"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/buildinfo"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ownership"
)

// Local is this node's conversation writer (*actor.Conversations satisfies it).
type Local interface {
	// Send sequences and stores one message of a conversation this node
	// owns (the writer asks Node.Fence for the fence of every commit).
	Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error)
	// SendBatch sends every item of reqs and answers each in out (same
	// length): items of one conversation enter it once, in item order.
	SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome)
	// StopConversations lets the in-flight batches of the matching
	// conversations finish, then stops them (their next send reloads the
	// head from the store).
	StopConversations(ctx context.Context, match func(convID string) bool) error
}

// Node is one member of the cluster: the I/O shell around its ownership core
// (package ownership), made of three jobs, each its own type: the member
// and its rounds (member: join, heartbeat, reconcile, leave; the writer's
// ownership check Fence and Refused), routing (router: Send and SendBatch
// to the owner, every answer read by router.outcome) and the peer server
// (peerServer: forwarded batches, wake-ups, the feed's streams; the
// transport's Handler). Node itself is the API's Sender and Router and the
// process's lifecycle (Start, Serving, Leave, Close); member and router are
// embedded so the package's own code reaches the core as n.core (and Node
// is the writer's actor.Ownership through member's Fence and Refused). Create it with
// New, then Start it with the local writer; stop it with Leave, then Close
// once the API stopped.
type Node struct {
	*member             // the member and its rounds (member.go)
	*router             // sends to their owner: local or forwarded (route.go, forward.go)
	peers   *peerServer // what the other nodes call, the transport's Handler (peer.go, forward.go, feed.go)
}

// New checks cfg and builds a node; nothing runs and nothing listens until
// Start.
func New(cfg Config) (*Node, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cluster config: %w", err)
	}
	core, err := ownership.New(ownership.Config{NodeID: cfg.NodeID, Ring: cfg.Ring, MemberTTL: cfg.MemberTTL},
		membership.Member{APIAddr: cfg.APIAddr, Protocol: ProtocolVersion, Version: buildinfo.Get().Version})
	if err != nil {
		return nil, fmt.Errorf("cluster config: %w", err)
	}
	tr := cfg.Transport
	if tr == nil {
		if tr, err = newConnectTransport(cfg); err != nil {
			return nil, fmt.Errorf("cluster config: %w", err)
		}
	}
	m := newMember(cfg, core, tr)
	r := newRouter(m)
	n := &Node{member: m, router: r, peers: &peerServer{router: r, wakes: map[string]*rate.Limiter{}}}
	m.handler = n.peers
	return n, nil
}

// Start serves the transport, joins the cluster (declaring a predecessor with
// the same node id dead) and starts the heartbeat and the partition
// reconciliation in the background. It returns once this node is a member;
// partitions are taken within a heartbeat or two. local is the writer of the
// conversations this node owns.
func (n *Node) Start(ctx context.Context, local Local) error {
	if err := n.start(ctx, local); err != nil {
		return err
	}
	n.startLoops()
	return nil
}

// Serving reports whether this node can take sends (its part of /readyz):
// started, a live member (heartbeat renewed within MemberTTL) with a known
// ring, not stepping down, superseded or leaving (ownership.Core.Serving).
func (n *Node) Serving() error {
	now := n.clk.Now()
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.core.Serving(now)
}

// DrainRequested is closed when this node's heartbeat finds its own member
// row marked leaving by someone else (`sequencer admin drain`,
// membership.Store.RequestDrain). The node is then out of the ring and hands
// its partitions off by itself; the owner of the process should stop it as
// on SIGTERM (Leave, then Close), which is what package server does.
func (n *Node) DrainRequested() <-chan struct{} { return n.drain }

// Superseded is closed when another live process took this node's id: this
// process has stepped down for good and should exit (non-zero).
func (n *Node) Superseded() <-chan struct{} { return n.supersededCh }

// Leave leaves the cluster gracefully: the node leaves the ring (others
// route to the new owners), hands off every partition (in-flight batches
// finish, then the leases are released) and removes its member row. It
// returns when done or when ctx ends (partitions not released then are taken
// over when the member row expires). After Leave, Send fails with
// sequencer.ErrShuttingDown. The transport stays open for the replies of
// sends forwarded before; Close stops it.
func (n *Node) Leave(ctx context.Context) error { return n.leave(ctx) }

// Close stops the node-to-node transport. Call it after Leave and after the
// API stopped taking requests: sends this node forwarded before it left still
// need the transport to carry their replies back. Forwards still waiting when
// it closes fail with a retryable error.
func (n *Node) Close() error {
	n.fwd.close()
	if err := n.tr.Close(); err != nil {
		return fmt.Errorf("cluster: closing the transport: %w", err)
	}
	return nil
}
