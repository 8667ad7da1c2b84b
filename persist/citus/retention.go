package citus

import (
	"context"
	"errors"
	"time"

	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

// trimStepDistSQL is one conversation's retention step on Citus: a
// single-shard DELETE (the multi-shard trimBeforeSQL joins a CTE of many
// shards with im_message, which Citus would not push down).
const trimStepDistSQL = `DELETE FROM im_message m WHERE m.conv_id = $1 AND m.seq < COALESCE((SELECT x.seq FROM im_message x
	  WHERE x.conv_id = $1 AND x.server_at >= $2 ORDER BY x.seq LIMIT 1), $3::int8 + 1)`

// TrimBefore implements persist.Store (retention) on Citus: the next limit
// conversations of conv_head (a multi-shard read, merged on the
// coordinator), then one single-shard DELETE each.
func (s *Store) TrimBefore(ctx context.Context, before time.Time, after string, limit int) (string, int, error) {
	if limit < 1 {
		return "", 0, errors.New("postgres: trim: limit must be >= 1")
	}
	rows, err := s.Pool().Query(ctx, `SELECT conv_id, head FROM conv_head WHERE conv_id > $1 ORDER BY conv_id LIMIT $2`, after, limit)
	if err != nil {
		return "", 0, postgres.Unavailable("trim before", err)
	}
	convs, err := persist.Collect(rows, persist.ScanConvHead)
	rows.Close()
	if err != nil {
		return "", 0, postgres.Unavailable("trim before", err)
	}
	next, deleted, err := persist.TrimStep(convs, limit, func(c persist.ConvHead) (int, error) {
		tag, err := s.Pool().Exec(ctx, trimStepDistSQL, c.ConvID, before, int64(c.Head))
		return int(tag.RowsAffected()), err
	})
	if err != nil {
		return "", 0, postgres.Unavailable("trim before", err)
	}
	return next, deleted, nil
}
