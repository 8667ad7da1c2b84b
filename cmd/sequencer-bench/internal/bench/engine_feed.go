package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
)

// The feed engines (issue 33) are e and e-batch with one Subscribe stream
// on each of the scenario's conversations, opened before the load (Seed)
// through the Go SDK from this process: --engines e-batch,e-batch-sub
// compares the write rate with and without subscribers, and e-sub at
// light load measures the feed's latency, from the moment the sender's
// Send returned (the commit's ack) to the subscriber's receipt. They are
// opt-in.
func init() {
	sub := remoteSpec("e-sub", "sequencer serve, SDK unary, a subscriber per conversation", false,
		"engine e with one Subscribe stream (Go SDK, gRPC) on each of the scenario's conversations, opened before the load; reports the feed's latency from the Send's answer to the subscriber's receipt", newFeedClient(false))
	sub.OptIn = true
	registerEngine(sub)
	batch := remoteSpec("e-batch-sub", "sequencer serve, SDK batching, a subscriber per conversation", false,
		"engine e-batch with one Subscribe stream (Go SDK, gRPC) on each of the scenario's conversations, opened before the load", newFeedClient(true))
	batch.OptIn = true
	registerEngine(batch)
}

// FeedResult is what the subscribers of a feed engine saw during the
// measurement.
type FeedResult struct {
	Streams   int     `json:"streams"`
	Delivered int64   `json:"delivered"` // messages received during the measurement
	PerSecond float64 `json:"delivered_per_second"`
	// Latency from the Send's answer to the receipt (0 when the message
	// arrived before the answer), of the messages sent and received in the
	// measurement; not measured when InChild.
	Latency LatencySummary `json:"latency"`
	// InChild: the streams ran in a child process (--subs-process).
	InChild bool `json:"in_child,omitempty"`
}

// FeedMeter is implemented by the feed engines: FeedStart when the
// measurement starts, FeedStats at its end.
type FeedMeter interface {
	FeedStart()
	FeedStats(seconds float64) FeedResult
}

type feedClient struct {
	sdkClient
	env      Env
	streams  *feedStreams // in this process (nil with SubsProcess)
	child    *subsChild   // in a child process (SubsProcess)
	measured atomic.Bool
	got      atomic.Int64
	lat      *Latency
	// acked and received meet by msg_id: whoever comes second records the
	// latency (a receipt before the answer counts 0).
	acked sync.Map // msg_id -> time.Time of the Send's answer
}

func newFeedClient(batching bool) func(env Env) (Engine, error) {
	newSDK := newSDKClient(batching)
	return func(env Env) (Engine, error) {
		e, err := newSDK(env)
		if err != nil {
			return nil, err
		}
		return &feedClient{sdkClient: e.(sdkClient), env: env, lat: NewLatency()}, nil
	}
}

// Seed opens one stream per conversation and waits until every stream
// received the seeding message of its conversation (so every stream is
// attached before the load starts).
func (f *feedClient) Seed(ctx context.Context, convPfx string, convs, _ int) error {
	for k0 := 0; k0 < convs; k0 += seedChunk {
		var reqs []client.SendRequest
		for k := k0; k < min(convs, k0+seedChunk); k++ {
			reqs = append(reqs, client.SendRequest{ConvID: convID(convPfx, k), FromUID: 1, ClientMsgID: fmt.Sprintf("%sseed-%d", convPfx, k), Body: []byte("seed")})
		}
		if _, errs := f.c.SendMany(ctx, reqs); firstErr(errs) != nil {
			return fmt.Errorf("seed messages: %w", firstErr(errs))
		}
	}
	if f.env.SubsProcess {
		c, err := startSubsChild(ctx, f.env.Target, convPfx, convs, f.env.ConvsPerStream, f.env.SubsCPUProfile)
		f.child = c
		return err
	}
	var err error
	f.streams, err = openFeedStreams(ctx, f.env.Target, convPfx, convs, f.env.ConvsPerStream, f.received)
	return err
}

// feedStreams is one Subscribe stream (Go SDK, gRPC) on each conversation,
// or on each run of perStream conversations (--convs-per-stream), all of
// one SDK client, as a push gateway would hold them: the SDK's transport
// puts up to the server's concurrent stream limit on one HTTP/2 connection
// (api.MaxConcurrentStreams).
type feedStreams struct {
	sub    *client.Client
	cancel context.CancelFunc
	wg     sync.WaitGroup
	n      int
}

