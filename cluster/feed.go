package cluster

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/feed"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// The change feed between nodes (the cluster's part of package feed).
//
// Every node keeps ONE Feed stream to every other live member and names on
// it every conversation its own subscribers follow; the node that commits a
// batch (whoever owns the conversation at that moment) sends it on each
// stream that follows the conversation, once per peer, and each peer fans
// it out to its own subscribers. So an owner's cost grows with its peers,
// not with their subscribers, and no re-attach is needed when ownership
// moves: the new owner already has every peer's interest. What a stream can
// lose (a peer that died, a cut link, a peer's queue that overflowed, a
// member that joined and committed before it registered the interest) is
// filled from the store: whenever a stream to a peer ends, and whenever a
// peer acknowledges an interest, the local hub re-reads the store for those
// conversations (feed.Hub.Resync) before its subscribers go on.

// HandleFeed serves a peer's Feed stream from the node's hub (Config.Feed).
func (n *peerServer) handleFeed(ctx context.Context, st *connect.BidiStream[clusterv1.FeedInterest, clusterv1.FeedEvents]) error {
	hub := n.cfg.Feed
	if hub == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this node has no change feed"))
	}
	tap := hub.NewTap()
	defer tap.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer cancel()
		for {
			in, err := st.Receive()
			if err != nil {
				return
			}
			if len(in.GetUnfollow()) > 0 {
				tap.Unfollow(in.GetUnfollow())
			}
			tap.Follow(in.GetFollow(), in.GetAck())
		}
	}()
	for {
		batches, acks, err := tap.Next(ctx)
		if err != nil {
			if errors.Is(err, feed.ErrBehind) {
				return connect.NewError(connect.CodeResourceExhausted, err)
			}
			return nil // the peer went away
		}
		ev := &clusterv1.FeedEvents{Acked: acks, Batches: make([]*clusterv1.FeedBatch, len(batches))}
		for i, b := range batches {
			ev.Batches[i] = &clusterv1.FeedBatch{ConvId: b.ConvID, Messages: feedMessages(b.Msgs), ReadPositions: feedReads(b.Reads)}
		}
		if err := st.Send(ev); err != nil {
			return nil
		}
	}
}

// Feed serves ClusterService.Feed.
func (s *clusterService) Feed(ctx context.Context, st *connect.BidiStream[clusterv1.FeedInterest, clusterv1.FeedEvents]) error {
	n, ok := s.h.(*peerServer)
	if !ok {
		return connect.NewError(connect.CodeUnimplemented, errors.New("no change feed"))
	}
	return n.handleFeed(ctx, st)
}

func feedMessages(ms []sequencer.Message) []*sequencerv1.Message {
	out := make([]*sequencerv1.Message, len(ms))
	for i := range ms {
		m := &ms[i]
		out[i] = &sequencerv1.Message{MsgId: m.MsgID, ConvId: m.ConvID, Seq: m.Seq, FromUid: m.FromUID,
			MsgType: int32(m.MsgType), Body: m.Body, ClientMsgId: m.ClientMsgID, ServerAt: timestamppb.New(m.ServerAt),
			Kind: sequencerv1.MessageKind(m.Kind), TargetMsgId: m.TargetMsgID}
	}
	return out
}

func fromFeedMessages(ms []*sequencerv1.Message) []sequencer.Message {
	out := make([]sequencer.Message, len(ms))
	for i, m := range ms {
		out[i] = sequencer.Message{MsgID: m.GetMsgId(), ConvID: m.GetConvId(), Seq: m.GetSeq(), FromUID: m.GetFromUid(),
			MsgType: int16(m.GetMsgType()), Body: m.GetBody(), ClientMsgID: m.GetClientMsgId(), ServerAt: m.GetServerAt().AsTime(),
			Kind: sequencer.Kind(m.GetKind()), TargetMsgID: m.GetTargetMsgId()}
	}
	return out
}

