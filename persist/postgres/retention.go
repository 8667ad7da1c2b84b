package postgres

import (
	"context"
	"errors"
	"time"
)

// trimBeforeSQL is one retention step in one statement: the next $3
// conversations of conv_head after $2, and for each the first seq that must
// stay (the lowest seq with server_at >= $1, found by walking uk_conv_seq
// from the oldest stored row; head+1 when every stored row is older), then
// the rows below it. conv_head is only read.
const trimBeforeSQL = `WITH convs AS (
	  SELECT conv_id, head FROM conv_head WHERE conv_id > $2 ORDER BY conv_id LIMIT $3
	), cut AS (
	  SELECT c.conv_id, COALESCE((SELECT m.seq FROM im_message m
	      WHERE m.conv_id = c.conv_id AND m.server_at >= $1 ORDER BY m.seq LIMIT 1), c.head + 1) AS keep_from
	  FROM convs c
	), del AS (
	  DELETE FROM im_message m USING cut WHERE m.conv_id = cut.conv_id AND m.seq < cut.keep_from RETURNING 1
	)
	SELECT (SELECT count(*) FROM convs), COALESCE((SELECT max(conv_id) FROM convs), ''), (SELECT count(*) FROM del)`

// TrimBefore implements persist.Store (retention): see there. The cursor
// follows the database's collation of conv_id.
func (s *Store) TrimBefore(ctx context.Context, before time.Time, after string, limit int) (string, int, error) {
	if limit < 1 {
		return "", 0, errors.New("postgres: trim: limit must be >= 1")
	}
	var convs, deleted int64
	var last string
	if err := s.pool.QueryRow(ctx, trimBeforeSQL, before, after, limit).Scan(&convs, &last, &deleted); err != nil {
		return "", 0, unavailable("trim before", err)
	}
	if convs < int64(limit) {
		last = ""
	}
	return last, int(deleted), nil
}
