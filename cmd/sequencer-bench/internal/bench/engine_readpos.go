package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
)

// The read-position engines (issue 21) measure MarkRead and GetReadState
// through the Go SDK (unary gRPC) against a 'sequencer serve', like engine
// e. Each "message" of their results is one RPC: one MarkRead, or one
// GetReadState of readStateConvs conversations. Before the load they seed
// the scenario's conversations (Seeder): one message each and one read
// position per conversation, so marks write existing rows and read states
// find heads and positions. They are opt-in (not in the default engine
// list): --engines r-mark,r-state[,r-mark-sqlite,r-state-sqlite].
func init() {
	for _, sqlite := range []bool{false, true} {
		suffix, store := "", "PostgreSQL"
		if sqlite {
			suffix, store = "-sqlite", "the embedded store (a fresh SQLite file per scenario)"
		}
		mark := remoteSpec("r-mark"+suffix, "MarkRead, SDK unary"+map[bool]string{false: "", true: ", SQLite"}[sqlite], sqlite,
			"one MarkRead per operation (the picked conversation, the sender's uid, an ever higher seq clamped to the head) through the Go SDK to a 'sequencer serve' on "+store,
			newReadPosClient(false))
		mark.OptIn = true
		registerEngine(mark)
		state := remoteSpec("r-state"+suffix, "GetReadState of 1,000, SDK unary"+map[bool]string{false: "", true: ", SQLite"}[sqlite], sqlite,
			fmt.Sprintf("one GetReadState of %d conversations per operation (the picked one and the next %d) through the Go SDK to a 'sequencer serve' on %s", readStateConvs, readStateConvs-1, store),
			newReadPosClient(true))
		state.OptIn = true
		registerEngine(state)
	}
}

// readStateConvs is how many conversations one r-state operation asks for:
// the API's maximum, an inbox page.
const readStateConvs = sequencer.MaxReadStateConvs

// Seeder is implemented by engines that prepare the store for a scenario
// before the load (not measured): convs conversations named
// convID(convPfx, k), worked by senders uids 1..senders.
type Seeder interface {
	Seed(ctx context.Context, convPfx string, convs, senders int) error
}

type readPosClient struct {
	c      *client.Client
	state  bool
	seq    atomic.Uint64 // marks ask for ever higher seqs (clamped to the head)
	pfx    string
	convs  int
	convMu sync.Mutex
}

func newReadPosClient(state bool) func(env Env) (Engine, error) {
	return func(env Env) (Engine, error) {
		proto := client.ProtocolGRPC
		if env.Protocol == "connect" {
			proto = client.ProtocolConnect
		}
		c, err := client.New(client.Config{
			Addrs: []string{env.Target}, Protocol: proto, DisableRouting: true,
			Retry: client.RetryPolicy{MaxAttempts: 1},
		})
		if err != nil {
			return nil, err
		}
		return &readPosClient{c: c, state: state}, nil
	}
}

// seedChunk is how many messages one seeding SendMany carries.
const seedChunk = 1000

// Seed stores one message in each conversation (SendMany, batched) and
// marks one of them read for one sender each (uid k%senders+1), so each
// user has about convs/senders positions.
func (r *readPosClient) Seed(ctx context.Context, convPfx string, convs, senders int) error {
	r.convMu.Lock()
	r.pfx, r.convs = convPfx, convs
	r.convMu.Unlock()
	for k0 := 0; k0 < convs; k0 += seedChunk {
		var reqs []client.SendRequest
		for k := k0; k < min(convs, k0+seedChunk); k++ {
			reqs = append(reqs, client.SendRequest{ConvID: convID(convPfx, k), FromUID: 1, ClientMsgID: fmt.Sprintf("%sseed-%d", convPfx, k), Body: []byte("seed")})
		}
		_, errs := r.c.SendMany(ctx, reqs)
		for _, err := range errs {
			if err != nil {
				return fmt.Errorf("seed messages: %w", err)
			}
		}
	}
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := w; k < convs; k += 16 {
				if _, err := r.c.MarkRead(ctx, convID(convPfx, k), uint64(k%max(senders, 1)+1), 1); err != nil {
					errc <- fmt.Errorf("seed read positions: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// Send is one operation: a MarkRead (r-mark) or a GetReadState (r-state)
// for the sender's uid, about the picked conversation.
func (r *readPosClient) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	if !r.state {
		st, err := r.c.MarkRead(ctx, req.ConvID, req.FromUID, r.seq.Add(1))
		if err != nil {
			return sequencer.SendResult{}, err
		}
		return sequencer.SendResult{Seq: st.ReadSeq}, nil
	}
	r.convMu.Lock()
	pfx, convs := r.pfx, r.convs
	r.convMu.Unlock()
	var k int
	if _, err := fmt.Sscanf(req.ConvID[len(pfx):], "%d", &k); err != nil || convs == 0 {
		return sequencer.SendResult{}, fmt.Errorf("r-state: conversation %q is not one of the seeded ones", req.ConvID)
	}
	ids := make([]string, readStateConvs)
	for j := range ids {
		ids[j] = convID(pfx, (k+j)%convs)
	}
	states, err := r.c.GetReadState(ctx, req.FromUID, ids)
	if err != nil {
		return sequencer.SendResult{}, err
	}
	return sequencer.SendResult{Seq: states[0].Head}, nil
}

func (r *readPosClient) Close() error { return r.c.Close() }

// Seed passes a seeding request to the client when it seeds.
func (e *remoteEngine) Seed(ctx context.Context, convPfx string, convs, senders int) error {
	if s, ok := e.Engine.(Seeder); ok {
		return s.Seed(ctx, convPfx, convs, senders)
	}
	return nil
}
