package api

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// fakeSender records every request that reached it and answers with fn.
type fakeSender struct {
	mu    sync.Mutex
	calls []sequencer.SendRequest
	// follows[i]: calls[i] came from a client that follows redirects
	// (sequencer.FollowsRedirects).
	follows []bool
	// unknown[i]: calls[i] said an earlier attempt's outcome is unknown
	// (sequencer.EarlierOutcomeUnknown).
	unknown []bool
	fn      func(req sequencer.SendRequest) (sequencer.SendResult, error)
}

func (f *fakeSender) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	f.mu.Lock()
	f.calls = append(f.calls, req)
	f.follows = append(f.follows, sequencer.FollowsRedirects(ctx))
	f.unknown = append(f.unknown, sequencer.EarlierOutcomeUnknown(ctx))
	fn := f.fn
	f.mu.Unlock()
	if fn == nil {
		return sequencer.SendResult{}, errors.New("fakeSender: no answer configured")
	}
	return fn(req)
}

func (f *fakeSender) set(fn func(req sequencer.SendRequest) (sequencer.SendResult, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fn = fn
}

func (f *fakeSender) Calls() []sequencer.SendRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sequencer.SendRequest(nil), f.calls...)
}

type rangeCall struct {
	ConvID   string
	AfterSeq uint64
	Limit    int
}

// fakeReader is a Reader over a memstore that records its calls and fails
// them all while err is set.
type fakeReader struct {
	store  *memstore.Store
	mu     sync.Mutex
	err    error // returned by every call when set
	loads  int
	ranges []rangeCall
	gets   int
	manys  int
}

func newFakeReader() *fakeReader { return &fakeReader{store: memstore.New()} }

// put stores msgs (one conversation, consecutive seqs) and sets the
// conversation's head: a head below the last row mimics a commit landing
// between LoadHead and ReadRange; rows starting above 1 mimic retention.
func (f *fakeReader) put(head uint64, msgs ...sequencer.Message) {
	if len(msgs) == 0 {
		return
	}
	ctx, conv, prev := context.Background(), msgs[0].ConvID, msgs[0].Seq-1
	err := f.store.SetHeadForTest(ctx, conv, prev)
	if err == nil {
		err = f.store.Commit(ctx, []persist.ConvBatch{{ConvID: conv, PrevHead: prev, Messages: msgs}})
	}
	if err == nil {
		err = f.store.SetHeadForTest(ctx, conv, head)
	}
	if err != nil {
		panic(fmt.Sprintf("fakeReader.put: %v", err))
	}
}

func (f *fakeReader) setHead(convID string, head uint64) {
	if err := f.store.SetHeadForTest(context.Background(), convID, head); err != nil {
		panic(fmt.Sprintf("fakeReader.setHead: %v", err))
	}
}

func (f *fakeReader) setErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeReader) LoadHead(ctx context.Context, convID string) (uint64, error) {
	f.mu.Lock()
	f.loads++
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return f.store.LoadHead(ctx, convID)
}

func (f *fakeReader) ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error) {
	f.mu.Lock()
	f.ranges = append(f.ranges, rangeCall{convID, afterSeq, limit})
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return f.store.ReadRange(ctx, convID, afterSeq, limit)
}

func (f *fakeReader) ReadBefore(ctx context.Context, convID string, afterSeq, beforeSeq uint64, limit int) ([]sequencer.Message, error) {
	f.mu.Lock()
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return f.store.ReadBefore(ctx, convID, afterSeq, beforeSeq, limit)
}

func (f *fakeReader) ReadMany(ctx context.Context, cursors []persist.Cursor, limit, total int) ([]persist.Page, error) {
	f.mu.Lock()
	f.manys++
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return f.store.ReadMany(ctx, cursors, limit, total)
}

func (f *fakeReader) GetMessage(ctx context.Context, msgID uint64) (sequencer.Message, error) {
	f.mu.Lock()
	f.gets++
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return sequencer.Message{}, err
	}
	return f.store.GetMessage(ctx, msgID)
}

func (f *fakeReader) calls() (loads, ranges, gets int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loads, len(f.ranges), f.gets
}

func (f *fakeReader) lastRange() (rangeCall, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.ranges) == 0 {
		return rangeCall{}, false
	}
	return f.ranges[len(f.ranges)-1], true
}

func (f *fakeSender) SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome) {
	for i := range reqs {
		out[i].Result, out[i].Err = f.Send(ctx, reqs[i])
	}
}
