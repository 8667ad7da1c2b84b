package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
	"github.com/sequencer-im/sequencer/internal/testwait"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"

	"google.golang.org/protobuf/proto"
)

// countingTransport counts the RPC requests by method.
type countingTransport struct {
	base     http.RoundTripper
	mu       sync.Mutex
	n        map[string]int
	inFlight int // SendBatch requests sent whose response headers have not come back
	most     int
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	m := req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]
	c.mu.Lock()
	c.n[m]++
	c.mu.Unlock()
	if m != "SendBatch" {
		return c.base.RoundTrip(req)
	}
	c.mu.Lock()
	c.inFlight++
	c.most = max(c.most, c.inFlight)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.inFlight--
		c.mu.Unlock()
	}()
	return c.base.RoundTrip(req)
}

// mostInFlight is the most SendBatch requests seen in flight at once (a lower bound
// of the real figure: a request counts until its response headers arrive).
func (c *countingTransport) mostInFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.most
}

func (c *countingTransport) count(m string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[m]
}

// Concurrent Sends to one node share SendBatch requests, each gets its own
// result; an invalid message among them fails alone and is not retried.
func TestConcurrentSendsAreBatched(t *testing.T) {
	ctx := ctxT(t)
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	tr := &countingTransport{base: h2cTransport(), n: map[string]int{}}
	t.Cleanup(tr.base.(*http.Transport).CloseIdleConnections)
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}, HTTPClient: &http.Client{Transport: tr}})

	const senders, each = 64, 20
	var wg sync.WaitGroup
	var bad atomic.Int64
	results := make([][]client.SendResult, senders)
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				req := client.SendRequest{ConvID: fmt.Sprintf("g:%d", s%8), FromUID: uint64(s + 1), ClientMsgID: fmt.Sprintf("s%d-%d", s, i), Body: []byte("x")}
				if s == 3 && i == 7 {
					req.ConvID = "bad\x01conv"
				}
				res, err := c.Send(ctx, req)
				if req.ConvID == "bad\x01conv" {
					if sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
						t.Errorf("invalid item: %v", err)
					}
					bad.Add(1)
					continue
				}
				if err != nil {
					t.Errorf("send %s: %v", req.ClientMsgID, err)
					return
				}
				results[s] = append(results[s], res)
			}
		}()
	}
	wg.Wait()
	seen := map[uint64]bool{}
	total := 0
	for _, rs := range results {
		for _, r := range rs {
			if seen[r.MsgID] {
				t.Fatalf("msg_id %d answered twice", r.MsgID)
			}
			seen[r.MsgID] = true
			total++
		}
	}
	if total != senders*each-1 || bad.Load() != 1 {
		t.Fatalf("%d acks, %d invalid", total, bad.Load())
	}
	batches := tr.count("SendBatch")
	if tr.count("Send") != 0 || batches == 0 || batches >= total {
		t.Fatalf("%d SendBatch and %d Send requests for %d messages: not coalesced", batches, tr.count("Send"), total)
	}
	// Every conversation holds 1..head, and the heads add up.
	var heads uint64
	for cv := range 8 {
		head, err := c.GetHead(ctx, fmt.Sprintf("g:%d", cv))
		if err != nil {
			t.Fatal(err)
		}
		heads += head
	}
	if heads != uint64(total) {
		t.Fatalf("heads add up to %d, want %d", heads, total)
	}
	t.Logf("%d messages in %d SendBatch requests", total, batches)
}

