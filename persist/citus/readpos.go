package citus

import (
	"context"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

var _ persist.ReadPositions = (*Store)(nil)

// On Citus (distributed mode) persist/postgres's batched statement (markReadSQL) joins a list
// with distributed tables, which Citus cannot push down; there each mark is
// one single-shard statement (routed to the worker of its conversation's
// shard: read_position is co-located with conv_head), and a read state is
// one co-located join filtered on the distribution column.
const distMarkReadSQL = `WITH up AS (
	INSERT INTO read_position (conv_id, uid, read_seq)
	SELECT h.conv_id, $2, LEAST($3::bigint, h.head) FROM conv_head h
	WHERE h.conv_id = $1 AND LEAST($3::bigint, h.head) > 0
	ON CONFLICT (conv_id, uid) DO UPDATE SET read_seq = GREATEST(read_position.read_seq, EXCLUDED.read_seq)
	RETURNING read_seq
)
SELECT COALESCE((SELECT read_seq FROM up),
	(SELECT r.read_seq FROM read_position r WHERE r.conv_id = $1 AND r.uid = $2), 0),
	COALESCE((SELECT h.head FROM conv_head h WHERE h.conv_id = $1), 0)`

const distReadStatesSQL = `SELECT h.conv_id, COALESCE(r.read_seq, 0), h.head
FROM conv_head h LEFT JOIN read_position r ON r.conv_id = h.conv_id AND r.uid = $1
WHERE h.conv_id = ANY($2::text[])`

// MarkRead implements persist.ReadPositions: one single-shard statement
// (distMarkReadSQL) per mark, on the read pool.
func (s *Store) MarkRead(ctx context.Context, convID string, uid, seq uint64) (persist.ReadState, error) {
	if err := sequencer.CheckMarkRead(convID, uid, seq); err != nil {
		return persist.ReadState{}, err
	}
	var read, head int64
	if err := s.Pool().QueryRow(ctx, distMarkReadSQL, convID, int64(uid), int64(seq)).Scan(&read, &head); err != nil {
		return persist.ReadState{}, postgres.Classify("mark read", err)
	}
	return persist.ReadState{ConvID: convID, ReadSeq: uint64(read), Head: uint64(head)}, nil
}

// ReadStates implements persist.ReadPositions: one co-located join for the
// distinct conversations, answered in the order asked (duplicates and
// unknown conversations included).
func (s *Store) ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]persist.ReadState, error) {
	if err := sequencer.CheckReadStates(uid, convIDs); err != nil {
		return nil, err
	}
	rows, err := s.Pool().Query(ctx, distReadStatesSQL, int64(uid), convIDs)
	if err != nil {
		return nil, postgres.Unavailable("read states", err)
	}
	defer rows.Close()
	found := make(map[string]persist.ReadState, len(convIDs))
	for rows.Next() {
		var conv string
		var read, head int64
		if err := rows.Scan(&conv, &read, &head); err != nil {
			return nil, postgres.Unavailable("read states", err)
		}
		found[conv] = persist.ReadState{ConvID: conv, ReadSeq: uint64(read), Head: uint64(head)}
	}
	if err := rows.Err(); err != nil {
		return nil, postgres.Unavailable("read states", err)
	}
	out := make([]persist.ReadState, len(convIDs))
	for i, c := range convIDs {
		out[i] = found[c]
		out[i].ConvID = c
	}
	return out, nil
}
