package postgres

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/commit"
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
	s, _ := newStore(t)
	stopped := make(chan int, 1)
	var armed atomic.Bool
	s.beforeCommit = func(pid uint32) {
		if armed.CompareAndSwap(true, false) {
			if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
				t.Errorf("SIGSTOP backend %d: %v (the test must run as root or postgres)", pid, err)
				return
			}
			stopped <- int(pid)
		}
	}
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