// SendMany: per-item results in order; the items of one conversation get
// increasing seqs in item order; a bad item fails alone.
func TestSendMany(t *testing.T) {
	ctx := ctxT(t)
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}})
	var reqs []client.SendRequest
	for i := range 300 {
		reqs = append(reqs, client.SendRequest{ConvID: fmt.Sprintf("g:%d", i%3), FromUID: 1, ClientMsgID: fmt.Sprint("m", i), Body: []byte(fmt.Sprint(i))})
	}
	reqs[100].MsgType = -5 // invalid
	res, errs := c.SendMany(ctx, reqs)
	last := map[string]uint64{}
	for i := range reqs {
		if i == 100 {
			if sequencer.ErrorCode(errs[i]) != sequencer.CodeInvalidArgument {
				t.Fatalf("item 100: %v", errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Fatalf("item %d: %v", i, errs[i])
		}
		if res[i].Seq <= last[reqs[i].ConvID] {
			t.Fatalf("item %d of %s got seq %d after %d: not in item order", i, reqs[i].ConvID, res[i].Seq, last[reqs[i].ConvID])
		}
		last[reqs[i].ConvID] = res[i].Seq
	}
	// A resend of the whole batch: every item a duplicate with the same ids.
	res2, errs2 := c.SendMany(ctx, reqs)
	for i := range reqs {
		if i == 100 {
			continue
		}
		if errs2[i] != nil || !res2[i].Duplicate || res2[i].MsgID != res[i].MsgID || res2[i].Seq != res[i].Seq {
			t.Fatalf("resend of item %d: %+v %v, first %+v", i, res2[i], errs2[i], res[i])
		}
	}
}

// CLIENTS.md C09 and U6: up to MaxInFlight SendBatch requests to one node
// are in flight at once, never more; an ordered item (SendMany's) whose
// conversation has an ordered item in a request in flight waits for that
// request's answer while other items go (an unordered Send of the same
// conversation too), and nothing waits longer than that.
func TestBatchesInFlightAndConversationOrder(t *testing.T) {
	f := startFake(t)
	type held struct {
		convs   []string
		release chan struct{}
	}
	arrived := make(chan held, 16)
	f.setBatch(func(items []*sequencerv1.SendRequest) {
		h := held{release: make(chan struct{})}
		for _, it := range items {
			h.convs = append(h.convs, it.GetConvId())
		}
		arrived <- h
		<-h.release
	})
	c := newClient(t, client.Config{Addrs: []string{f.addr}, DisableRouting: true,
		Batching: client.BatchPolicy{MaxInFlight: 3}})
	ctx := ctxT(t)
	type answer struct {
		key string
		res client.SendResult
		err error
	}
	answers := make(chan answer, 16)
	sendAsync := func(conv, key string, ordered bool) {
		go func() {
			req := client.SendRequest{ConvID: conv, FromUID: 1, ClientMsgID: key, Body: []byte("x")}
			var res client.SendResult
			var err error
			if ordered {
				res, err = client.SendOrdered(ctx, c, req)
			} else {
				res, err = c.Send(ctx, req)
			}
			answers <- answer{key, res, err}
		}()
	}
	next := func(want string) held {
		t.Helper()
		select {
		case h := <-arrived:
			if strings.Join(h.convs, ",") != want {
				t.Fatalf("request carries %v, want [%s]", h.convs, want)
			}
			return h
		case <-time.After(10 * time.Second):
			t.Fatalf("no request for [%s]", want)
			return held{}
		}
	}
	queued := func(n int, what string) {
		t.Helper()
		testwait.For(t, 10*time.Second, time.Millisecond, what, func() bool { return client.QueuedAt(c, f.addr) == n })
	}

	sendAsync("x", "x1", true)
	r1 := next("x")
	sendAsync("x", "x2", true) // an ordered x is in flight: waits
	queued(1, "x2 to wait behind the request holding x1")
	sendAsync("y", "y1", true) // another conversation: a second request
	r2 := next("y")
	sendAsync("x", "x3", false) // unordered: goes although x1 is in flight
	r3 := next("x")
	sendAsync("z", "z1", true) // three in flight, the most: waits
	queued(2, "z1 to wait: three requests in flight")
	select {
	case h := <-arrived:
		t.Fatalf("a fourth request went out while three were in flight: %v", h.convs)
	case <-time.After(50 * time.Millisecond):
	}
	if n := client.QueuedAt(c, f.addr); n != 2 {
		t.Fatalf("%d queued, want x2 and z1", n)
	}
	close(r2.release) // y answered: z1 goes, x2 still waits for x1
	r4 := next("z")
	if n := client.QueuedAt(c, f.addr); n != 1 {
		t.Fatalf("%d queued after y's answer, want x2 alone", n)
	}
	close(r3.release) // x3 answered: x2 still waits, for x1
	select {
	case h := <-arrived:
		t.Fatalf("a request went out after x3's answer while x1 is in flight: %v", h.convs)
	case <-time.After(50 * time.Millisecond):
	}
	close(r1.release) // x1 answered: x2 goes
	r5 := next("x")
	close(r4.release)
	close(r5.release)
	seqs := map[string]uint64{}
	for range 5 {
		a := <-answers
		if a.err != nil {
			t.Fatalf("send %s: %v", a.key, a.err)
		}
		seqs[a.key] = a.res.Seq
	}
	if seqs["x1"] >= seqs["x2"] {
		t.Fatalf("x1 stored at %d, x2 at %d: not in queue order", seqs["x1"], seqs["x2"])
	}
}

// SendMany's items of one conversation are stored in item order although
// several requests are in flight (other senders keep the node busy, so the
// items are spread over many requests).
func TestSendManyOrderWithRequestsInFlight(t *testing.T) {
	ctx := ctxT(t)
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	tr := &countingTransport{base: h2cTransport(), n: map[string]int{}}
	t.Cleanup(tr.base.(*http.Transport).CloseIdleConnections)
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}, HTTPClient: &http.Client{Transport: tr},
		Batching: client.BatchPolicy{MaxItems: 16}})
	stop := make(chan struct{})
	var noise sync.WaitGroup
	for s := range 16 {
		noise.Add(1)
		go func() {
			defer noise.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := c.Send(ctx, client.SendRequest{ConvID: fmt.Sprintf("noise:%d", s), FromUID: 1, Body: []byte("n")}); err != nil {
					t.Errorf("noise send: %v", err)
					return
				}
			}
		}()
	}
	var reqs []client.SendRequest
	for i := range 2000 {
		reqs = append(reqs, client.SendRequest{ConvID: fmt.Sprintf("o:%d", i%20), FromUID: 1, ClientMsgID: fmt.Sprint("m", i), Body: []byte(fmt.Sprint(i))})
	}
	res, errs := c.SendMany(ctx, reqs)
	close(stop)
	noise.Wait()
	last := map[string]uint64{}
	for i := range reqs {
		if errs[i] != nil {
			t.Fatalf("item %d: %v", i, errs[i])
		}
		if res[i].Seq != last[reqs[i].ConvID]+1 {
			t.Fatalf("item %d of %s got seq %d after %d: not in item order", i, reqs[i].ConvID, res[i].Seq, last[reqs[i].ConvID])
		}
		last[reqs[i].ConvID] = res[i].Seq
	}
	if most := tr.mostInFlight(); most > client.DefaultBatchMaxInFlight {
		t.Fatalf("%d requests in flight at once, the most allowed is %d", most, client.DefaultBatchMaxInFlight)
	}
	t.Logf("%d SendBatch requests, at most %d in flight at once", tr.count("SendBatch"), tr.mostInFlight())
}