// feedReads and fromFeedReads carry read ticks (feed.Hub.PublishRead)
// between nodes.
func feedReads(ts []feed.ReadTick) []*sequencerv1.ReadPosition {
	if len(ts) == 0 {
		return nil
	}
	out := make([]*sequencerv1.ReadPosition, len(ts))
	for i, t := range ts {
		out[i] = &sequencerv1.ReadPosition{Uid: t.UID, ReadSeq: t.ReadSeq}
	}
	return out
}

func fromFeedReads(convID string, rs []*sequencerv1.ReadPosition) []feed.ReadTick {
	out := make([]feed.ReadTick, len(rs))
	for i, r := range rs {
		out[i] = feed.ReadTick{ConvID: convID, UID: r.GetUid(), ReadSeq: r.GetReadSeq()}
	}
	return out
}

// PeerFeed is the hub's Upstream in a cluster: one Feed stream to every
// other live member (see the comment at the top of this file). It follows
// the membership through Snapshot and stops when the node's transport
// closes.
type PeerFeed struct {
	n   *Node
	hub *feed.Hub
	ct  *ConnectTransport

	mu      sync.Mutex
	follows map[string]bool
	links   map[string]*peerLink // by incarnation
	nextAck uint64

	up    atomic.Int64  // links whose stream answered and is still open
	ended atomic.Uint64 // streams ended (each then resyncs from the store)
}

// State returns the peer links (one per other live member), how many have
// a stream up (it answered and is open), and how many streams ended since
// the start (each end re-reads the store for what the node follows).
func (p *PeerFeed) State() (links, up int, ended uint64) {
	p.mu.Lock()
	links = len(p.links)
	p.mu.Unlock()
	return links, int(p.up.Load()), p.ended.Load()
}

var _ feed.Upstream = (*PeerFeed)(nil)

// NewPeerFeed starts the node's peer streams for hub and returns the hub's
// Upstream (nil when the node's transport is not connect-go: simulations).
func NewPeerFeed(n *Node, hub *feed.Hub) *PeerFeed {
	ct, ok := n.tr.(*ConnectTransport)
	if !ok {
		return nil
	}
	p := &PeerFeed{n: n, hub: hub, ct: ct, follows: map[string]bool{}, links: map[string]*peerLink{}}
	go p.watch()
	return p
}

// feedWatchEvery is how often the peer set is compared with the
// membership the node holds (in memory).
const feedWatchEvery = 100 * time.Millisecond

// watch opens a link to every new member and closes the links of members
// gone, until the transport closes.
func (p *PeerFeed) watch() {
	t, tick := p.n.clk.NewTicker(feedWatchEvery)
	defer t.Stop()
	for {
		snap := p.n.Snapshot()
		live := map[string]string{}
		for _, m := range snap.Members {
			if m.NodeID != snap.NodeID && m.ClusterAddr != "" {
				live[m.Incarnation] = m.ClusterAddr
			}
		}
		p.mu.Lock()
		for inc, l := range p.links {
			if _, ok := live[inc]; !ok {
				l.cancel()
				delete(p.links, inc)
			}
		}
		for inc, addr := range live {
			if _, ok := p.links[inc]; !ok {
				ctx, cancel := context.WithCancel(p.ct.ctx)
				l := &peerLink{p: p, addr: addr, cancel: cancel, out: make(chan *clusterv1.FeedInterest, 64), acks: map[uint64][]string{}}
				p.links[inc] = l
				go l.run(ctx)
			}
		}
		p.mu.Unlock()
		select {
		case <-tick:
		case <-p.ct.ctx.Done():
			return
		}
	}
}

// Follow implements feed.Upstream: every link names the conversations.
func (p *PeerFeed) Follow(convIDs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range convIDs {
		p.follows[c] = true
	}
	for _, l := range p.links {
		l.send(&clusterv1.FeedInterest{Follow: convIDs})
	}
}

// Unfollow implements feed.Upstream.
func (p *PeerFeed) Unfollow(convIDs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range convIDs {
		delete(p.follows, c)
	}
	for _, l := range p.links {
		l.send(&clusterv1.FeedInterest{Unfollow: convIDs})
	}
}

