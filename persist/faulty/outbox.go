package faulty

import (
	"context"
	"fmt"

	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.Outbox = (*Store)(nil)

// outbox is the inner store's persist.Outbox.
func (s *Store) outbox() (persist.Outbox, error) {
	o, ok := s.Store.(persist.Outbox)
	if !ok {
		return nil, fmt.Errorf("faulty: inner store %T has no outbox", s.Store)
	}
	return o, nil
}

// OutboxPending passes through to the inner store (no faults: the
// firehose's tests inject theirs at the broker).
func (s *Store) OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]persist.OutboxRow, error) {
	o, err := s.outbox()
	if err != nil {
		return nil, err
	}
	return o.OutboxPending(ctx, part, after, limit)
}

// OutboxAdvance passes through to the inner store.
func (s *Store) OutboxAdvance(ctx context.Context, moves []persist.OutboxMove) error {
	o, err := s.outbox()
	if err != nil {
		return err
	}
	return o.OutboxAdvance(ctx, moves)
}

// OutboxSweep passes through to the inner store.
func (s *Store) OutboxSweep(ctx context.Context, keys []persist.OutboxKey) error {
	o, err := s.outbox()
	if err != nil {
		return err
	}
	return o.OutboxSweep(ctx, keys)
}
