package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sequencer-im/sequencer/client"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// fakeNode is a node of a pretend cluster: it answers Route as the test
// says and stores Sends in memory (seq per node, enough to tell who stored
// what). Until the cluster package runs real multi-node servers, this is
// how the client's routing is shown to follow Route answers that name other
// nodes.
type fakeNode struct {
	sequencerv1connect.UnimplementedSequencerServiceHandler
	addr string

	mu       sync.Mutex
	routeFn  func(convID string) (*sequencerv1.RouteResponse, error) // nil: unimplemented
	sendFn   func(n int) error                                       // n-th send (1-based); nil: accept all
	routes   []string                                                // conv_ids asked
	sendKeys []string                                                // client_msg_ids received
	stored   map[string]uint64                                       // client_msg_id -> seq
	noBatch  bool                                                    // answer SendBatch unimplemented (an older server)
	batchFn  func(items []*sequencerv1.SendRequest)                  // called as a SendBatch arrives; nil: nothing
	view     uint64                                                  // membership version in the answers' header (0: none)
}

func startFake(t *testing.T) *fakeNode {
	t.Helper()
	f := &fakeNode{stored: map[string]uint64{}}
	mux := http.NewServeMux()
	mux.Handle(sequencerv1connect.NewSequencerServiceHandler(f))
	srv := httptest.NewUnstartedServer(mux)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)
	f.addr = srv.Listener.Addr().String()
	return f
}

func (f *fakeNode) setRoute(fn func(convID string) (*sequencerv1.RouteResponse, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routeFn = fn
}

// routeTo makes f answer every Route with owner o at membership version v.
func (f *fakeNode) routeTo(address, nodeID string, v uint64) {
	f.setRoute(func(string) (*sequencerv1.RouteResponse, error) {
		return &sequencerv1.RouteResponse{NodeId: nodeID, Address: address, Partition: 7, Epoch: 3, MembershipVersion: v}, nil
	})
}

func (f *fakeNode) setBatch(fn func(items []*sequencerv1.SendRequest)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batchFn = fn
}

func (f *fakeNode) setSend(fn func(n int) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sendFn = fn
}

func (f *fakeNode) Route(_ context.Context, req *connect.Request[sequencerv1.RouteRequest]) (*connect.Response[sequencerv1.RouteResponse], error) {
	f.mu.Lock()
	f.routes = append(f.routes, req.Msg.GetConvId())
	fn := f.routeFn
	f.mu.Unlock()
	if fn == nil {
		return f.UnimplementedSequencerServiceHandler.Route(context.Background(), req)
	}
	r, err := fn(req.Msg.GetConvId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(r), nil
}

func (f *fakeNode) Send(_ context.Context, req *connect.Request[sequencerv1.SendRequest]) (*connect.Response[sequencerv1.SendResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := req.Msg.GetClientMsgId()
	f.sendKeys = append(f.sendKeys, key)
	if f.sendFn != nil {
		if err := f.sendFn(len(f.sendKeys)); err != nil {
			return nil, err
		}
	}
	seq, dup := f.stored[key]
	if !dup {
		seq = uint64(len(f.stored) + 1)
		f.stored[key] = seq
	}
	resp := connect.NewResponse(&sequencerv1.SendResponse{MsgId: 1000 + seq, Seq: seq, ServerAt: timestamppb.Now(), Duplicate: dup})
	f.viewHeader(resp.Header())
	return resp, nil
}

// viewHeader sets the membership version header as a cluster node does.
func (f *fakeNode) viewHeader(h http.Header) {
	if f.view != 0 {
		h.Set("Sequencer-Membership-Version", fmt.Sprint(f.view))
	}
}

func (f *fakeNode) setView(v uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.view = v
}

// SendBatch answers each item as Send would (an error of the n-th send
// becomes that item's error).
func (f *fakeNode) SendBatch(ctx context.Context, req *connect.Request[sequencerv1.SendBatchRequest]) (*connect.Response[sequencerv1.SendBatchResponse], error) {
	f.mu.Lock()
	old, hook := f.noBatch, f.batchFn
	f.mu.Unlock()
	if old {
		return f.UnimplementedSequencerServiceHandler.SendBatch(ctx, req)
	}
	if hook != nil {
		hook(req.Msg.GetItems())
	}
	out := &sequencerv1.SendBatchResponse{}
	for _, it := range req.Msg.GetItems() {
		resp, err := f.Send(ctx, connect.NewRequest(it))
		if err != nil {
			ce := err.(*connect.Error)
			out.Results = append(out.Results, &sequencerv1.SendResult{Outcome: &sequencerv1.SendResult_Error{
				Error: &sequencerv1.SendError{Code: ce.Code().String(), Message: ce.Message()}}})
			continue
		}
		out.Results = append(out.Results, &sequencerv1.SendResult{Outcome: &sequencerv1.SendResult_Ok{Ok: resp.Msg}})
	}
	r := connect.NewResponse(out)
	f.mu.Lock()
	f.viewHeader(r.Header())
	f.mu.Unlock()
	return r, nil
}

func (f *fakeNode) counts() (routes, sends int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.routes), len(f.sendKeys)
}

func (f *fakeNode) keys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sendKeys)
}

