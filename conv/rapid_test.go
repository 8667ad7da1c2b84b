package conv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sequencer-im/sequencer/internal/rapidmutant"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// convMutation, when set, breaks the harness on purpose (see
// TestRapidCoreMutantsFail): the properties must then fail.
var convMutation string

const rapidConv = "r"

// rapidStore is the reference model: a memstore the harness applies a
// commit to whenever the drawn fault says it landed.
type rapidStore struct {
	t *rapid.T
	s *memstore.Store
}

func (m rapidStore) commit(b *persist.ConvBatch) error {
	return m.s.Commit(context.Background(), []persist.ConvBatch{*b})
}

func (m rapidStore) head() uint64 {
	h, err := m.s.LoadHead(context.Background(), rapidConv)
	if err != nil {
		m.t.Fatal(err)
	}
	return h
}

func (m rapidStore) rows(after uint64, n int) []sequencer.Message {
	ms, err := m.s.ReadRange(context.Background(), rapidConv, after, n)
	if err != nil {
		m.t.Fatal(err)
	}
	return ms
}

// convMachine is the state of one rapid run: one core, the store, another
// writer, and every send made with what it was answered.
type convMachine struct {
	t       *rapid.T
	st      rapidStore
	core    *Core
	pending *Ready // the store operation outstanding (LoadHead, Commit, Resolve or Lookup)
	ids     uint64
	now     time.Time
	ext     int

	sends   []*sendRec
	cancels []func() // the caller of send i gives up
	keys    []sequencer.ClientKey
	acked   map[sequencer.ClientKey]sequencer.SendResult // first ack of each key
}

// TestRapidCore drives conv.Core with random sequences of sends (new keys
// and resends), cancellations, store answers with drawn faults, formations
// with drawn faults and another writer, checking the invariants after
// every step and, at the end, after draining without faults.
func TestRapidCore(t *testing.T) {
	convSeen = map[string]int{}
	rapid.Check(t, convProperty)
	t.Logf("seen: %v", convSeen)
	if convSeen["runs"] < 50 {
		return // a replay (-rapid.failfile, -rapid.checks): too few runs to ask for coverage
	}
	// The runs must have reached the interesting paths.
	for _, what := range []string{"ok", "duplicate", "unavailable", "canceled", "resolve", "lookup", "load"} {
		if convSeen[what] == 0 {
			t.Errorf("no %s in %d runs: %v", what, convSeen["runs"], convSeen)
		}
	}
}

// convSeen counts what the runs of TestRapidCore reached (replies by
// outcome, store operations by kind).
var convSeen map[string]int

func seen(what string) {
	if convSeen != nil {
		convSeen[what]++
	}
}

