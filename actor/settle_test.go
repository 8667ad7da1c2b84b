package actor

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
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
