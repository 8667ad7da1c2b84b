package memstore

import (
	"context"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// ReadBefore implements persist.PageReader.
func (s *Store) ReadBefore(ctx context.Context, convID string, afterSeq, beforeSeq uint64, limit int) ([]sequencer.Message, error) {
	if err := s.enter(ctx, "read before"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	c := s.convs[convID]
	if c == nil || limit <= 0 || beforeSeq == 0 {
		return nil, nil
	}
	lo, hi := find(c.rows, afterSeq), find(c.rows, beforeSeq-1)
	if hi-lo > limit {
		lo = hi - limit
	}
	var msgs []sequencer.Message
	for _, m := range c.rows[lo:max(lo, hi)] {
		msgs = append(msgs, out(m))
	}
	return msgs, nil
}

// ReadMany implements persist.PageReader under one lock (one snapshot).
func (s *Store) ReadMany(ctx context.Context, cursors []persist.Cursor, limit, total int) ([]persist.Page, error) {
	if err := s.enter(ctx, "read many"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	pages := make([]persist.Page, len(cursors))
	for i, cur := range cursors {
		c := s.convs[cur.ConvID]
		if c == nil {
			continue
		}
		pages[i].Head = c.head
		rows := c.rows[find(c.rows, cur.AfterSeq):]
		rows = rows[:min(limit, total, len(rows))]
		for _, m := range rows {
			pages[i].Messages = append(pages[i].Messages, out(m))
		}
		total -= len(rows)
	}
	return pages, nil
}
