package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/commit"
	"github.com/sequencer-im/sequencer/persist"
)

type stallIDs struct{ n atomic.Uint64 }

func (c *stallIDs) NextID() (uint64, error) { return c.n.Add(1), nil }

// TestStalledBackendErrorAnswerIsFinal reproduces the way an error answer
// used to be a guess on PostgreSQL: the backend running a commit stalls
// (SIGSTOP, as a descheduled or fsync-blocked process would), the commit
// timeout fires, pgx cancels and closes the connection, and the backend,
// once it runs again, reads the pipelined BEGIN .. COMMIT from its socket
// buffer and commits. The writer must not answer before that transaction is
// finished: every error answer (not canceled / deadline_exceeded) must mean
// "not stored, ever", every ack must be stored, seqs stay 1..head.
//
// It signals the PostgreSQL backend process, so it runs as a user allowed to
// (root, or the postgres user); it fails otherwise.
func TestStalledBackendErrorAnswerIsFinal(t *testing.T) {
	stopped := make(chan int, 1)
	var armed atomic.Bool
	s, _ := newStore(t)
	s.onCommitBackend(func(pid uint32) {
		if armed.CompareAndSwap(true, false) {
			if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
				t.Errorf("SIGSTOP backend %d: %v (the test must run as root or postgres)", pid, err)
				return
			}
			stopped <- int(pid)
		}
	})
	n, err := actor.NewConversations(actor.Config{Store: s, IDs: &stallIDs{}, Commit: commit.Config{Timeout: time.Second, Workers: 2}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	send := func(conv, key string, timeout time.Duration) (sequencer.SendResult, error) {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return n.Send(cctx, sequencer.SendRequest{ConvID: conv, FromUID: 1, ClientMsgID: key, MsgType: 1, Body: []byte(key)})
	}
	if _, err := send("c", "warm", 5*time.Second); err != nil {
		t.Fatalf("warm-up send: %v", err)
	}

	type answer struct {
		conv, key string
		res       sequencer.SendResult
		err       error
		at        time.Time
	}
	var mu sync.Mutex
	var answers []answer
	var wg sync.WaitGroup
	armed.Store(true)
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conv := fmt.Sprintf("c%d", i%3)
			key := fmt.Sprintf("k%d", i)
			res, err := send(conv, key, 20*time.Second)
			mu.Lock()
			answers = append(answers, answer{conv, key, res, err, time.Now()})
			mu.Unlock()
		}()
	}
	var pid int
	select {
	case pid = <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("no commit reached the armed hook")
	}
	// The stall: several commit timeouts long. (The commit timeout is 1 s
	// so that even on a loaded machine the pipelined batch is written to
	// the socket before it fires: a batch never sent fails at once, as it
	// should, and proves nothing here.)
	time.Sleep(3500 * time.Millisecond)
	resumed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT %d: %v", pid, err)
	}
	wg.Wait()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := n.Close(cctx); err != nil {
		t.Fatalf("close: %v", err)
	}

	late := 0
	for _, a := range answers {
		if a.at.After(resumed) {
			late++
		}
		if a.err == nil {
			m, err := s.FindByClientKey(ctx, sequencer.ClientKey{FromUID: 1, ClientMsgID: a.key})
			if err != nil || m.Seq != a.res.Seq || m.MsgID != a.res.MsgID || m.ConvID != a.conv {
				t.Errorf("%s acked seq %d msg_id %d, stored %+v (%v)", a.key, a.res.Seq, a.res.MsgID, m, err)
			}
			continue
		}
		code := sequencer.ErrorCode(a.err)
		if code == sequencer.CodeCanceled || code == sequencer.CodeDeadlineExceeded {
			continue // not an answer
		}
		if m, err := s.FindByClientKey(ctx, sequencer.ClientKey{FromUID: 1, ClientMsgID: a.key}); err == nil {
			t.Errorf("%s answered %s (%v) but is stored at %s/%d", a.key, code, a.err, m.ConvID, m.Seq)
		}
	}
	if late == 0 {
		t.Errorf("no send was answered after the stalled backend resumed: the stalled commit's senders did not wait for its outcome")
	}
	for c := range 3 {
		conv := fmt.Sprintf("c%d", c)
		head, err := s.LoadHead(ctx, conv)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := s.ReadRange(ctx, conv, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(rows)) != head {
			t.Fatalf("%s: %d rows, head %d", conv, len(rows), head)
		}
		for i, r := range rows {
			if r.Seq != uint64(i+1) {
				t.Fatalf("%s: seq %d at %d", conv, r.Seq, i+1)
			}
		}
	}
	t.Logf("%d answers, %d after the backend resumed", len(answers), late)
}

