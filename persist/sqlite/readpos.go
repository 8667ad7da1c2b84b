package sqlite

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.ReadPositions = (*Store)(nil)

// markReadSQL raises the position to min(seq, head) with the head of
// conv_head in the same statement; a conversation without a head (or a
// clamped value of 0) inserts nothing.
const markReadSQL = `INSERT INTO read_position (conv_id, uid, read_seq)
	SELECT conv_id, ?2, min(?3, head) FROM conv_head WHERE conv_id = ?1 AND min(?3, head) > 0
	ON CONFLICT (conv_id, uid) DO UPDATE SET read_seq = max(read_seq, excluded.read_seq)`

// MarkRead implements persist.ReadPositions: the upsert and the read-back
// in one transaction on the writer connection (so it is serialized with
// commits and synced like them, synchronous=FULL).
func (s *Store) MarkRead(ctx context.Context, convID string, uid, seq uint64) (persist.ReadState, error) {
	if err := sequencer.CheckMarkRead(convID, uid, seq); err != nil {
		return persist.ReadState{}, err
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return persist.ReadState{}, unavailable("mark read: begin", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, markReadSQL, convID, int64(uid), int64(seq)); err != nil {
		return persist.ReadState{}, classify("mark read", err)
	}
	var read, head int64
	if err := tx.QueryRowContext(ctx, `SELECT
		coalesce((SELECT read_seq FROM read_position WHERE conv_id = ?1 AND uid = ?2), 0),
		coalesce((SELECT head FROM conv_head WHERE conv_id = ?1), 0)`, convID, int64(uid)).Scan(&read, &head); err != nil {
		return persist.ReadState{}, unavailable("mark read: read back", err)
	}
	if err := tx.Commit(); err != nil {
		// The position may or may not be stored; marking again is harmless.
		return persist.ReadState{}, unavailable("mark read: commit", err)
	}
	return persist.ReadState{ConvID: convID, ReadSeq: uint64(read), Head: uint64(head)}, nil
}

// ReadStates implements persist.ReadPositions with one query: the
// conversations go in as one JSON array (json_each keeps their order and
// duplicates) joined with conv_head and read_position.
func (s *Store) ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]persist.ReadState, error) {
	if err := sequencer.CheckReadStates(uid, convIDs); err != nil {
		return nil, err
	}
	list, err := json.Marshal(convIDs)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read states: %w", err)
	}
	rows, err := s.r.QueryContext(ctx, `SELECT q.key, coalesce(r.read_seq, 0), coalesce(h.head, 0)
		FROM json_each(?1) AS q
		LEFT JOIN conv_head h ON h.conv_id = q.value
		LEFT JOIN read_position r ON r.conv_id = q.value AND r.uid = ?2
		ORDER BY q.key`, string(list), int64(uid))
	if err != nil {
		return nil, unavailable("read states", err)
	}
	defer rows.Close()
	out := make([]persist.ReadState, len(convIDs))
	n := 0
	for rows.Next() {
		var i int
		var read, head int64
		if err := rows.Scan(&i, &read, &head); err != nil {
			return nil, unavailable("read states", err)
		}
		if i < 0 || i >= len(out) {
			return nil, fmt.Errorf("sqlite: read states: row for index %d of %d", i, len(out))
		}
		out[i] = persist.ReadState{ConvID: convIDs[i], ReadSeq: uint64(read), Head: uint64(head)}
		n++
	}
	if err := rows.Err(); err != nil {
		return nil, unavailable("read states", err)
	}
	if n != len(out) {
		return nil, fmt.Errorf("sqlite: read states: %d rows for %d conversations", n, len(out))
	}
	return out, nil
}