var errMoving = connect.NewError(connect.CodeUnavailable, errors.New("conversation ownership is moving"))

func send(t *testing.T, c *client.Client, conv, key string) client.SendResult {
	t.Helper()
	res, err := c.Send(ctxT(t), client.SendRequest{ConvID: conv, FromUID: 1, ClientMsgID: key, Body: []byte("x")})
	if err != nil {
		t.Fatalf("send %s/%s: %v", conv, key, err)
	}
	return res
}

func TestSendGoesStraightToTheRoutedOwner(t *testing.T) {
	entry, owner := startFake(t), startFake(t)
	entry.routeTo(owner.addr, "owner", 1)
	c := newClient(t, client.Config{Addrs: []string{entry.addr}})

	for _, k := range []string{"k1", "k2", "k3"} {
		send(t, c, "g:1", k)
	}
	if r, s := entry.counts(); r != 1 || s != 0 {
		t.Fatalf("entry saw %d routes, %d sends; want 1 route (then cached), 0 sends", r, s)
	}
	if got := owner.keys(); !slices.Equal(got, []string{"k1", "k2", "k3"}) {
		t.Fatalf("owner got sends %v", got)
	}
	send(t, c, "g:2", "k4")
	if r, _ := entry.counts(); r != 2 {
		t.Fatalf("a new conversation made %d routes in all, want 2", r)
	}
	r, err := c.Route(ctxT(t), "g:3")
	if err != nil || r.Address != owner.addr || r.NodeID != "owner" || r.Partition != 7 || r.Epoch != 3 || r.MembershipVersion != 1 {
		t.Fatalf("Route = %+v, %v", r, err)
	}
}

// The owner answers unavailable (its partition moved): the client forgets
// the route, asks again, and resends the same client_msg_id to the new owner.
func TestOwnerUnavailableReroutesWithSameKey(t *testing.T) {
	entry, old, next := startFake(t), startFake(t), startFake(t)
	entry.routeTo(old.addr, "old", 1)
	c := newClient(t, client.Config{Addrs: []string{entry.addr}})
	send(t, c, "g:1", "k1")

	old.setSend(func(int) error { return errMoving })
	entry.routeTo(next.addr, "next", 2)
	res := send(t, c, "g:1", "k2")
	if res.Seq != 1 || res.Duplicate {
		t.Fatalf("send after the move = %+v, want the new owner's first message", res)
	}
	if got := old.keys(); !slices.Equal(got, []string{"k1", "k2"}) {
		t.Fatalf("old owner got %v, want k1 then the refused k2", got)
	}
	if got := next.keys(); !slices.Equal(got, []string{"k2"}) {
		t.Fatalf("new owner got %v, want the resent k2", got)
	}
	send(t, c, "g:1", "k3")
	if r, _ := entry.counts(); r != 2 {
		t.Fatalf("entry saw %d routes, want 2 (one before, one after the move)", r)
	}
	if got := next.keys(); !slices.Equal(got, []string{"k2", "k3"}) {
		t.Fatalf("new owner got %v, want k2, k3 (route cached again)", got)
	}
}

// The routed owner is unreachable and the entry node still names it: the
// client sends through the entry node, which forwards.
func TestUnreachableOwnerFallsBackToEntry(t *testing.T) {
	entry, dead := startFake(t), deadAddr(t)
	entry.routeTo(dead, "gone", 1)
	rec := newRecorder(t)
	// MaxBackoff is also how long an unreachable node is avoided: long
	// enough here that the second send surely finds the owner still avoided.
	c := newClient(t, client.Config{Addrs: []string{entry.addr}, HTTPClient: &http.Client{Transport: rec},
		Retry: client.RetryPolicy{MaxBackoff: time.Minute}})
	send(t, c, "g:1", "k1")
	send(t, c, "g:1", "k2")
	if got := entry.keys(); !slices.Equal(got, []string{"k1", "k2"}) {
		t.Fatalf("entry got sends %v, want both (the owner is down)", got)
	}
	var hosts []string
	for _, a := range rec.of("Send") {
		hosts = append(hosts, a.host)
	}
	// The first send tries the owner, then goes through the entry; while the
	// owner is marked down the second goes through the entry at once.
	if !slices.Equal(hosts, []string{dead, entry.addr, entry.addr}) {
		t.Fatalf("sends went to %v, want [owner entry entry]", hosts)
	}
}

