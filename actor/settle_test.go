package actor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/commit"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// convSettlerStore commits, then reports its first commit's outcome as
// unknown; it records the settle calls.
type convSettlerStore struct {
	*memstore.Store
	mu        sync.Mutex
	lied      bool
	settles   int
	convCalls [][]string
}

func (s *convSettlerStore) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	if err := s.Store.Commit(ctx, batches); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.lied {
		s.lied = true
		return fmt.Errorf("test: %w", sequencer.ErrUnknownOutcome)
	}
	return nil
}

func (s *convSettlerStore) Settle(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settles++
	return nil
}

func (s *convSettlerStore) SettleConvs(ctx context.Context, convIDs []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.convCalls = append(s.convCalls, slices.Clone(convIDs))
	return nil
}

// After an unknown outcome the writer settles only its own conversation's
// commits when the store can tell them apart (persist.ConvSettler), then
// re-reads and acks: the message was stored.
func TestUnknownOutcomeSettlesOnlyItsConversation(t *testing.T) {
	st := &convSettlerStore{Store: memstore.New()}
	n := newNode(t, Config{Store: st})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := n.Send(ctx, req("s:one", "k1"))
	if err != nil || res.Seq != 1 {
		t.Fatalf("send after an unknown outcome that landed: %+v, %v", res, err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.settles != 0 || len(st.convCalls) == 0 || !slices.Equal(st.convCalls[0], []string{"s:one"}) {
		t.Fatalf("Settle called %d times, SettleConvs %v; want SettleConvs([s:one]) only", st.settles, st.convCalls)
	}
}

// stuckSettleStore is a convSettlerStore (the first commit's outcome is
// reported unknown) whose first settle is held until the attempt is
// cancelled (a dial to a store cut off, begun before the heal) or, with
// failFirst, fails at once; later settles succeed.
type stuckSettleStore struct {
	*convSettlerStore
	failFirst bool
	entered   chan struct{} // closed when the first settle began
	settles   int           // under convSettlerStore.mu
}

func (s *stuckSettleStore) SettleConvs(ctx context.Context, convIDs []string) error {
	s.mu.Lock()
	s.settles++
	first := s.settles == 1
	s.mu.Unlock()
	if !first {
		return nil
	}
	close(s.entered)
	if s.failFirst {
		return errors.New("test: connection refused")
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestStopKicksASettlingConversation: a conversation whose commit outcome
// is unknown leaves at a stop (a handoff, a step-down) as soon as the store
// answers again, not when its stuck attempt times out or its backoff ends:
// the stop cancels the attempt under way (or skips the rest of the
// backoff) and the next one goes at once. Here the attempt would wait an
// hour (Commit.Timeout) and the backoff never ends (a clock that does not
// move), so StopConversations returns only through the kick; the send is
// answered with what the re-read found (stored at seq 1).
func TestStopKicksASettlingConversation(t *testing.T) {
	for _, tc := range []struct {
		name      string
		failFirst bool
	}{{"attempt under way", false}, {"in the backoff", true}} {
		t.Run(tc.name, func(t *testing.T) {
			st := &stuckSettleStore{convSettlerStore: &convSettlerStore{Store: memstore.New()}, failFirst: tc.failFirst, entered: make(chan struct{})}
			logFile, err := os.Create(filepath.Join(t.TempDir(), "node.log"))
			if err != nil {
				t.Fatal(err)
			}
			defer logFile.Close()
			n := newNode(t, Config{Store: st, Clock: clock.NewFake(time.Unix(1_700_000_000, 0)),
				Commit: commit.Config{Timeout: time.Hour}, Logger: slog.New(slog.NewTextHandler(logFile, nil))})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ans := sendAsync(n, ctx, req("s:one", "k1"))
			<-st.entered
			if tc.failFirst {
				// The failed attempt's answer reached the actor, and the
				// next one waits out its backoff (which never ends here).
				waitFor(t, "the second attempt's backoff", func() bool {
					return n.cfg.Clock.(*clock.Fake).Pending() > 0
				})
			}
			if err := n.StopConversations(ctx, func(string) bool { return true }); err != nil {
				t.Fatalf("the settling conversation did not leave at the stop: %v", err)
			}
			a := <-ans
			if a.err != nil || a.res.Seq != 1 {
				t.Fatalf("send: %+v, %v; want stored at seq 1", a.res, a.err)
			}
			st.mu.Lock()
			defer st.mu.Unlock()
			if st.settles != 2 {
				t.Fatalf("%d settle attempts, want 2 (the stuck or failed one, then one at once)", st.settles)
			}
			// Only a failure of the store warns, not the kick's cancel (a
			// routine drain logs no WARN).
			if logged, err := os.ReadFile(logFile.Name()); err != nil || strings.Contains(string(logged), "context canceled") {
				t.Fatalf("the kicked attempt was logged as a failure (%v):\n%s", err, logged)
			}
		})
	}
}
