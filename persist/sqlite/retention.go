package sqlite

import (
	"context"
	"errors"
	"time"
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
	type conv struct {
		id   string
		head int64
	}
	var convs []conv
	for rows.Next() {
		var c conv
		if err := rows.Scan(&c.id, &c.head); err != nil {
			rows.Close()
			return "", 0, unavailable("trim before", err)
		}
		convs = append(convs, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", 0, unavailable("trim before", err)
	}
	deleted := 0
	for _, c := range convs {
		res, err := tx.ExecContext(ctx, `DELETE FROM im_message WHERE conv_id = ?1 AND seq < COALESCE(
			(SELECT seq FROM im_message WHERE conv_id = ?1 AND server_at >= ?2 ORDER BY seq LIMIT 1), ?3)`,
			c.id, cut, c.head+1)
		if err != nil {
			return "", 0, unavailable("trim before", err)
		}
		n, _ := res.RowsAffected()
		deleted += int(n)
	}
	if err := tx.Commit(); err != nil {
		return "", 0, unavailable("trim before: commit", err)
	}
	if len(convs) < limit {
		return "", deleted, nil
	}
	return convs[len(convs)-1].id, deleted, nil
}
