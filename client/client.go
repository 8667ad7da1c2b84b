// Package client is the Go SDK that a logic layer embeds to talk to a
// sequencer cluster: Send (stored and acked only after the durable commit,
// resent safely with one client_msg_id), SendMany, Pull (PullPage, PullPages),
// GetHead, GetMessage, Route, MarkRead (Mark) and GetReadState.
//
// It owns the client side of routing and retries. It learns the owner of a
// conversation with Route, caches partition -> owner, and sends straight to
// the owner; when a node is unreachable or answers unavailable it forgets the
// route, backs off with jitter and routes again, falling back to any
// configured node (every node forwards to the owner), like a Kafka producer
// after a leader change. It retries only retryable failures and always with
// the same client_msg_id, so a retry never stores a message twice and never
// consumes a second seq.
//
// Every error it returns carries the domain code: ErrorCode(err) (the same
// as sequencer.ErrorCode) reads it, as a Code this package names too, and
// the *connect.Error of the last attempt (when a node answered) stays in
// the chain for errors.As.
//
// It must never assign seqs or msg_ids, reorder or drop a message, retry a
// failure that is not retryable, or record metrics; it logs at Debug only.
package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// Message is one stored message (the domain type: ids, seq, body, server_at).
type Message = sequencer.Message

// SendRequest is one message to store.
type SendRequest struct {
	ConvID  string // 1..64 bytes, no control characters
	FromUID uint64 // > 0 and < 2^63
	// ClientMsgID is the resend key: a resend with the same (FromUID,
	// ClientMsgID) returns the first send's ids. If empty, Send generates a
	// UUID once per call and keeps it across that call's retries (it is
	// returned in SendResult.ClientMsgID, also on error). To resend across
	// process restarts, generate it yourself (NewClientMsgID) and store it
	// with the outgoing message first.
	ClientMsgID string
	MsgType     int16  // 0 means the default 1; otherwise 1..32767
	Body        []byte // opaque, at most 65,536 bytes by default
}

// SendResult is the stored message's ids.
type SendResult struct {
	MsgID    uint64
	Seq      uint64
	ServerAt time.Time
	// Duplicate is true when the message was already stored (a resend, or an
	// earlier attempt of this call whose answer was lost): the ids are the
	// first send's and no seq was consumed.
	Duplicate bool
	// ClientMsgID is the resend key used (the caller's, or the generated
	// one). It is set even when Send fails: resending with it later is safe
	// and tells the outcome.
	ClientMsgID string
}

// PullResult is one page of a conversation.
type PullResult struct {
	Messages []Message // seq > afterSeq, ascending, contiguous
	HeadSeq  uint64    // the conversation's highest committed seq
	HasMore  bool      // another Pull after the last returned seq has more
}

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = &sequencer.Error{Code: sequencer.CodeCanceled, Msg: "sequencer client closed"}

// NewClientMsgID returns a fresh resend key (a random UUID).
func NewClientMsgID() string { return uuid.NewString() }

// Client talks to a sequencer cluster. It is safe for concurrent use.
type Client struct {
	cfg       Config
	log       *slog.Logger
	httpc     connect.HTTPClient
	transport *pooledTransport // ours to close; nil when the caller supplied HTTPClient
	opts      []connect.ClientOption
	entries   []*node
	routes    *routeCache
	rr        atomic.Uint64
	closed    atomic.Bool
	// routingOffUntil (unix nanos): the nodes answered Route unimplemented;
	// until then Sends go to the entries, which forward.
	routingOffUntil atomic.Int64

	mu      sync.Mutex
	learned map[string]*node // owners learned from Route, by base URL

	checksMu sync.Mutex
	checks   map[string]*routeCheck // Route calls of watchRoute, by conv_id
}

// maxLearnedNodes bounds the owner addresses a client remembers; past it
// the learned nodes and cached owners are forgotten and learned again.
const maxLearnedNodes = 1024

// routingOffFor is how long a client that met a node without Route sends
// through the entries before asking again.
const routingOffFor = time.Minute

// New returns a client of the nodes in cfg.Addrs. It does not dial: the
// first call connects.
func New(cfg Config) (*Client, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("sequencer client config: %w", err)
	}
	c := &Client{
		cfg:     cfg,
		log:     cfg.Logger,
		httpc:   cfg.HTTPClient,
		opts:    cfg.clientOptions(),
		routes:  newRouteCache(cfg.RouteCacheSize),
		learned: map[string]*node{},
		checks:  map[string]*routeCheck{},
	}
	if c.httpc == nil {
		c.transport = newPooledTransport(cfg.TLSConfig, cfg.Connections)
		c.httpc = &http.Client{Transport: c.transport}
	}
	seen := map[string]bool{}
	for _, a := range cfg.Addrs {
		u, _ := cfg.nodeURL(a) // validated
		if seen[u] {
			continue
		}
		seen[u] = true
		c.entries = append(c.entries, c.newNode(u, true))
	}
	return c, nil
}