// A full queue for a node blocks Send until there is room or its ctx ends.
func TestBatchQueueBoundBlocks(t *testing.T) {
	f := startFake(t)
	release, holding := make(chan struct{}), make(chan struct{})
	f.setSend(func(n int) error {
		if n == 1 {
			close(holding)
			<-release // the first request holds the node
		}
		return nil
	})
	c := newClient(t, client.Config{Addrs: []string{f.addr}, DisableRouting: true,
		Batching: client.BatchPolicy{MaxQueuedItems: 2, MaxInFlight: 1}})
	ctx := ctxT(t)
	go func() {
		_, _ = c.Send(ctx, client.SendRequest{ConvID: "g:1", FromUID: 1, ClientMsgID: "first", Body: []byte("x")})
	}()
	<-holding
	for i := range 2 { // fill the queue
		go func() {
			_, _ = c.Send(ctx, client.SendRequest{ConvID: "g:1", FromUID: 1, ClientMsgID: fmt.Sprint("q", i), Body: []byte("x")})
		}()
	}
	testwait.For(t, 10*time.Second, time.Millisecond, "both sends to queue behind the held request",
		func() bool { return client.QueuedAt(c, f.addr) >= 2 })
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err := c.Send(sctx, client.SendRequest{ConvID: "g:1", FromUID: 1, ClientMsgID: "over", Body: []byte("x")})
	if code := sequencer.ErrorCode(err); code != sequencer.CodeDeadlineExceeded {
		t.Fatalf("send past the queue bound: %v (code %s), want deadline_exceeded", err, code)
	}
	close(release)
	if _, err := c.Send(ctx, client.SendRequest{ConvID: "g:1", FromUID: 1, ClientMsgID: "after", Body: []byte("x")}); err != nil {
		t.Fatalf("send after the queue drained: %v", err)
	}
	for _, k := range f.keys() {
		if k == "over" {
			t.Fatalf("the send that never got into the queue reached the node")
		}
	}
}

