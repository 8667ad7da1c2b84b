package sqlite

import (
	"context"
	"errors"
	"time"

	"github.com/sequencer-im/sequencer/persist"
)

// TrimBefore implements persist.Store (retention): see there. One step is
// one write transaction: the next limit conversations of conv_head after
// `after` (BINARY order), and for each the rows below its first seq that
// must stay (the lowest seq with server_at >= before, found by walking
// uk_conv_seq from the oldest stored row; head+1 when every stored row is
// older). conv_head is only read.
func (s *Store) TrimBefore(ctx context.Context, before time.Time, after string, limit int) (string, int, error) {
	if limit < 1 {
		return "", 0, errors.New("sqlite: trim: limit must be >= 1")
	}
	// server_at is stored in whole ms: a row at ms r is before `before` iff
	// r < ceil(before in ms).
	cut := before.UnixMilli()
	if before.Sub(time.UnixMilli(cut)) > 0 {
		cut++
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return "", 0, unavailable("trim before: begin", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT conv_id, head FROM conv_head WHERE conv_id > ? ORDER BY conv_id LIMIT ?`, after, limit)
	if err != nil {
		return "", 0, unavailable("trim before", err)
	}
	convs, err := persist.Collect(rows, persist.ScanConvHead)
	rows.Close()
	if err != nil {
		return "", 0, unavailable("trim before", err)
	}
	next, deleted, err := persist.TrimStep(convs, limit, func(c persist.ConvHead) (int, error) {
		res, err := tx.ExecContext(ctx, `DELETE FROM im_message WHERE conv_id = ?1 AND seq < COALESCE(
			(SELECT seq FROM im_message WHERE conv_id = ?1 AND server_at >= ?2 ORDER BY seq LIMIT 1), ?3)`,
			c.ConvID, cut, int64(c.Head)+1)
		if err != nil {
			return 0, err
		}
		n, _ := res.RowsAffected()
		return int(n), nil
	})
	if err != nil {
		return "", 0, unavailable("trim before", err)
	}
	if err := tx.Commit(); err != nil {
		return "", 0, unavailable("trim before: commit", err)
	}
	return next, deleted, nil
}