func (c *Client) newNode(url string, entry bool) *node {
	n := &node{url: url, entry: entry, rpc: sequencerv1connect.NewSequencerServiceClient(c.httpc, url, c.opts...)}
	if !c.cfg.Batching.Disabled {
		n.batch = newBatcher(n, c.cfg.Batching, c.cfg.Retry.AttemptTimeout, c.sawView)
	}
	return n
}

// Close stops the client: later calls fail with ErrClosed, and the idle
// connections of the default transport are closed. Calls in flight finish.
func (c *Client) Close() error {
	c.closed.Store(true)
	if c.transport != nil {
		c.transport.CloseIdleConnections()
	}
	return nil
}

// Send stores one message and returns its ids once it is durably committed.
// It goes to the conversation's owner (learned with Route, cached) and
// retries retryable failures with the same client_msg_id; if an earlier
// attempt was stored but its answer lost, the result has Duplicate true and
// the first attempt's ids. invalid_argument and already_exists are never
// retried. Concurrent Sends to one node share SendBatch requests (see
// BatchPolicy); each still gets its own result, error and retries.
func (c *Client) Send(ctx context.Context, req SendRequest) (SendResult, error) {
	return c.send(ctx, req, nil)
}

// send is Send; queued (optional) is called once, when the first attempt has
// queued the message (or failed before), so SendMany can keep item order.
func (c *Client) send(ctx context.Context, req SendRequest, queued func()) (SendResult, error) {
	var once sync.Once
	signal := func() {
		if queued != nil {
			once.Do(queued)
		}
	}
	defer signal()
	key := req.ClientMsgID
	if key == "" {
		key = NewClientMsgID()
	}
	res := SendResult{ClientMsgID: key}
	msg := &sequencerv1.SendRequest{
		ConvId:      req.ConvID,
		FromUid:     req.FromUID,
		ClientMsgId: key,
		MsgType:     int32(req.MsgType),
		Body:        req.Body,
	}
	cl := call{op: "send", convID: req.ConvID, send: true, fromUID: req.FromUID, clientMsgID: key}
	err := c.retry(ctx, cl, func(ctx context.Context) (*node, error) {
		target, err := c.sendTarget(ctx, req.ConvID)
		if err != nil {
			return target, err
		}
		ctx, stopWatch := c.watchRoute(ctx, req.ConvID, target)
		defer stopWatch()
		var out *sequencerv1.SendResponse
		if target.batch != nil && !target.batch.unsupported.Load() {
			out, err = target.batch.send(ctx, msg, queued != nil, signal)
		} else {
			signal()
			var resp *connect.Response[sequencerv1.SendResponse]
			if resp, err = target.rpc.Send(ctx, connect.NewRequest(msg)); err == nil {
				out = resp.Msg
				c.sawView(resp.Header())
			}
		}
		if err != nil {
			if errors.Is(context.Cause(ctx), errRouteMoved) {
				err = fmt.Errorf("%w (%w)", errRouteMoved, err)
			}
			return target, err
		}
		res.MsgID = out.GetMsgId()
		res.Seq = out.GetSeq()
		res.Duplicate = out.GetDuplicate()
		if ts := out.GetServerAt(); ts != nil {
			res.ServerAt = ts.AsTime()
		}
		return target, nil
	})
	return res, err
}

// SendMany stores every request independently, as Send would (same routing,
// batching and retries per item), and returns results[i] and errs[i] for
// reqs[i]. The items of one conversation are queued in slice order, so on
// their first attempt they get increasing seqs; an item that is retried may
// land after later items of its conversation.
func (c *Client) SendMany(ctx context.Context, reqs []SendRequest) (results []SendResult, errs []error) {
	results = make([]SendResult, len(reqs))
	errs = make([]error, len(reqs))
	var wg sync.WaitGroup
	prev := make(map[string]chan struct{}) // the previous item of the same conversation has been queued
	for i := range reqs {
		queuedCh := make(chan struct{})
		after := prev[reqs[i].ConvID]
		prev[reqs[i].ConvID] = queuedCh
		wg.Add(1)
		go func() {
			defer wg.Done()
			if after != nil {
				<-after
			}
			results[i], errs[i] = c.send(ctx, reqs[i], func() { close(queuedCh) })
		}()
	}
	wg.Wait()
	return results, errs
}