// feedInterestChunk is the most conversations one FeedInterest names.
const feedInterestChunk = 10_000

// peerLink is the Feed stream to one member incarnation, reopened until the
// member leaves the membership.
type peerLink struct {
	p      *PeerFeed
	addr   string
	cancel context.CancelFunc
	out    chan *clusterv1.FeedInterest // to the stream's sender
	// under p.mu:
	acks map[uint64][]string // ack id -> conversations to re-read then
	stop context.CancelFunc  // ends the stream open now (nil between streams)
}

// send queues an interest change (under p.mu); a full queue reopens the
// stream, which names every follow again.
func (l *peerLink) send(in *clusterv1.FeedInterest) {
	l.p.nextAck++
	in.Ack = l.p.nextAck
	l.acks[in.Ack] = in.Follow
	select {
	case l.out <- in:
	default:
		// Too many changes queued: reopen the stream, whose first
		// interest names every follow.
		if l.stop != nil {
			l.stop()
		}
	}
}

// run keeps one stream open to the peer until ctx ends. Every end of a
// stream re-reads the store for everything followed.
func (l *peerLink) run(ctx context.Context) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		opened := l.p.n.clk.Now()
		l.stream(ctx)
		l.p.ended.Add(1)
		l.p.mu.Lock()
		all := make([]string, 0, len(l.p.follows))
		for c := range l.p.follows {
			all = append(all, c)
		}
		l.p.mu.Unlock()
		l.p.hub.Resync(all)
		if l.p.n.clk.Since(opened) > 5*time.Second {
			backoff = 50 * time.Millisecond
		}
		t, fired := clock.After(l.p.n.clk, backoff)
		select {
		case <-fired:
		case <-ctx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (l *peerLink) stream(ctx context.Context) {
	c, err := l.p.ct.peer(l.addr)
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		l.p.mu.Lock()
		l.stop = nil
		l.p.mu.Unlock()
		cancel()
	}()
	st := c.Feed(ctx)
	defer st.CloseResponse()
	// The first interest names everything followed now; later changes
	// come through out.
	l.p.mu.Lock()
	for len(l.out) > 0 {
		<-l.out
	}
	l.stop = cancel
	clear(l.acks)
	all := make([]string, 0, len(l.p.follows))
	for c := range l.p.follows {
		all = append(all, c)
	}
	// In chunks: a message stays far below the transport's request bound
	// however many conversations the node follows.
	var first []*clusterv1.FeedInterest
	for len(all) > 0 || len(first) == 0 {
		n := min(len(all), feedInterestChunk)
		l.p.nextAck++
		in := &clusterv1.FeedInterest{Follow: all[:n], Ack: l.p.nextAck}
		l.acks[in.Ack] = in.Follow
		first = append(first, in)
		all = all[n:]
	}
	l.p.mu.Unlock()
	go func() {
		defer cancel()
		defer st.CloseRequest()
		for _, in := range first {
			if err := st.Send(in); err != nil {
				return
			}
		}
		for {
			select {
			case in := <-l.out:
				if err := st.Send(in); err != nil {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	for up := false; ; {
		ev, err := st.Receive()
		if err != nil {
			if up {
				l.p.up.Add(-1)
			}
			return
		}
		if !up {
			up = true
			l.p.up.Add(1)
		}
		for _, b := range ev.GetBatches() {
			l.p.hub.Deliver(b.GetConvId(), fromFeedMessages(b.GetMessages()))
			if rs := b.GetReadPositions(); len(rs) > 0 {
				l.p.hub.DeliverRead(fromFeedReads(b.GetConvId(), rs))
			}
		}
		var resync []string
		l.p.mu.Lock()
		for _, a := range ev.GetAcked() {
			resync = append(resync, l.acks[a]...)
			delete(l.acks, a)
		}
		l.p.mu.Unlock()
		if len(resync) > 0 {
			l.p.hub.Resync(resync)
		}
	}
}