// TestSettleConvsWaitsOnlyForItsOwnCommits: two commits of unknown outcome,
// one of conversation a and one of b, each on a backend that stalled
// (SIGSTOP) past the commit's deadline. Once a's backend runs again,
// SettleConvs(a) returns, while Settle and SettleConvs(b) cannot (b's
// backend is still stopped, so its transaction could still commit); after b
// resumes every call returns. A writer re-reading a is thus never held up
// by b (on Citus: by a worker that is down).
func TestSettleConvsWaitsOnlyForItsOwnCommits(t *testing.T) {
	ctx := context.Background()
	pids := make(chan int, 1)
	var armed atomic.Bool
	s, _ := newStore(t)
	s.onCommitBackend(func(pid uint32) {
		if armed.CompareAndSwap(true, false) {
			if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
				t.Errorf("SIGSTOP backend %d: %v (the test must run as root or postgres)", pid, err)
				pid = 0
			}
			pids <- int(pid)
		}
	})
	// Every commit connection prepares its statements on its first commit:
	// open and prepare them all now (concurrent commits), so that the
	// stalled commits below are sent whole.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Commit(ctx, []persist.ConvBatch{msgs(fmt.Sprintf("warm%d", i), 0, 1, uint64(1000+i))}); err != nil {
				t.Errorf("warm-up commit: %v", err)
			}
		}()
	}
	wg.Wait()
	stalled := map[string]int{}
	for i, conv := range []string{"a", "b"} {
		// A connection's first commit prepares its statements, which the
		// stopped backend never answers: nothing is sent, the commit fails
		// before COMMIT (not an unknown outcome). Try until a commit on a
		// prepared connection stalls after sending.
		for attempt := 0; ; attempt++ {
			armed.Store(true)
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			err := s.Commit(cctx, []persist.ConvBatch{msgs(conv, 0, 2, uint64(100*i+10*attempt+1))})
			cancel()
			pid := <-pids
			if pid == 0 {
				t.FailNow()
			}
			t.Logf("%s attempt %d: backend %d: %v", conv, attempt, pid, err)
			if errors.Is(err, sequencer.ErrUnknownOutcome) {
				stalled[conv] = pid
				break
			}
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if attempt == 20 {
				t.Fatalf("commit of %s on a stopped backend: %v, want an unknown outcome", conv, err)
			}
		}
	}
	t.Cleanup(func() {
		for _, pid := range stalled {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	settleWithin := func(d time.Duration, convs ...string) error {
		cctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		if convs == nil {
			return s.Settle(cctx)
		}
		return s.SettleConvs(cctx, convs)
	}
	if err := syscall.Kill(stalled["a"], syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := settleWithin(10*time.Second, "a"); err != nil {
		t.Fatalf("SettleConvs(a) with a's backend running: %v", err)
	}
	if err := settleWithin(500*time.Millisecond, "b"); err == nil {
		t.Fatal("SettleConvs(b) returned while b's commit could still land")
	}
	if err := settleWithin(500 * time.Millisecond); err == nil {
		t.Fatal("Settle returned while b's commit could still land")
	}
	if err := settleWithin(500*time.Millisecond, "c"); err != nil {
		t.Fatalf("SettleConvs of a conversation without unknown commits: %v", err)
	}
	if err := syscall.Kill(stalled["b"], syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := settleWithin(10 * time.Second); err != nil {
		t.Fatalf("Settle with every backend running: %v", err)
	}
}