// PullRequest names a Pull's arguments.
type PullRequest struct {
	ConvID   string
	AfterSeq uint64 // the messages with seq > AfterSeq
	Limit    int    // messages per page: 0 means the server's default 100; above 1000 is clamped to 1000
	// MaxBytes bounds a page's bodies: 0 means the server's 1 MiB, above
	// 4 MiB is clamped to 4 MiB. A page always holds at least one message
	// and stops before the one that would pass the bound (HasMore is set).
	MaxBytes int
}

// Pull returns the messages of convID with seq > afterSeq, ascending, at
// most limit (0 means the server's default 100; above 1000 is clamped to
// 1000). Any node answers it. PullPage takes the same arguments by name
// (and MaxBytes); PullPages iterates over the pages.
func (c *Client) Pull(ctx context.Context, convID string, afterSeq uint64, limit int) (PullResult, error) {
	return c.PullPage(ctx, PullRequest{ConvID: convID, AfterSeq: afterSeq, Limit: limit})
}

// PullPage returns one page of req.ConvID after req.AfterSeq. Any node
// answers it.
func (c *Client) PullPage(ctx context.Context, req PullRequest) (PullResult, error) {
	cl := call{op: "pull", convID: req.ConvID, subject: fmt.Sprintf("conv_id %q after_seq %d", req.ConvID, req.AfterSeq)}
	if req.Limit < 0 || req.MaxBytes < 0 {
		return PullResult{}, sequencer.Errorf(sequencer.CodeInvalidArgument, "%s %s: limit %d, max_bytes %d: must be >= 0", cl.op, cl.subject, req.Limit, req.MaxBytes)
	}
	msg := &sequencerv1.PullRequest{ConvId: req.ConvID, AfterSeq: req.AfterSeq,
		Limit: uint32(min(req.Limit, math.MaxUint32)), MaxBytes: uint32(min(req.MaxBytes, math.MaxUint32))}
	var out PullResult
	err := c.retry(ctx, cl, func(ctx context.Context) (*node, error) {
		target := c.anyNode(nil)
		resp, err := target.rpc.Pull(ctx, connect.NewRequest(msg))
		if err != nil {
			return target, err
		}
		out = PullResult{HeadSeq: resp.Msg.GetHeadSeq(), HasMore: resp.Msg.GetHasMore()}
		out.Messages = make([]Message, len(resp.Msg.GetMessages()))
		for i, m := range resp.Msg.GetMessages() {
			out.Messages[i] = messageFromProto(m)
		}
		return target, nil
	})
	return out, err
}

// PullPages iterates over the pages of req.ConvID from req.AfterSeq on,
// each as PullPage answers it, until a page has HasMore false (the head
// when the iteration started, or later) or a call fails; a failure is the
// last pair yielded. Breaking out of the loop stops it.
//
//	for page, err := range c.PullPages(ctx, client.PullRequest{ConvID: "g:42"}) {
//		if err != nil { ... }
//		for _, m := range page.Messages { ... }
//	}
func (c *Client) PullPages(ctx context.Context, req PullRequest) iter.Seq2[PullResult, error] {
	return func(yield func(PullResult, error) bool) {
		for {
			page, err := c.PullPage(ctx, req)
			if !yield(page, err) || err != nil || !page.HasMore || len(page.Messages) == 0 {
				return
			}
			req.AfterSeq = page.Messages[len(page.Messages)-1].Seq
		}
	}
}

// GetHead returns the highest committed seq of convID (0 if none). Any node
// answers it.
func (c *Client) GetHead(ctx context.Context, convID string) (uint64, error) {
	var head uint64
	err := c.retry(ctx, call{op: "get head", convID: convID, subject: fmt.Sprintf("conv_id %q", convID)},
		func(ctx context.Context) (*node, error) {
			target := c.anyNode(nil)
			resp, err := target.rpc.GetHead(ctx, connect.NewRequest(&sequencerv1.GetHeadRequest{ConvId: convID}))
			if err != nil {
				return target, err
			}
			head = resp.Msg.GetHeadSeq()
			return target, nil
		})
	return head, err
}

// GetMessage returns the message with msgID; an unknown id fails with
// sequencer.CodeNotFound (errors.Is(err, sequencer.ErrNotFound) does not
// hold across the wire: read the code). Any node answers it.
func (c *Client) GetMessage(ctx context.Context, msgID uint64) (Message, error) {
	var m Message
	err := c.retry(ctx, call{op: "get message", subject: "msg_id " + strconv.FormatUint(msgID, 10)},
		func(ctx context.Context) (*node, error) {
			target := c.anyNode(nil)
			resp, err := target.rpc.GetMessage(ctx, connect.NewRequest(&sequencerv1.GetMessageRequest{MsgId: msgID}))
			if err != nil {
				return target, err
			}
			m = messageFromProto(resp.Msg.GetMessage())
			return target, nil
		})
	return m, err
}

