package actor

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/commit"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/faulty"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// proofConfig sizes a proof run.
type proofConfig struct {
	Seed      uint64
	Convs     int
	Senders   int
	PerSender int
	Rates     faulty.Rates
}

// sendLog is what the clients saw, by resend key.
type sendLog struct {
	mu        sync.Mutex
	successes map[sequencer.ClientKey][]success
	sentTo    map[sequencer.ClientKey]string // the conversation a key was first sent to
	keys      []sequencer.ClientKey
	// refused holds the keys of one-shot sends (never resent by anyone)
	// whose only answer was an error: they must never be stored.
	refused map[sequencer.ClientKey]error
}

type success struct {
	conv string
	res  sequencer.SendResult
}

// runProof drives Conversations over faulty.New(inner) with concurrent clients
// (new sends, resends of the same key by other clients, the same key in
// another conversation, callers that give up) while the store fails at
// random, then checks the invariants against the inner store:
//   - no ack before the row was durable (checked at each ack);
//   - acked == stored: every acked (msg_id, seq) is stored at that seq with
//     that key, and every stored row was acked to someone;
//   - each conversation's stored seqs are exactly 1..head;
//   - no msg_id repeats; every resend got the first send's ids;
//   - an error answer is final: a one-shot send (never resent) answered with
//     an error other than canceled / deadline_exceeded is never stored, not
//     even by a commit that lands after the answer (faulty.LandLate).
func runProof(t *testing.T, inner persist.Store, pc proofConfig) {
	fs := faulty.New(inner, pc.Seed, pc.Rates)
	m := metrics.New()
	n, err := NewConversations(Config{Store: fs, IDs: &counterIDs{}, Metrics: m, PassivateAfter: 2 * time.Millisecond,
		Commit: commit.Config{Timeout: 3 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lg := &sendLog{successes: map[sequencer.ClientKey][]success{}, sentTo: map[sequencer.ClientKey]string{},
		refused: map[sequencer.ClientKey]error{}}

	// send resends key to conv until it is stored or refused as
	// already_exists, like a client SDK.
	send := func(rng *rand.Rand, conv string, key sequencer.ClientKey, oneShot bool) {
		r := sequencer.SendRequest{ConvID: conv, FromUID: key.FromUID, ClientMsgID: key.ClientMsgID, MsgType: 1, Body: []byte(key.ClientMsgID)}
		for attempt := 0; ; attempt++ {
			if attempt == 500 {
				t.Errorf("%v to %s: no answer after 500 attempts", key, conv)
				return
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if rng.IntN(30) == 0 {
				cancel()
				cctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(2000))*time.Microsecond)
			}
			res, err := n.Send(cctx, r)
			cancel()
			if err == nil {
				if !fs.Durable(res.MsgID) {
					stored, gerr := inner.GetMessage(ctx, res.MsgID)
					if gerr != nil || stored.Seq != res.Seq || stored.ConvID != conv {
						t.Errorf("ack %+v for %v in %s before a durable write (stored: %+v, %v)", res, key, conv, stored, gerr)
					}
				}
				lg.mu.Lock()
				lg.successes[key] = append(lg.successes[key], success{conv, res})
				lg.mu.Unlock()
				return
			}
			switch code := sequencer.ErrorCode(err); {
			case oneShot && code != sequencer.CodeCanceled && code != sequencer.CodeDeadlineExceeded:
				lg.mu.Lock()
				lg.refused[key] = err
				lg.mu.Unlock()
				return
			case oneShot:
				return // outcome unknown: nothing to check
			case code == sequencer.CodeAlreadyExists:
				return
			case code.Retryable(), code == sequencer.CodeCanceled, code == sequencer.CodeDeadlineExceeded:
				if code == sequencer.CodeResourceExhausted {
					time.Sleep(time.Millisecond)
				}
			default:
				t.Errorf("%v to %s: unexpected error %s: %v", key, conv, code, err)
				return
			}
		}
	}

	var wg sync.WaitGroup
	for s := range pc.Senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(pc.Seed, uint64(s)))
			for i := range pc.PerSender {
				conv := fmt.Sprintf("g:%d", rng.IntN(pc.Convs))
				key := sequencer.ClientKey{FromUID: uint64(s + 1), ClientMsgID: fmt.Sprintf("s%d-%d", s, i)}
				lg.mu.Lock()
				oneShot := false
				switch p := rng.IntN(100); {
				case p < 15 && len(lg.keys) > 0: // resend someone's key to its conversation
					key = lg.keys[rng.IntN(len(lg.keys))]
					conv = lg.sentTo[key]
				case p < 18 && len(lg.keys) > 0: // the same key in another conversation
					key = lg.keys[rng.IntN(len(lg.keys))]
				case p < 30: // a fresh key sent once: its answer must be the truth
					oneShot = true
				default:
					lg.keys = append(lg.keys, key)
					lg.sentTo[key] = conv
				}
				lg.mu.Unlock()
				send(rng, conv, key, oneShot)
			}
		}()
	}
	wg.Wait()
	fs.SetRates(faulty.Rates{})
	closeCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := n.Close(closeCtx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if p := n.pending.Load(); p != 0 {
		t.Fatalf("%d sends never answered by their actor", p)
	}
	fs.WaitLate() // every late commit has run: the store is final
	if t.Failed() {
		return
	}

	// Read back everything.
	type at struct {
		conv string
		seq  uint64
	}
	byKey := map[sequencer.ClientKey]sequencer.Message{}
	byID := map[uint64]at{}
	rows := 0
	for c := range pc.Convs {
		conv := fmt.Sprintf("g:%d", c)
		head, err := inner.LoadHead(ctx, conv)
		if err != nil {
			t.Fatal(err)
		}
		var got []sequencer.Message
		for after := uint64(0); ; {
			page, err := inner.ReadRange(ctx, conv, after, 500)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			got = append(got, page...)
			after = page[len(page)-1].Seq
		}
		if uint64(len(got)) != head {
			t.Fatalf("%s: %d rows, head %d", conv, len(got), head)
		}
		for i, msg := range got {
			if msg.Seq != uint64(i+1) {
				t.Fatalf("%s: seq %d at position %d: hole or disorder", conv, msg.Seq, i+1)
			}
			if prev, dup := byID[msg.MsgID]; dup {
				t.Fatalf("msg_id %d at %s/%d and %s/%d", msg.MsgID, prev.conv, prev.seq, conv, msg.Seq)
			}
			byID[msg.MsgID] = at{conv, msg.Seq}
			if _, dup := byKey[msg.Key()]; dup {
				t.Fatalf("key %v stored twice", msg.Key())
			}
			byKey[msg.Key()] = msg
		}
		rows += len(got)
	}
	acks := 0
	for key, ss := range lg.successes {
		stored, ok := byKey[key]
		if !ok {
			t.Fatalf("acked %v (%+v) not stored", key, ss[0])
		}
		firsts := 0
		for _, s := range ss {
			acks++
			if s.conv != stored.ConvID || s.res.Seq != stored.Seq || s.res.MsgID != stored.MsgID || !s.res.ServerAt.Equal(stored.ServerAt) {
				t.Fatalf("%v acked %s %+v, stored %s seq %d msg_id %d at %v", key, s.conv, s.res, stored.ConvID, stored.Seq, stored.MsgID, stored.ServerAt)
			}
			if !s.res.Duplicate {
				firsts++
			}
		}
		if firsts > 1 {
			t.Fatalf("%v answered as a first send %d times", key, firsts)
		}
	}
	for key, err := range lg.refused {
		if m, ok := byKey[key]; ok {
			t.Fatalf("one-shot send %v was answered %q but is stored at %s/%d", key, err, m.ConvID, m.Seq)
		}
	}
	for key := range byKey {
		if len(lg.successes[key]) == 0 {
			if _, resent := lg.sentTo[key]; !resent {
				continue // a one-shot send whose caller gave up: it may be stored
			}
			t.Fatalf("stored %v was never acked", key)
		}
	}
	_, ctf := fs.Count(faulty.OpCommit, faulty.CommitThenFail)
	commits, drops := fs.Count(faulty.OpCommit, faulty.Drop)
	_, fails := fs.Count(faulty.OpCommit, faulty.FailBefore)
	_, late := fs.Count(faulty.OpCommit, faulty.LandLate)
	if pc.Rates != (faulty.Rates{}) && (ctf == 0 || drops == 0 || fails == 0 || late == 0 || len(lg.refused) == 0) {
		t.Fatalf("the fault schedule did not exercise every commit fault: %d commit-then-fail, %d drops, %d fail-before, %d land-late, %d refused one-shot sends",
			ctf, drops, fails, late, len(lg.refused))
	}
	t.Logf("%d rows in %d conversations, %d acks (%d keys), %d one-shot sends refused; %d commits: %d commit-then-fail, %d drops, %d fail-before, %d land-late; mean batch %.1f rows",
		rows, pc.Convs, acks, len(lg.successes), len(lg.refused), commits, ctf, drops, fails, late, meanBatch(t, m))
}

func meanBatch(t testing.TB, m *metrics.Set) float64 {
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sequencer_commit_batch_messages" {
			h := mf.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() == 0 {
				return 0
			}
			return h.GetSampleSum() / float64(h.GetSampleCount())
		}
	}
	return 0
}

var proofRates = faulty.Rates{FailBefore: 0.05, Delay: 0.05, CommitThenFail: 0.05, Drop: 0.05, LandLate: 0.05, MaxDelay: 2 * time.Millisecond}

func TestProofMemStore(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			runProof(t, memstore.New(), proofConfig{Seed: seed, Convs: 120, Senders: 32, PerSender: 40, Rates: proofRates})
		})
	}
}
