package conv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// modelStore is the store the model runs over: a memstore, read and
// written from the model's one goroutine.
type modelStore struct {
	t *testing.T
	s *memstore.Store
}

func (m modelStore) commit(b *persist.ConvBatch) error {
	return m.s.Commit(context.Background(), []persist.ConvBatch{*b})
}

func (m modelStore) head(conv string) uint64 {
	h, err := m.s.LoadHead(context.Background(), conv)
	if err != nil {
		m.t.Fatal(err)
	}
	return h
}

func (m modelStore) readRange(conv string, after uint64, n int) []sequencer.Message {
	ms, err := m.s.ReadRange(context.Background(), conv, after, n)
	if err != nil {
		m.t.Fatal(err)
	}
	return ms
}

// row returns conv's stored message at seq.
func (m modelStore) row(conv string, seq uint64) (sequencer.Message, bool) {
	ms := m.readRange(conv, seq-1, 1)
	if len(ms) == 0 || ms[0].Seq != seq {
		return sequencer.Message{}, false
	}
	return ms[0], true
}

// byKey returns the message stored under key, or the store's error.
func (m modelStore) byKey(key sequencer.ClientKey) (sequencer.Message, error) {
	return m.s.FindByClientKey(context.Background(), key)
}

// sendRec is one Send the model made and what it was answered.
type sendRec struct {
	conv    string
	key     sequencer.ClientKey
	req     sequencer.SendRequest // what was sent (the rapid model)
	replies []Reply
}

// TestModelRandomFaults drives several cores over one model store with a
// seeded random mix of sends, resends (same and other conversation),
// cancellations, store faults (fail before write, commit then report
// unknown, drop and report unknown, stale fence, failed re-reads and
// lookups) and another writer appending behind the core's back, and
// checks every reply against the store at the moment it is given.
func TestModelRandomFaults(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, seed) })
	}
}

