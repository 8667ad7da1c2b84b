package postgres

import (
	"context"
	"fmt"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.ReadPositions = (*Store)(nil)

// markReadSQL is MarkRead in ONE statement (one transaction, one round
// trip): the head is read from conv_head, the position raised to
// LEAST(seq, head) with GREATEST over the stored one, and the answer is
// the row as written. Concurrent marks of one (conv_id, uid) serialize on
// the row (ON CONFLICT waits for the other transaction and re-evaluates
// GREATEST on its result), so they end at the highest. When nothing is
// written (head 0, seq 0) the stored position is read instead.
const markReadSQL = `WITH h AS (
	SELECT COALESCE((SELECT head FROM conv_head WHERE conv_id = $1), 0) AS head
), up AS (
	INSERT INTO read_position (conv_id, uid, read_seq)
	SELECT $1, $2, LEAST($3::bigint, h.head) FROM h WHERE LEAST($3::bigint, h.head) > 0
	ON CONFLICT (conv_id, uid) DO UPDATE SET read_seq = GREATEST(read_position.read_seq, EXCLUDED.read_seq)
	RETURNING read_seq
)
SELECT COALESCE((SELECT read_seq FROM up),
	(SELECT read_seq FROM read_position WHERE conv_id = $1 AND uid = $2), 0), h.head
FROM h`

// readStatesSQL answers every conversation of the list with one query: the
// list goes in as one array, unnest WITH ORDINALITY keeps its order and
// duplicates.
const readStatesSQL = `SELECT q.ord, COALESCE(r.read_seq, 0), COALESCE(h.head, 0)
FROM unnest($2::text[]) WITH ORDINALITY AS q(conv_id, ord)
LEFT JOIN conv_head h ON h.conv_id = q.conv_id
LEFT JOIN read_position r ON r.conv_id = q.conv_id AND r.uid = $1
ORDER BY q.ord`

// MarkRead implements persist.ReadPositions. It runs on the read pool (a
// single short statement; the commit pool stays for Commit) and is durable
// when it returns (synchronous_commit as the server has it, like commits).
func (s *Store) MarkRead(ctx context.Context, convID string, uid, seq uint64) (persist.ReadState, error) {
	if err := sequencer.CheckMarkRead(convID, uid, seq); err != nil {
		return persist.ReadState{}, err
	}
	var read, head int64
	if err := s.pool.QueryRow(ctx, markReadSQL, convID, int64(uid), int64(seq)).Scan(&read, &head); err != nil {
		// The position may or may not be stored; marking again is harmless.
		return persist.ReadState{}, classify("mark read", err)
	}
	return persist.ReadState{ConvID: convID, ReadSeq: uint64(read), Head: uint64(head)}, nil
}

// ReadStates implements persist.ReadPositions in one query.
func (s *Store) ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]persist.ReadState, error) {
	if err := sequencer.CheckReadStates(uid, convIDs); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, readStatesSQL, int64(uid), convIDs)
	if err != nil {
		return nil, unavailable("read states", err)
	}
	defer rows.Close()
	out := make([]persist.ReadState, len(convIDs))
	n := 0
	for rows.Next() {
		var ord, read, head int64
		if err := rows.Scan(&ord, &read, &head); err != nil {
			return nil, unavailable("read states", err)
		}
		i := int(ord - 1)
		if i < 0 || i >= len(out) {
			return nil, fmt.Errorf("postgres: read states: row for ordinal %d of %d", ord, len(out))
		}
		out[i] = persist.ReadState{ConvID: convIDs[i], ReadSeq: uint64(read), Head: uint64(head)}
		n++
	}
	if err := rows.Err(); err != nil {
		return nil, unavailable("read states", err)
	}
	if n != len(out) {
		return nil, fmt.Errorf("postgres: read states: %d rows for %d conversations", n, len(out))
	}
	return out, nil
}
