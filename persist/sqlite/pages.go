package sqlite

import (
	"context"
	"math"
	"slices"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// ReadBefore implements persist.PageReader: the newest limit rows below
// beforeSeq, read backwards and returned ascending.
func (s *Store) ReadBefore(ctx context.Context, convID string, afterSeq, beforeSeq uint64, limit int) ([]sequencer.Message, error) {
	if limit <= 0 || afterSeq >= math.MaxInt64 || beforeSeq <= afterSeq+1 {
		return nil, nil
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+messageColumns+` FROM im_message
		WHERE conv_id = ? AND seq > ? AND seq < ? ORDER BY seq DESC LIMIT ?`,
		convID, int64(afterSeq), int64(min(beforeSeq, math.MaxInt64)), limit)
	if err != nil {
		return nil, unavailable("read before", err)
	}
	defer rows.Close()
	out, err := persist.Collect(rows, func(r persist.Rows) (sequencer.Message, error) { return scanMessage(r) })
	if err != nil {
		return nil, unavailable("read before", err)
	}
	slices.Reverse(out)
	return out, nil
}

// ReadMany implements persist.PageReader one conversation at a time: the
// store is in this process, a read costs no round trip.
func (s *Store) ReadMany(ctx context.Context, cursors []persist.Cursor, limit, total int) ([]persist.Page, error) {
	return persist.ReadManyEach(ctx, s, cursors, limit, total)
}