// A node that listens on all interfaces advertises ":port", "0.0.0.0:port"
// or "[::]:port"; the client reaches it on the host it asked.
func TestRouteToUnspecifiedHost(t *testing.T) {
	entry, owner := startFake(t), startFake(t)
	_, port, _ := net.SplitHostPort(owner.addr)
	for i, addr := range []string{":" + port, "0.0.0.0:" + port, "[::]:" + port} {
		entry.routeTo(addr, "owner", uint64(i+1))
		c := newClient(t, client.Config{Addrs: []string{entry.addr}})
		send(t, c, "g:1", addr)
	}
	if _, s := entry.counts(); s != 0 {
		t.Fatalf("entry got %d sends, want all at the owner", s)
	}
	if n := len(owner.keys()); n != 3 {
		t.Fatalf("owner got %d sends, want 3", n)
	}
}

// Nodes without Route (or a Route that fails retryably) do not stop Sends:
// they go to the entry node, which forwards; an unimplemented Route is not
// asked again for every Send.
func TestSendWithoutRouteGoesThroughEntry(t *testing.T) {
	t.Run("unimplemented", func(t *testing.T) {
		entry := startFake(t)
		c := newClient(t, client.Config{Addrs: []string{entry.addr}})
		send(t, c, "g:1", "k1")
		send(t, c, "g:2", "k2")
		if r, s := entry.counts(); r != 1 || s != 2 {
			t.Fatalf("entry saw %d routes, %d sends; want 1, 2", r, s)
		}
	})
	t.Run("unavailable", func(t *testing.T) {
		entry := startFake(t)
		entry.setRoute(func(string) (*sequencerv1.RouteResponse, error) { return nil, errMoving })
		c := newClient(t, client.Config{Addrs: []string{entry.addr}})
		send(t, c, "g:1", "k1")
		if r, s := entry.counts(); r != 1 || s != 1 {
			t.Fatalf("entry saw %d routes, %d sends; want 1, 1", r, s)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		entry, owner := startFake(t), startFake(t)
		entry.routeTo(owner.addr, "owner", 1)
		c := newClient(t, client.Config{Addrs: []string{entry.addr}, DisableRouting: true})
		send(t, c, "g:1", "k1")
		if r, s := entry.counts(); r != 0 || s != 1 {
			t.Fatalf("entry saw %d routes, %d sends; want 0, 1", r, s)
		}
	})
}

// A resource_exhausted owner is retried (same key) without re-routing.
func TestOverloadedOwnerRetriedInPlace(t *testing.T) {
	entry, owner := startFake(t), startFake(t)
	entry.routeTo(owner.addr, "owner", 1)
	owner.setSend(func(n int) error {
		if n <= 2 {
			return connect.NewError(connect.CodeResourceExhausted, errors.New("overloaded"))
		}
		return nil
	})
	c := newClient(t, client.Config{Addrs: []string{entry.addr}})
	res := send(t, c, "g:1", "")
	if got := owner.keys(); len(got) != 3 || got[0] != res.ClientMsgID || got[1] != got[0] || got[2] != got[0] {
		t.Fatalf("owner got %v, want the generated key %q three times", got, res.ClientMsgID)
	}
	if r, _ := entry.counts(); r != 1 {
		t.Fatalf("entry saw %d routes, want 1", r)
	}
}

// A node without SendBatch (an older server): the client falls back to one
// Send per message for that node, and the message is stored once.
func TestBatchFallsBackToSendOnOlderNode(t *testing.T) {
	f := startFake(t)
	f.mu.Lock()
	f.noBatch = true
	f.mu.Unlock()
	rec := newRecorder(t)
	c := newClient(t, client.Config{Addrs: []string{f.addr}, HTTPClient: &http.Client{Transport: rec}, DisableRouting: true})
	send(t, c, "g:1", "k1")
	send(t, c, "g:1", "k2")
	if got := f.keys(); !slices.Equal(got, []string{"k1", "k2"}) {
		t.Fatalf("node stored %v", got)
	}
	var methods []string
	for _, a := range rec.all() {
		methods = append(methods, a.method)
	}
	// One SendBatch attempt (recorded as "Send") answered unimplemented,
	// then unary Sends only.
	if !slices.Equal(methods, []string{"Send", "Send", "Send"}) {
		t.Fatalf("requests %v", methods)
	}
}

// A Send attempt waits on an owner that does not answer while the
// conversation moved: the client asks Route again while it waits
// (RouteCheck), sees another owner and resends there at once with the same
// client_msg_id, long before its attempt timeout. While the route still
// names the node it waits on, it keeps waiting (no resend).
func TestSlowAttemptFollowsAMovedOwner(t *testing.T) {
	entry, old, next := startFake(t), startFake(t), startFake(t)
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the fakes stop (cleanups run last first)
	entry.routeTo(old.addr, "old", 1)
	c := newClient(t, client.Config{Addrs: []string{entry.addr},
		Retry: client.RetryPolicy{AttemptTimeout: time.Minute, RouteCheck: 20 * time.Millisecond}})
	send(t, c, "g:1", "k1")

	// old stops answering (a blackholed link, a stuck commit); the route
	// still names it: the client keeps waiting, asking Route meanwhile.
	var held sync.WaitGroup
	held.Add(1)
	old.setSend(func(n int) error {
		if n == 2 {
			held.Done()
			<-release
		}
		return nil
	})
	done := make(chan error, 1)
	var res client.SendResult
	go func() {
		var err error
		res, err = c.Send(ctxT(t), client.SendRequest{ConvID: "g:1", FromUID: 1, ClientMsgID: "k2", Body: []byte("x")})
		done <- err
	}()
	held.Wait()
	routes, _ := entry.counts()
	deadline := time.Now().Add(10 * time.Second)
	for r := routes; r < routes+3; r, _ = entry.counts() {
		if time.Now().After(deadline) {
			t.Fatalf("the waiting attempt asked Route %d times, want 3 checks", r-routes)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition
	}
	select {
	case err := <-done:
		t.Fatalf("the send ended while its owner still held it and the route named it: %v", err)
	default:
	}
	if got := next.keys(); len(got) != 0 {
		t.Fatalf("the new owner got %v before the route moved", got)
	}

	// The partition moves: the next check names next, and k2 goes there.
	entry.routeTo(next.addr, "next", 2)
	if err := <-done; err != nil {
		t.Fatalf("send after the owner moved: %v", err)
	}
	if res.Seq != 1 || res.ClientMsgID != "k2" {
		t.Fatalf("send after the owner moved = %+v, want next's first message k2", res)
	}
	if got := next.keys(); !slices.Equal(got, []string{"k2"}) {
		t.Fatalf("new owner got %v, want the resent k2", got)
	}
	free() // the old owner's held Send holds its lock
	if got := old.keys(); !slices.Equal(got, []string{"k1", "k2"}) {
		t.Fatalf("old owner got %v, want k1, then k2 once", got)
	}
}

// The owner cached for a conversation was learned at membership version 1;
// a later Send answer names version 2 (the ring may have moved it, and the
// old owner forwards without telling): the next send of that conversation
// asks Route again and goes to the owner it names now, with or without
// batching.
func TestRoutesOfAnOlderViewAreAskedAgain(t *testing.T) {
	for _, disabled := range []bool{false, true} {
		entry, old, next := startFake(t), startFake(t), startFake(t)
		entry.routeTo(old.addr, "old", 1)
		c := newClient(t, client.Config{Addrs: []string{entry.addr}, Batching: client.BatchPolicy{Disabled: disabled}})
		send(t, c, "g:1", "k1")
		send(t, c, "g:1", "k2") // cached: no Route
		if r, _ := entry.counts(); r != 1 {
			t.Fatalf("batching disabled %v: %d Route calls for one conversation, want 1", disabled, r)
		}
		entry.routeTo(next.addr, "next", 2)
		old.setView(2) // the old owner's answer says the view moved on
		send(t, c, "g:1", "k3")
		send(t, c, "g:1", "k4")
		if got := old.keys(); !slices.Equal(got, []string{"k1", "k2", "k3"}) {
			t.Fatalf("batching disabled %v: old owner got %v, want k1, k2, k3", disabled, got)
		}
		if got := next.keys(); !slices.Equal(got, []string{"k4"}) {
			t.Fatalf("batching disabled %v: new owner got %v, want k4 (routed again after version 2 was seen)", disabled, got)
		}
		send(t, c, "g:1", "k5")
		if r, _ := entry.counts(); r != 2 {
			t.Fatalf("batching disabled %v: %d Route calls, want 2 (the new route is cached)", disabled, r)
		}
	}
}
