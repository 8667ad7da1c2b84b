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
// (engine_sdkops.go): each operation is one MarkRead, or one GetReadState
// of readStateConvs conversations. Before the load they seed the
// scenario's conversations: one message each and one read position per
// conversation, so marks write existing rows and read states find heads
// and positions: --engines r-mark,r-state[,r-mark-sqlite,r-state-sqlite].
func init() {
	registerOpEngines("r-mark", "MarkRead, SDK unary",
		"one MarkRead per operation (the picked conversation, the sender's uid, an ever higher seq clamped to the head)",
		func(c *client.Client, _ Env) (Engine, error) { return &readPosClient{c: c}, nil })
	registerOpEngines("r-state", "GetReadState of 1,000, SDK unary",
		fmt.Sprintf("one GetReadState of %d conversations per operation (the picked one and the next %d)", readStateConvs, readStateConvs-1),
		func(c *client.Client, _ Env) (Engine, error) { return &readPosClient{c: c, state: true}, nil })
}

// readStateConvs is how many conversations one r-state operation asks for:
// the API's maximum, an inbox page.
const readStateConvs = sequencer.MaxReadStateConvs

type readPosClient struct {
	c      *client.Client
	state  bool
	seq    atomic.Uint64 // marks ask for ever higher seqs (clamped to the head)
	pfx    string
	convs  int
	convMu sync.Mutex
}

// Seed stores one message in each conversation (SendMany, batched) and
// marks one of them read for one sender each (uid k%senders+1), so each
// user has about convs/senders positions.
func (r *readPosClient) Seed(ctx context.Context, convPfx string, convs, senders int) error {
	r.convMu.Lock()
	r.pfx, r.convs = convPfx, convs
	r.convMu.Unlock()
	if err := seedMessages(ctx, r.c, convPfx, convs, 1, func(int, int, uint64) {}); err != nil {
		return err
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