// Route asks a node who owns convID now, and remembers the answer for later
// Sends. Any node answers it (by its view of the membership).
func (c *Client) Route(ctx context.Context, convID string) (Route, error) {
	var r Route
	err := c.retry(ctx, call{op: "route", subject: fmt.Sprintf("conv_id %q", convID)},
		func(ctx context.Context) (*node, error) {
			asked := c.anyNode(nil)
			var err error
			r, _, err = c.route(ctx, asked, convID)
			return asked, err
		})
	return r, err
}

// route asks node asked for convID's owner and caches the answer. It returns
// the owner node to send to (nil if the answer named no usable address).
func (c *Client) route(ctx context.Context, asked *node, convID string) (Route, *node, error) {
	resp, err := asked.rpc.Route(ctx, connect.NewRequest(&sequencerv1.RouteRequest{ConvId: convID}))
	if err != nil {
		return Route{}, nil, err
	}
	m := resp.Msg
	r := Route{NodeID: m.GetNodeId(), Address: m.GetAddress(), Partition: m.GetPartition(),
		Epoch: m.GetEpoch(), MembershipVersion: m.GetMembershipVersion()}
	o := owner{node: c.nodeAt(ownerURL(r.Address, asked.url)), nodeID: r.NodeID, epoch: r.Epoch, membershipVersion: r.MembershipVersion}
	cached := c.routes.learn(convID, r.Partition, o)
	c.log.DebugContext(ctx, "sequencer client: route learned", "conv_id", convID, "partition", r.Partition,
		"owner", r.NodeID, "address", r.Address, "epoch", r.Epoch, "membership_version", r.MembershipVersion, "via", asked.url)
	return r, cached, nil
}

// sendTarget picks the node a Send attempt goes to: the cached owner of
// convID; else the owner a Route answer names; else the node that answered
// Route (it forwards); else any reachable entry point. It fails only when Route
// says the request itself is wrong (the Send would fail the same way) or the
// attempt's ctx ended.
func (c *Client) sendTarget(ctx context.Context, convID string) (*node, error) {
	now := time.Now()
	if c.cfg.DisableRouting || now.UnixNano() < c.routingOffUntil.Load() {
		return c.anyNode(nil), nil
	}
	if n, ok := c.routes.lookup(convID); ok && !n.down(now) {
		return n, nil
	}
	asked := c.anyNode(nil)
	_, owner, err := c.route(ctx, asked, convID)
	if err == nil {
		if owner != nil && !owner.down(time.Now()) {
			return owner, nil
		}
		return asked, nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) && connect.IsWireError(err) && ce.Code() == connect.CodeUnimplemented {
		c.routingOffUntil.Store(time.Now().Add(routingOffFor).UnixNano())
		c.log.DebugContext(ctx, "sequencer client: node does not answer Route, sending through entries", "node", asked.url)
		return asked, nil
	}
	f := classify(err, false)
	switch {
	case ctx.Err() != nil:
		return asked, err
	case f.transport:
		c.noteFailure(asked, convID, f)
		return c.anyNode(asked), nil
	case f.code == sequencer.CodeInvalidArgument:
		return asked, err
	default:
		// Route is only a shortcut: the node forwards the Send itself.
		return asked, nil
	}
}

// headerMembershipVersion is the header of a Send or SendBatch answer that
// names the answering node's membership version (cluster mode; api package:
// HeaderMembershipVersion).
const headerMembershipVersion = "Sequencer-Membership-Version"

// sawView notes the membership version a Send or SendBatch answer carries:
// cached owners learned under an older view are asked again (docs/CLIENTS.md
// "Routing").
func (c *Client) sawView(h http.Header) {
	if v, err := strconv.ParseUint(h.Get(headerMembershipVersion), 10, 64); err == nil {
		c.routes.saw(v)
	}
}

// errRouteMoved ends a Send attempt whose conversation's owner, asked again
// while the attempt waited (RetryPolicy.RouteCheck), is another node than
// the one the attempt went to.
var errRouteMoved = errors.New("the conversation's owner is another node than the one this attempt waits on")