func convProperty(t *rapid.T) {
	c, err := New(Config{ConvID: rapidConv, MaxQueue: 6, MaxBatch: 3, MemoSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	m := &convMachine{t: t, st: rapidStore{t, memstore.New()}, core: c, ids: 1000,
		now:   time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		acked: map[sequencer.ClientKey]sequencer.SendResult{}}
	seen("runs")
	t.Repeat(map[string]func(*rapid.T){
		"send": func(t *rapid.T) {
			key := sequencer.ClientKey{FromUID: 7, ClientMsgID: fmt.Sprint("k", len(m.keys))}
			m.keys = append(m.keys, key)
			m.send(key)
		},
		"resend": func(t *rapid.T) {
			if len(m.keys) == 0 {
				t.Skip("no key")
			}
			m.send(rapid.SampledFrom(m.keys).Draw(t, "key"))
		},
		"cancel": func(t *rapid.T) {
			if len(m.cancels) == 0 {
				t.Skip("no send")
			}
			m.cancels[rapid.IntRange(0, len(m.cancels)-1).Draw(t, "send")]()
		},
		"answer": func(t *rapid.T) {
			if m.pending == nil {
				t.Skip("no store operation outstanding")
			}
			m.answer(true)
		},
		"other writer": func(t *rapid.T) {
			h := m.st.head()
			if convMutation == "skip-seq" {
				// The other writer's store moves the head past a seq
				// that has no row, and the row goes after it.
				h++
				if err := m.st.s.SetHeadForTest(context.Background(), rapidConv, h); err != nil {
					t.Fatal(err)
				}
			}
			m.ext++
			row := sequencer.Message{MsgID: 1<<40 + uint64(m.ext), ConvID: rapidConv, Seq: h + 1, FromUID: 999,
				ClientMsgID: fmt.Sprint("ext", m.ext), ServerAt: m.now}
			if err := m.st.commit(&persist.ConvBatch{ConvID: rapidConv, PrevHead: h, Messages: []sequencer.Message{row}}); err != nil {
				t.Fatal(err)
			}
		},
		"": func(t *rapid.T) { m.checkStore() },
	})
	// Drain: every outstanding operation answered without faults.
	for i := 0; m.pending != nil && convMutation != "no-drain"; i++ {
		if i > 1000 {
			t.Fatal("drain does not end")
		}
		m.answer(false)
	}
	m.checkEnd()
}

// send sends key's message (the same content each time).
func (m *convMachine) send(key sequencer.ClientKey) {
	tok := len(m.sends)
	m.cancels = append(m.cancels, func() { m.core.Cancel(tok, key, context.Canceled) })
	m.sends = append(m.sends, &sendRec{conv: rapidConv, key: key})
	m.core.Send(tok, sequencer.SendRequest{ConvID: rapidConv, FromUID: key.FromUID,
		ClientMsgID: key.ClientMsgID, MsgType: 1, Body: []byte("b")})
	if convMutation == "forget-op" && m.pending != nil && m.pending.Commit != nil && len(m.core.queue) > 0 {
		// A send queued behind a commit makes the core forget the commit
		// it has out and form the next batch.
		m.core.op = opNone
		m.core.advance()
	}
	m.pump(true)
}

// pump takes the core's Ready, answers a Form at once (with a drawn fault
// if faulty) and checks what it holds.
func (m *convMachine) pump(faulty bool) {
	for {
		rd := m.core.Ready()
		m.record(rd.Replies)
		ops := 0
		for _, set := range []bool{rd.LoadHead, rd.Commit != nil, rd.Resolve != nil, len(rd.Lookup) > 0} {
			if set {
				ops++
			}
		}
		if (ops > 0 || rd.Form > 0) && m.pending != nil {
			m.t.Fatalf("one store op: a new operation (%d ops, form %d) while one is outstanding: %+v", ops, rd.Form, *m.pending)
		}
		if ops > 1 || (ops > 0 && rd.Form > 0) {
			m.t.Fatalf("one store op: one Ready asks %d operations and form %d", ops, rd.Form)
		}
		if ops == 1 {
			switch {
			case rd.LoadHead:
				seen("load")
			case rd.Resolve != nil:
				seen("resolve")
			case len(rd.Lookup) > 0:
				seen("lookup")
			}
			cp := rd
			m.pending = &cp
		}
		if rd.Form == 0 {
			return
		}
		m.core.Formed(m.formation(rd.Form, faulty))
	}
}

func (m *convMachine) formation(n int, faulty bool) Formation {
	kind := 0
	if faulty {
		kind = rapid.IntRange(0, 9).Draw(m.t, "formation") // 1, 2: faults
	}
	f := Formation{Now: m.now}
	switch kind {
	case 1:
		return Formation{FenceErr: sequencer.ErrOwnershipMoving}
	case 2:
		n = rapid.IntRange(0, n-1).Draw(m.t, "ids")
		f.IDErr = sequencer.Errorf(sequencer.CodeUnavailable, "worker lease lost")
	}
	for range n {
		m.ids++
		f.IDs = append(f.IDs, m.ids)
	}
	m.now = m.now.Add(time.Millisecond)
	return f
}

// Commit faults.
const (
	cmOK          = iota // applied, answered by the store itself
	cmLandedLost         // applied, answer lost: unknown outcome
	cmDropped            // not applied, unknown outcome
	cmUnavailable        // not applied: store unavailable before COMMIT
	cmMismatch           // not applied: head mismatch
	cmStale              // not applied: stale fence
	cmFaults
)

// answer completes the outstanding store operation.
func (m *convMachine) answer(faulty bool) {
	rd := m.pending
	m.pending = nil
	c, t := m.core, m.t
	fail := faulty && rapid.IntRange(0, 3).Draw(t, "read fault") == 0
	switch {
	case rd.LoadHead:
		if fail {
			c.HeadLoaded(0, sequencer.ErrStoreUnavailable)
		} else {
			c.HeadLoaded(m.st.head(), nil)
		}
	case rd.Commit != nil:
		fault := cmOK
		if faulty {
			// Half the commits succeed.
			if fault = rapid.IntRange(0, 2*cmFaults-1).Draw(t, "commit fault"); fault >= cmFaults {
				fault = cmOK
			}
		}
		switch fault {
		case cmOK:
			if convMutation == "ack-unwritten" {
				c.Committed(nil)
			} else {
				c.Committed(m.st.commit(rd.Commit))
			}
		case cmLandedLost:
			err := m.st.commit(rd.Commit)
			switch {
			case err != nil:
				c.Committed(err)
			case convMutation == "lost-as-unavailable":
				c.Committed(fmt.Errorf("dial: %w", sequencer.ErrStoreUnavailable))
			default:
				c.Committed(sequencer.ErrUnknownOutcome)
			}
		case cmDropped:
			c.Committed(sequencer.ErrUnknownOutcome)
		case cmUnavailable:
			c.Committed(fmt.Errorf("dial: %w", sequencer.ErrStoreUnavailable))
		case cmMismatch:
			c.Committed(fmt.Errorf("commit: %w", sequencer.ErrHeadMismatch))
		case cmStale:
			c.Committed(&persist.StaleFenceError{Fences: []persist.Fence{{Partition: 1, Owner: "old", Epoch: 1}}})
		}
	case rd.Resolve != nil:
		if fail {
			c.Resolved(0, nil, sequencer.ErrStoreUnavailable)
		} else {
			c.Resolved(m.st.head(), m.st.rows(rd.Resolve.AfterSeq, rd.Resolve.Count), nil)
		}
	case len(rd.Lookup) > 0:
		var rs []LookupResult
		for _, k := range rd.Lookup {
			msg, err := m.st.s.FindByClientKey(context.Background(), k)
			switch {
			case fail:
				rs = append(rs, LookupResult{Key: k, Err: sequencer.ErrStoreUnavailable})
			case err != nil:
				rs = append(rs, LookupResult{Key: k, Err: err})
			default:
				if convMutation == "lookup-other-id" {
					msg.MsgID += 1 << 30
				}
				rs = append(rs, LookupResult{Key: k, Msg: msg})
			}
		}
		c.LookedUp(rs)
	}
	m.pump(faulty)
}

// record checks each reply as it is given: answered once, a duplicate
// carries the first ack's ids, an ack is durable at its seq.
func (m *convMachine) record(replies []Reply) {
	t := m.t
	for _, r := range replies {
		s := m.sends[r.Token.(int)]
		s.replies = append(s.replies, r)
		if len(s.replies) > 1 {
			t.Fatalf("answered once: send %d (%v) answered twice: %+v", r.Token, s.key, s.replies)
		}
		switch {
		case r.Err != nil:
			seen(sequencer.ErrorCode(r.Err).String())
			continue
		case r.Result.Duplicate:
			seen("duplicate")
		default:
			seen("ok")
		}
		if first, ok := m.acked[s.key]; ok && (first.MsgID != r.Result.MsgID || first.Seq != r.Result.Seq) {
			t.Fatalf("duplicate ids: key %v acked with %d@%d, first with %d@%d", s.key, r.Result.MsgID, r.Result.Seq, first.MsgID, first.Seq)
		} else if !ok {
			m.acked[s.key] = r.Result
		}
		rows := m.st.rows(r.Result.Seq-1, 1)
		if len(rows) == 0 || rows[0].Seq != r.Result.Seq || rows[0].MsgID != r.Result.MsgID || rows[0].Key() != s.key {
			t.Fatalf("ack durable: send %d (%v) acked %d@%d, stored %+v", r.Token, s.key, r.Result.MsgID, r.Result.Seq, rows)
		}
	}
}

// checkStore: the stored seqs are 1..head with no hole.
func (m *convMachine) checkStore() {
	h := m.st.head()
	rows := m.st.rows(0, int(h)+1)
	if len(rows) != int(h) {
		m.t.Fatalf("no hole: %d rows, head %d", len(rows), h)
	}
	for i, r := range rows {
		if r.Seq != uint64(i+1) {
			m.t.Fatalf("no hole: row %d has seq %d", i, r.Seq)
		}
	}
}

// checkEnd: every send answered exactly once, and an error answer is never
// for a message that got stored (unless a send of that key was acked).
func (m *convMachine) checkEnd() {
	t := m.t
	m.checkStore()
	for i, s := range m.sends {
		if len(s.replies) != 1 {
			t.Fatalf("answered once: send %d (%v) has %d answers after the drain", i, s.key, len(s.replies))
		}
		r := s.replies[0]
		if r.Err == nil {
			continue
		}
		if c := sequencer.ErrorCode(r.Err); !c.Retryable() && c != sequencer.CodeCanceled {
			t.Fatalf("send %d: error code %s: %v", i, c, r.Err)
		}
		if _, ok := m.acked[s.key]; ok {
			continue
		}
		if msg, err := m.st.s.FindByClientKey(context.Background(), s.key); !errors.Is(err, sequencer.ErrNotFound) {
			t.Fatalf("error never stored: send %d (%v) answered %v, but stored %+v (err %v)", i, s.key, r.Err, msg, err)
		}
	}
	if !m.core.Idle() {
		t.Fatal("answered once: core not idle after the drain")
	}
}

// TestRapidCoreMutantsFail shows each property able to fail: with the
// harness broken on purpose, rapid must report the property's failure.
func TestRapidCoreMutantsFail(t *testing.T) {
	for _, c := range []struct{ mutation, property string }{
		{"ack-unwritten", "ack durable"},              // the store says ok without writing
		{"lost-as-unavailable", "error never stored"}, // a landed commit reported as not landed
		{"lookup-other-id", "duplicate ids"},          // a resend's lookup returns other ids
		{"no-drain", "answered once"},                 // the last store answers never come
		{"skip-seq", "no hole"},                       // another writer's row lands a seq past the head
		{"forget-op", "one store op"},                 // a queued send makes the core forget its commit and form another
	} {
		t.Run(c.mutation, func(t *testing.T) {
			rapidmutant.Fails(t, &convMutation, c.mutation, c.property, convProperty)
		})
	}
}