// openFeedStreams opens the streams and returns once each conversation
// received its first message (the seed); received gets every later one.
// perStream < 1 counts as 1.
func openFeedStreams(ctx context.Context, target, convPfx string, convs, perStream int, received func(k int, msgID uint64)) (*feedStreams, error) {
	c, err := client.New(client.Config{Addrs: []string{target}, DisableRouting: true})
	if err != nil {
		return nil, err
	}
	perStream = max(perStream, 1)
	sctx, cancel := context.WithCancel(context.Background())
	s := &feedStreams{sub: c, cancel: cancel}
	var ready sync.WaitGroup
	ready.Add(convs)
	for k0 := 0; k0 < convs; k0 += perStream {
		k1 := min(convs, k0+perStream)
		cursors := make([]client.Cursor, 0, k1-k0)
		index := make(map[string]int, k1-k0)
		for k := k0; k < k1; k++ {
			id := convID(convPfx, k)
			cursors = append(cursors, client.Cursor{ConvID: id})
			index[id] = k
		}
		s.wg.Add(1)
		s.n++
		go func() {
			defer s.wg.Done()
			seeded := make(map[int]bool, len(cursors))
			for ev, err := range c.Subscribe(sctx, cursors) {
				if err != nil {
					break
				}
				if ev.Message == nil {
					continue
				}
				k := index[ev.Message.ConvID]
				if !seeded[k] {
					seeded[k] = true
					ready.Done()
					continue
				}
				received(k, ev.Message.MsgID)
			}
			ready.Add(len(seeded) - len(cursors)) // the conversations never seeded
		}()
	}
	done := make(chan struct{})
	go func() { ready.Wait(); close(done) }()
	select {
	case <-done:
		return s, nil
	case <-ctx.Done():
		s.Close()
		return nil, ctx.Err()
	}
}

// Close ends the streams.
func (s *feedStreams) Close() {
	s.cancel()
	s.sub.Close()
	s.wg.Wait()
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (f *feedClient) received(k int, msgID uint64) {
	now := time.Now()
	if !f.measured.Load() {
		return
	}
	f.got.Add(1)
	if at, loaded := f.acked.LoadOrStore(msgID, now); loaded {
		f.acked.Delete(msgID)
		f.lat.Record(k, now.Sub(at.(time.Time)))
	}
}

// Send sends through the SDK and records when the answer came.
func (f *feedClient) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	r, err := f.sdkClient.Send(ctx, req)
	if err == nil && f.measured.Load() {
		now := time.Now()
		if _, loaded := f.acked.LoadOrStore(r.MsgID, now); loaded {
			f.acked.Delete(r.MsgID)
			f.lat.Record(int(r.Seq), 0) // received before the answer
		}
	}
	return r, err
}

func (f *feedClient) FeedStart() {
	f.measured.Store(true)
	if f.child != nil {
		f.child.start()
	}
}

func (f *feedClient) FeedStats(seconds float64) FeedResult {
	f.measured.Store(false)
	var r FeedResult
	if f.child != nil {
		r.Streams, r.Delivered = f.child.stats()
		r.InChild = true
	} else if f.streams != nil {
		r = FeedResult{Streams: f.streams.n, Delivered: f.got.Load(), Latency: Summarize(f.lat.Snapshot())}
	}
	if seconds > 0 {
		r.PerSecond = float64(r.Delivered) / seconds
	}
	return r
}

func (f *feedClient) Close() error {
	if f.streams != nil {
		f.streams.Close()
	}
	if f.child != nil {
		f.child.close()
	}
	return f.sdkClient.Close()
}

// FeedStart and FeedStats pass through the remote engine.
func (e *remoteEngine) FeedStart() {
	if m, ok := e.Engine.(FeedMeter); ok {
		m.FeedStart()
	}
}

func (e *remoteEngine) FeedStats(seconds float64) FeedResult {
	if m, ok := e.Engine.(FeedMeter); ok {
		return m.FeedStats(seconds)
	}
	return FeedResult{}
}
