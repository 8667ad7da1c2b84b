package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/history"
	"github.com/sequencer-im/sequencer/persist"
)

// ack is what a client was told about one client_msg_id.
type ack struct {
	conv  string
	from  uint64
	cid   string
	msgID uint64
	seq   uint64
}

// ledger records every send attempt and read of the clients, so the store
// can be checked against what users were promised.
//
// During a run it holds nothing a garbage collection must trace per
// message: the attempts go to a file (history.NewFileRecorder), and the
// progress counts are kept over 64-bit hashes of the acked keys. A soak's
// millions of keys held as strings made every collection mark gigabytes of
// pointers, and the test process, which runs the clients and the proxies
// the nodes reach the store through, stalled for seconds (docs/TESTING.md
// "Soak", run 8). verify derives the acks exactly from the history.
type ledger struct {
	mu      sync.Mutex
	acked   map[uint64]struct{} // hashes of the keys acked so far (progress only)
	perConv map[string]int      // distinct keys acked per conversation (progress only)
	// hist is every attempt of every client (load.sendUntilAcked records
	// them), checked by verify against the append-only log model.
	hist *history.Recorder
}

func newLedger() *ledger {
	hist, err := history.NewFileRecorder("")
	if err != nil {
		panic(fmt.Sprintf("e2e: the history's file: %v", err))
	}
	return &ledger{acked: map[uint64]struct{}{}, perConv: map[string]int{}, hist: hist}
}

// record notes an ack for the progress counts (count, countIn); the ack
// itself is in the history, which verify checks. Two keys with one hash
// count once: a count may be short by a key, never long.
func (l *ledger) record(a ack) {
	h := xxhash.Sum64String(historyKey(a.from, a.cid))
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.acked[h]; ok {
		return
	}
	l.acked[h] = struct{}{}
	l.perConv[a.conv]++
}