func runModel(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed*7919))
	st := modelStore{t, memstore.New()}
	ids := &fakeIDs{next: 1 << 20}
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	convs := []string{"a", "b", "c", "d"}
	cores := map[string]*Core{}
	pendingOp := map[string]*Ready{} // the store op each core waits for
	fenceDown := false
	for _, cv := range convs {
		c, err := New(Config{ConvID: cv, MaxQueue: 8, MaxBatch: 3, MemoSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		cores[cv] = c
	}
	form := func(n int) Formation {
		if fenceDown {
			return Formation{FenceErr: sequencer.ErrOwnershipMoving}
		}
		f := Formation{Now: clk.Now()}
		for range n {
			id, err := ids.NextID()
			if err != nil {
				f.IDErr = err
				break
			}
			f.IDs = append(f.IDs, id)
		}
		return f
	}
	var sends []*sendRec
	cancels := map[int]func(){} // the caller of send i gives up
	var keys []sequencer.ClientKey
	keyConv := map[sequencer.ClientKey]string{} // first conversation a key was sent to

	check := func(cv string, rd Ready) {
		for _, r := range rd.Replies {
			s := sends[r.Token.(int)]
			s.replies = append(s.replies, r)
			if len(s.replies) > 1 {
				t.Fatalf("send %d answered twice", r.Token)
			}
			if r.Err != nil {
				if sequencer.ErrorCode(r.Err) == sequencer.CodeAlreadyExists {
					if m, err := st.byKey(s.key); err != nil || m.ConvID == cv {
						t.Fatalf("already_exists for %v in %s but stored %v", s.key, cv, m)
					}
				}
				continue
			}
			m, ok := st.row(cv, r.Result.Seq)
			if !ok || m.MsgID != r.Result.MsgID || m.Key() != s.key || !m.ServerAt.Equal(r.Result.ServerAt) {
				t.Fatalf("ack %+v for %v in %s not durable: stored %+v", r.Result, s.key, cv, m)
			}
		}
		if rd.LoadHead || rd.Commit != nil || rd.Resolve != nil || len(rd.Lookup) > 0 {
			if pendingOp[cv] != nil {
				t.Fatalf("%s: two store operations outstanding", cv)
			}
			cp := rd
			pendingOp[cv] = &cp
		}
	}
	// execute completes cv's outstanding store op, with a fault if faulty.
	execute := func(cv string, faulty bool) {
		rd := pendingOp[cv]
		delete(pendingOp, cv)
		c := cores[cv]
		fault := 0
		if faulty {
			fault = rng.IntN(9)
		}
		switch {
		case rd.LoadHead:
			if fault == 1 {
				c.HeadLoaded(0, sequencer.ErrStoreUnavailable)
			} else {
				c.HeadLoaded(st.head(cv), nil)
			}
		case rd.Commit != nil:
			switch fault {
			case 1:
				c.Committed(fmt.Errorf("dial: %w", sequencer.ErrStoreUnavailable))
			case 2: // committed, then the answer was lost
				if err := st.commit(rd.Commit); err != nil {
					c.Committed(err)
				} else {
					c.Committed(sequencer.ErrUnknownOutcome)
				}
			case 3: // dropped: nothing written, outcome reported unknown
				c.Committed(sequencer.ErrUnknownOutcome)
			case 4: // fenced off
				c.Committed(&persist.StaleFenceError{Fences: []persist.Fence{rd.Commit.Fence}})
			default:
				c.Committed(st.commit(rd.Commit))
			}
		case rd.Resolve != nil:
			if fault == 1 {
				c.Resolved(0, nil, sequencer.ErrStoreUnavailable)
			} else {
				c.Resolved(st.head(cv), st.readRange(cv, rd.Resolve.AfterSeq, rd.Resolve.Count), nil)
			}
		case len(rd.Lookup) > 0:
			var rs []LookupResult
			for _, k := range rd.Lookup {
				if fault == 1 {
					rs = append(rs, LookupResult{Key: k, Err: sequencer.ErrStoreUnavailable})
				} else if m, err := st.byKey(k); err != nil {
					rs = append(rs, LookupResult{Key: k, Err: err})
				} else {
					rs = append(rs, LookupResult{Key: k, Msg: m})
				}
			}
			c.LookedUp(rs)
		}
		check(cv, ready(c, form))
	}

	for step := 0; step < 1500; step++ {
		switch p := rng.IntN(100); {
		case p < 55: // send: new key, or resend (sometimes to another conversation)
			cv := convs[rng.IntN(len(convs))]
			var key sequencer.ClientKey
			if len(keys) > 0 && rng.IntN(3) == 0 {
				key = keys[rng.IntN(len(keys))]
				if rng.IntN(4) != 0 {
					cv = keyConv[key]
				}
			} else {
				key = sequencer.ClientKey{FromUID: uint64(1 + rng.IntN(3)), ClientMsgID: fmt.Sprintf("m%d", len(keys))}
				keys = append(keys, key)
				keyConv[key] = cv
			}
			tok := len(sends)
			cancels[tok] = func() { cores[cv].Cancel(tok, key, context.Canceled) }
			sends = append(sends, &sendRec{conv: cv, key: key})
			cores[cv].Send(tok, sequencer.SendRequest{ConvID: cv, FromUID: key.FromUID, ClientMsgID: key.ClientMsgID, MsgType: 1, Body: []byte("x")})
			check(cv, ready(cores[cv], form))
		case p < 63: // a recent caller gives up
			if len(sends) > 0 {
				cancels[max(0, len(sends)-1-rng.IntN(10))]()
			}
		case p < 64:
			fenceDown = !fenceDown && rng.IntN(4) == 0
		case p < 65:
			clk.Advance(time.Duration(rng.IntN(3)) * time.Millisecond)
		case p < 66: // another writer (a stale owner) appends to a conversation
			cv := convs[rng.IntN(len(convs))]
			h := st.head(cv)
			ext := sequencer.Message{MsgID: 1<<40 + uint64(step), ConvID: cv, Seq: h + 1, FromUID: 999, ClientMsgID: fmt.Sprint("ext", step)}
			if err := st.commit(&persist.ConvBatch{ConvID: cv, PrevHead: h, Messages: []sequencer.Message{ext}}); err != nil {
				t.Fatal(err)
			}
		default: // a store answer arrives
			for _, cv := range convs {
				if pendingOp[cv] != nil && rng.IntN(3) == 0 {
					execute(cv, true)
				}
			}
		}
	}
	// Drain without faults.
	fenceDown = false
	for range 1000 {
		busy := false
		for _, cv := range convs {
			if pendingOp[cv] != nil {
				busy = true
				execute(cv, false)
			}
		}
		if !busy {
			break
		}
	}
	byKey := map[sequencer.ClientKey]sequencer.SendResult{}
	outcomes := map[string]int{}
	for i, s := range sends {
		if len(s.replies) != 1 {
			t.Fatalf("send %d (%v) got %d replies", i, s.key, len(s.replies))
		}
		r := s.replies[0]
		switch {
		case r.Err != nil:
			outcomes[sequencer.ErrorCode(r.Err).String()]++
		case r.Result.Duplicate:
			outcomes["duplicate"]++
		default:
			outcomes["ok"]++
		}
		if r.Err != nil {
			if c := sequencer.ErrorCode(r.Err); !c.Retryable() && c != sequencer.CodeAlreadyExists && c != sequencer.CodeCanceled {
				t.Fatalf("send %d: unexpected error code %s: %v", i, c, r.Err)
			}
			continue
		}
		if prev, ok := byKey[s.key]; ok && (prev.MsgID != r.Result.MsgID || prev.Seq != r.Result.Seq) {
			t.Fatalf("key %v answered with two ids: %+v and %+v", s.key, prev, r.Result)
		}
		byKey[s.key] = r.Result
	}
	for _, cv := range convs {
		if !cores[cv].Idle() {
			t.Fatalf("%s not idle after drain", cv)
		}
		head := st.head(cv)
		rows := st.readRange(cv, 0, int(head)+1)
		if len(rows) != int(head) {
			t.Fatalf("%s: %d rows, head %d", cv, len(rows), head)
		}
		for i, m := range rows {
			if m.Seq != uint64(i+1) {
				t.Fatalf("%s: hole at seq %d (head %d)", cv, i+1, head)
			}
		}
		// The core may lag behind another writer (the store's head CAS
		// catches that on its next commit) but is never ahead of the store.
		if h, known := cores[cv].Head(); known && h > head {
			t.Fatalf("%s: core head %d ahead of stored %d", cv, h, head)
		}
	}
	t.Logf("outcomes: %v", outcomes)
	// The run must have exercised the interesting outcomes.
	for _, what := range []string{"ok", "duplicate", "already_exists", "unavailable", "canceled", "resource_exhausted"} {
		if outcomes[what] == 0 {
			t.Errorf("no %s outcome in this run: %v", what, outcomes)
		}
	}
}
