package memstore

import (
	"context"
	"slices"
	"strings"

	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.Outbox = (*Store)(nil)

type outboxKey struct {
	part uint32
	conv string
}

// writeOutbox records the commit's conversations in the outbox (s.mu held).
func (s *Store) writeOutbox(batches []persist.ConvBatch) {
	for _, r := range persist.OutboxRowsOf(batches) {
		k := outboxKey{r.Partition, r.ConvID}
		var old *persist.OutboxRow
		if o, ok := s.outbox[k]; ok {
			old = &o
		}
		s.outbox[k] = persist.OutboxUpsert(old, r)
	}
}

// OutboxPending implements persist.Outbox.
func (s *Store) OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]persist.OutboxRow, error) {
	if err := s.enter(ctx, "outbox pending"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var rows []persist.OutboxRow
	for k, r := range s.outbox {
		if k.part == part && k.conv > after {
			r.Head = s.head(k.conv)
			rows = append(rows, r)
		}
	}
	slices.SortFunc(rows, func(a, b persist.OutboxRow) int { return strings.Compare(a.ConvID, b.ConvID) })
	if len(rows) > limit {
		rows = rows[:limit]
	}
	return rows, nil
}

// OutboxAdvance implements persist.Outbox.
func (s *Store) OutboxAdvance(ctx context.Context, moves []persist.OutboxMove) error {
	if err := s.enter(ctx, "outbox advance"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	for _, m := range moves {
		k := outboxKey{m.Partition, m.ConvID}
		if r, ok := s.outbox[k]; ok {
			s.outbox[k] = persist.OutboxAdvanced(r, m.To)
		}
	}
	return nil
}

// OutboxSweep implements persist.Outbox (commits hold s.mu: none is in
// progress during a sweep).
func (s *Store) OutboxSweep(ctx context.Context, keys []persist.OutboxKey) error {
	if err := s.enter(ctx, "outbox sweep"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	for _, key := range keys {
		k := outboxKey{key.Partition, key.ConvID}
		if r, ok := s.outbox[k]; ok && persist.OutboxSwept(r.Published, s.head(k.conv)) {
			delete(s.outbox, k)
		}
	}
	return nil
}