// watchRoute guards one Send attempt of convID to target: every RouteCheck
// without an answer it asks another node for the owner (checkRoute: the
// attempts of one conversation share one Route call per RouteCheck), and
// cancels the returned context with errRouteMoved when the owner cached for
// convID is now a reachable node other than target. stop ends the guard.
// Without routing it does nothing.
func (c *Client) watchRoute(ctx context.Context, convID string, target *node) (context.Context, func()) {
	every := c.cfg.Retry.RouteCheck
	if c.cfg.DisableRouting || time.Now().UnixNano() < c.routingOffUntil.Load() || every <= 0 {
		return ctx, func() {}
	}
	wctx, cancel := context.WithCancelCause(ctx)
	var mu sync.Mutex
	stopped := false
	var timer *time.Timer
	var check func()
	check = func() {
		owner := c.checkRoute(wctx, convID, target)
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if owner != nil && owner != target && !owner.down(time.Now()) {
			c.log.DebugContext(ctx, "sequencer client: owner moved while an attempt waited", "conv_id", convID,
				"attempt_node", target.url, "owner", owner.url)
			cancel(errRouteMoved)
			return
		}
		timer = time.AfterFunc(every, check)
	}
	mu.Lock()
	timer = time.AfterFunc(every, check)
	mu.Unlock()
	return wctx, func() {
		mu.Lock()
		stopped = true
		timer.Stop()
		mu.Unlock()
		cancel(nil)
	}
}

// routeCheck is one Route call of watchRoute, shared by the attempts of its
// conversation that ask while it runs or within RouteCheck after it ended.
type routeCheck struct {
	done  chan struct{}
	owner *node // the owner cached after the answer (nil: none, or the call failed)
}

// checkRoute asks a node other than avoid who owns convID now (or shares
// the answer of a call that is running or just ended) and returns the owner
// then cached; nil when unknown or ctx ended.
func (c *Client) checkRoute(ctx context.Context, convID string, avoid *node) *node {
	c.checksMu.Lock()
	rc := c.checks[convID]
	if rc == nil {
		rc = &routeCheck{done: make(chan struct{})}
		c.checks[convID] = rc
		go func() {
			rctx, cancel := context.WithTimeout(context.Background(), c.cfg.Retry.RouteCheck)
			if _, owner, err := c.route(rctx, c.anyNode(avoid), convID); err == nil {
				rc.owner = owner
			}
			cancel()
			close(rc.done)
			time.AfterFunc(c.cfg.Retry.RouteCheck, func() {
				c.checksMu.Lock()
				if c.checks[convID] == rc {
					delete(c.checks, convID)
				}
				c.checksMu.Unlock()
			})
		}()
	}
	c.checksMu.Unlock()
	select {
	case <-rc.done:
		return rc.owner
	case <-ctx.Done():
		return nil
	}
}

// anyNode picks an entry round-robin, skipping avoid and entries that recently
// failed at the transport level; if every entry is down it picks the one that
// comes back soonest.
func (c *Client) anyNode(avoid *node) *node {
	now := time.Now()
	n := len(c.entries)
	start := int(c.rr.Add(1) % uint64(n))
	var fallback *node
	for i := range n {
		s := c.entries[(start+i)%n]
		if s == avoid && n > 1 {
			continue
		}
		if !s.down(now) {
			return s
		}
		if fallback == nil || s.downUntil.Load() < fallback.downUntil.Load() {
			fallback = s
		}
	}
	return fallback
}

// nodeAt returns the node with base URL u (an entry, or a learned owner,
// created on first use); nil for "".
func (c *Client) nodeAt(u string) *node {
	if u == "" {
		return nil
	}
	for _, s := range c.entries {
		if s.url == u {
			return s
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.learned[u]; ok {
		return n
	}
	if len(c.learned) >= maxLearnedNodes {
		clear(c.learned)
		c.routes.reset()
	}
	n := c.newNode(u, false)
	c.learned[u] = n
	return n
}

func messageFromProto(m *sequencerv1.Message) Message {
	out := Message{
		MsgID:       m.GetMsgId(),
		ConvID:      m.GetConvId(),
		Seq:         m.GetSeq(),
		FromUID:     m.GetFromUid(),
		MsgType:     int16(m.GetMsgType()),
		Body:        m.GetBody(),
		ClientMsgID: m.GetClientMsgId(),
		Kind:        sequencer.Kind(m.GetKind()),
		TargetMsgID: m.GetTargetMsgId(),
		Recalled:    m.GetRecalled(),
		EditCount:   m.GetEditCount(),
	}
	if ts := m.GetServerAt(); ts != nil {
		out.ServerAt = ts.AsTime()
	}
	if ts := m.GetEditedAt(); ts != nil {
		out.EditedAt = ts.AsTime()
	}
	return out
}