// CLIENTS.md C09 and C21: a request never carries more than 1,000 items,
// whatever queued; with batching disabled every message is its own Send.
func TestBatchCapAndBatchingDisabled(t *testing.T) {
	// What is checked is the requests' shape, not their speed: 2,500
	// messages get two minutes (a loaded machine under -race has taken more
	// than the SDK's default 30 s).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	var mu sync.Mutex
	var sizes []int
	tr := &countingTransport{base: h2cTransport(), n: map[string]int{}}
	t.Cleanup(tr.base.(*http.Transport).CloseIdleConnections)
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}, HTTPClient: &http.Client{Transport: sizeRecorder{tr, &mu, &sizes}},
		Protocol: client.ProtocolConnect, Retry: client.RetryPolicy{Deadline: 2 * time.Minute}})
	reqs := make([]client.SendRequest, 2500)
	for i := range reqs {
		reqs[i] = client.SendRequest{ConvID: fmt.Sprintf("g:cap%d", i%50), FromUID: 1, ClientMsgID: fmt.Sprint("cap", i)}
	}
	if _, errs := c.SendMany(ctx, reqs); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	mu.Lock()
	for _, n := range sizes {
		if n > 1000 {
			t.Fatalf("a SendBatch request carried %d items", n)
		}
	}
	mu.Unlock()
	if tr.count("SendBatch") < 3 {
		t.Fatalf("2,500 messages went in %d SendBatch requests", tr.count("SendBatch"))
	}

	off := &countingTransport{base: h2cTransport(), n: map[string]int{}}
	t.Cleanup(off.base.(*http.Transport).CloseIdleConnections)
	u := newClient(t, client.Config{Addrs: []string{node.Addr()}, HTTPClient: &http.Client{Transport: off},
		Batching: client.BatchPolicy{Disabled: true}, DisableRouting: true})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := u.Send(ctx, client.SendRequest{ConvID: "g:unary", FromUID: 2, ClientMsgID: fmt.Sprint("u", i)}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if off.count("Send") != 20 || off.count("SendBatch") != 0 {
		t.Fatalf("batching disabled: %d Send and %d SendBatch requests for 20 messages", off.count("Send"), off.count("SendBatch"))
	}
}

// sizeRecorder records the item count of every SendBatch request (Connect
// protocol: the body is the plain protobuf message).
type sizeRecorder struct {
	base  http.RoundTripper
	mu    *sync.Mutex
	sizes *[]int
}

func (s sizeRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if strings.HasSuffix(req.URL.Path, "/SendBatch") {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		var m sequencerv1.SendBatchRequest
		if err := proto.Unmarshal(body, &m); err != nil {
			return nil, err
		}
		s.mu.Lock()
		*s.sizes = append(*s.sizes, len(m.GetItems()))
		s.mu.Unlock()
	}
	return s.base.RoundTrip(req)
}

// CLIENTS.md C07: Pull pages ascend, are contiguous, say has_more, and keep
// ids above 2^53 intact.
func TestPullPages(t *testing.T) {
	ctx := ctxT(t)
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}})
	reqs := make([]client.SendRequest, 150)
	for i := range reqs {
		reqs[i] = client.SendRequest{ConvID: "g:pages", FromUID: 1, ClientMsgID: fmt.Sprint("p", i)}
	}
	res, errs := c.SendMany(ctx, reqs)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	ids := map[uint64]uint64{}
	for _, r := range res {
		ids[r.Seq] = r.MsgID
	}
	var after uint64
	for page := 0; ; page++ {
		p, err := c.Pull(ctx, "g:pages", after, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range p.Messages {
			if m.Seq != after+1 || m.MsgID != ids[m.Seq] || m.MsgID < 1<<53 {
				t.Fatalf("page %d: seq %d msg_id %d after %d (sent msg_id %d)", page, m.Seq, m.MsgID, after, ids[m.Seq])
			}
			after = m.Seq
		}
		if want := page == 0; p.HasMore != want || p.HeadSeq != 150 {
			t.Fatalf("page %d: has_more %v head %d", page, p.HasMore, p.HeadSeq)
		}
		if !p.HasMore {
			break
		}
	}
	if after != 150 {
		t.Fatalf("pulled up to seq %d, want 150", after)
	}
}