// attempt records one send attempt that started at call (l.hist.Now())
// and ended now with err: in the history, and as an ack when err is nil.
// Tests that send outside load use it so their sends are checked too.
func (l *ledger) attempt(client int, conv string, from uint64, cid string, call time.Duration, msgID, seq uint64, dup bool, err error) {
	code, outcome := sendOutcome(err)
	l.hist.Add(history.Op{Kind: history.Send, Conv: conv, Client: client, Key: historyKey(from, cid),
		Call: call, Return: l.hist.Now(), Outcome: outcome, Code: code, Seq: seq, MsgID: msgID, Duplicate: dup})
	if err == nil {
		l.record(ack{conv: conv, from: from, cid: cid, msgID: msgID, seq: seq})
	}
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// countIn is how many distinct messages were acked in the conversations of
// in.
func (l *ledger) countIn(in map[string]bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for conv := range in {
		n += l.perConv[conv]
	}
	return n
}

// promise is what a client was told of a key: the first answer to it.
type promise struct {
	conv       string
	msgID, seq uint64
}

// promises reads from a history what clients were promised: the first
// answer to each key, which every later answer to it must repeat (resends
// counts those later answers, mismatches says which did not).
func promises(ops []history.Op) (acks map[string]promise, resends int, mismatches []string) {
	acks = map[string]promise{}
	for _, o := range ops {
		if o.Kind != history.Send || o.Outcome != history.OK {
			continue
		}
		p := promise{o.Conv, o.MsgID, o.Seq}
		prev, ok := acks[o.Key]
		if !ok {
			acks[o.Key] = p
			continue
		}
		resends++
		if p != prev {
			mismatches = append(mismatches, fmt.Sprintf("resend of %s got (%d,%d) in %s, first ack was (%d,%d) in %s",
				o.Key, p.msgID, p.seq, p.conv, prev.msgID, prev.seq, prev.conv))
		}
	}
	return acks, resends, mismatches
}

// verify checks the invariants against the store: every acked message is
// stored at its seq with its msg_id; each conversation's seqs are exactly
// 1..head; no msg_id repeats; resends got the first ids. It returns the
// counts of the whole history it checked.
func (l *ledger) verify(t *testing.T, st persist.Store, convs []string) history.Counts {
	t.Helper()
	ctx := context.Background()
	l.mu.Lock()
	defer l.mu.Unlock()
	ops := l.hist.Ops()
	acks, resends, mismatches := promises(ops)
	for _, m := range mismatches {
		t.Error(m)
	}
	sent := map[string]bool{}
	for _, o := range ops {
		if o.Kind == history.Send {
			sent[o.Key] = true
		}
	}
	add := func(o history.Op) {
		ops = append(ops, o)
		l.hist.Add(o)
	}
	stored := map[string]map[uint64]sequencer.Message{}
	msgIDs := map[uint64]string{}
	untracked := 0
	for _, c := range convs {
		head, err := st.LoadHead(ctx, c)
		if err != nil {
			t.Fatalf("head %s: %v", c, err)
		}
		rows, err := st.ReadRange(ctx, c, 0, int(head)+10)
		if err != nil {
			t.Fatalf("range %s: %v", c, err)
		}
		if uint64(len(rows)) != head {
			t.Errorf("conv %s: head %d but %d rows stored", c, head, len(rows))
		}
		m := map[uint64]sequencer.Message{}
		for i, r := range rows {
			if r.Seq != uint64(i+1) {
				t.Errorf("conv %s: row %d has seq %d (hole or disorder)", c, i, r.Seq)
				break
			}
			if other, dup := msgIDs[r.MsgID]; dup {
				t.Errorf("msg_id %d stored twice (%s and %s)", r.MsgID, other, c)
			}
			msgIDs[r.MsgID] = c
			m[r.Seq] = r
		}
		stored[c] = m
		// The store's final state is the last read of the history: a hole,
		// a doubled key or a message whose every send got an error shows here.
		// Rows the harness did not send (a test's own sends outside load) enter
		// as sends of unknown outcome by an untracked client.
		at := l.hist.Now()
		for _, r := range rows {
			if k := historyKey(r.FromUID, r.ClientMsgID); !sent[k] {
				untracked++
				add(history.Op{Kind: history.Send, Conv: c, Client: -1, Key: k, Outcome: history.Unknown, Code: history.Untracked})
			}
		}
		fin := history.Op{Kind: history.Pull, Conv: c, Node: "store", Client: -1, Call: at, Return: at, Outcome: history.OK, Final: true}
		for _, r := range rows {
			fin.Keys = append(fin.Keys, historyKey(r.FromUID, r.ClientMsgID))
			fin.Seqs = append(fin.Seqs, r.Seq)
		}
		add(fin)
	}
	if untracked > 0 {
		t.Logf("history: %d stored rows were sent outside the recorded load", untracked)
	}
	counts := checkHistory(t, ops)
	for k, a := range acks {
		r, ok := stored[a.conv][a.seq]
		if !ok {
			t.Errorf("acked %s at %s seq %d is not stored", k, a.conv, a.seq)
			continue
		}
		if r.MsgID != a.msgID || historyKey(r.FromUID, r.ClientMsgID) != k {
			t.Errorf("acked %s (msg_id %d) at %s seq %d, but stored is %d from %d %q", k, a.msgID, a.conv, a.seq, r.MsgID, r.FromUID, r.ClientMsgID)
		}
	}
	t.Logf("verified %d acked messages (%d resend answers) over %d conversations, %d stored rows", len(acks), resends, len(convs), len(msgIDs))
	return counts
}

func historyKey(from uint64, cid string) string { return fmt.Sprintf("%d/%s", from, cid) }

// historyTimeout bounds porcupine's search; a search that does not finish
// fails the test (the history was not checked). A soak (SOAK_MINUTES) gives
// it 15 s more per minute of history: a 60-minute soak's 2.7 million
// operations did not check within 2 minutes beside other work.
func historyTimeout() time.Duration {
	d := 2 * time.Minute
	if v, err := strconv.ParseFloat(os.Getenv("SOAK_MINUTES"), 64); err == nil && v > 0 {
		d += time.Duration(v * float64(15*time.Second))
	}
	return d
}

// checkHistory checks ops (every recorded operation) against the append-only log
// model (internal/history); a failing history is written, with porcupine's
// visualisation, to $SEQUENCER_TEST_ARTIFACTS (default test-artifacts/ at the
// repository root). It returns the history's counts.
func checkHistory(t *testing.T, ops []history.Op) history.Counts {
	t.Helper()
	for i := range ops {
		if ops[i].Client < 0 { // the final store reads: a client of their own
			ops[i].Client = 100000
		}
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	res, err := history.Check(ops, historyTimeout(), historyArtifacts(), name)
	if err != nil {
		t.Errorf("history check: %v", err)
	}
	if !res.OK() {
		t.Errorf("%v", res)
	} else {
		t.Logf("%v", res)
	}
	return res.Counts
}

func historyArtifacts() string {
	if d := os.Getenv(artifactsEnv); d != "" {
		return d
	}
	return filepath.Join("..", "test-artifacts")
}
