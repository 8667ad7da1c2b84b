package api

import (
	"context"
	"errors"
	"sync"

	"github.com/sequencer-im/sequencer"
)

// fakeSender records every request that reached it and answers with fn.
type fakeSender struct {
	mu    sync.Mutex
	calls []sequencer.SendRequest
	fn    func(req sequencer.SendRequest) (sequencer.SendResult, error)
}

func (f *fakeSender) Send(_ context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	f.mu.Lock()
	f.calls = append(f.calls, req)
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

// fakeReader is an in-memory Reader: per conversation a head and the stored
// rows (ascending; rows trimmed by retention are simply absent, and rows may
// run past the head to mimic a commit landing between LoadHead and
// ReadRange).
type fakeReader struct {
	mu     sync.Mutex
	heads  map[string]uint64
	rows   map[string][]sequencer.Message
	err    error // returned by every call when set
	loads  int
	ranges []rangeCall
	gets   int
}

func newFakeReader() *fakeReader {
	return &fakeReader{heads: map[string]uint64{}, rows: map[string][]sequencer.Message{}}
}

func (f *fakeReader) put(head uint64, msgs ...sequencer.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range msgs {
		f.rows[m.ConvID] = append(f.rows[m.ConvID], m)
	}
	if len(msgs) > 0 {
		f.heads[msgs[0].ConvID] = head
	}
}

func (f *fakeReader) setHead(convID string, head uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.heads[convID] = head
}

func (f *fakeReader) setErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeReader) LoadHead(_ context.Context, convID string) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads++
	if f.err != nil {
		return 0, f.err
	}
	return f.heads[convID], nil
}

func (f *fakeReader) ReadRange(_ context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ranges = append(f.ranges, rangeCall{convID, afterSeq, limit})
	if f.err != nil {
		return nil, f.err
	}
	var out []sequencer.Message
	for _, m := range f.rows[convID] {
		if m.Seq > afterSeq && len(out) < limit {
			out = append(out, m)
		}
	}
	return out, nil
}

func (f *fakeReader) GetMessage(_ context.Context, msgID uint64) (sequencer.Message, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	if f.err != nil {
		return sequencer.Message{}, f.err
	}
	for _, rows := range f.rows {
		for _, m := range rows {
			if m.MsgID == msgID {
				return m, nil
			}
		}
	}
	return sequencer.Message{}, errors.Join(errors.New("fake: no row"), sequencer.ErrNotFound)
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
