package mysql

import (
	"context"
	"github.com/sequencer-im/sequencer"
	"strings"

	"github.com/sequencer-im/sequencer/persist"
)

// MarkRead implements persist.ReadPositions: one transaction that reads the
// head (locking read, so a commit moving it is ordered before or after) and
// raises the position to LEAST(seq, head) with GREATEST (never backwards;
// concurrent calls end at the highest).
func (s *Store) MarkRead(ctx context.Context, convID string, uid uint64, seq uint64) (persist.ReadState, error) {
	if err := sequencer.CheckMarkRead(convID, uid, seq); err != nil {
		return persist.ReadState{}, err
	}
	st := persist.ReadState{ConvID: convID}
	tx, err := s.commits.BeginTx(ctx, nil)
	if err != nil {
		return st, unavailable("mark read", err)
	}
	defer tx.Rollback()
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE((SELECT head FROM conv_head WHERE conv_id = ? LOCK IN SHARE MODE), 0)`, convID).Scan(&st.Head); err != nil {
		return st, unavailable("mark read", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO read_position (uid, conv_id, read_seq) VALUES (?, ?, ?)
		ON DUPLICATE KEY UPDATE read_seq = GREATEST(read_seq, VALUES(read_seq))`, uid, convID, min(seq, st.Head)); err != nil {
		return st, unavailable("mark read", err)
	}
	if err := tx.QueryRowContext(ctx, `SELECT read_seq FROM read_position WHERE uid = ? AND conv_id = ?`, uid, convID).Scan(&st.ReadSeq); err != nil {
		return st, unavailable("mark read", err)
	}
	if err := tx.Commit(); err != nil {
		return st, unknownOutcome("mark read: COMMIT", err)
	}
	return st, nil
}

// ReadStates implements persist.ReadPositions in one query.
func (s *Store) ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]persist.ReadState, error) {
	if err := sequencer.CheckReadStates(uid, convIDs); err != nil {
		return nil, err
	}
	var q strings.Builder
	q.WriteString(`SELECT c.conv_id, COALESCE(r.read_seq, 0), COALESCE(h.head, 0) FROM (`)
	args := make([]any, 0, len(convIDs)+1)
	for i, c := range convIDs {
		if i > 0 {
			q.WriteString(" UNION ALL ")
		}
		q.WriteString("SELECT CAST(? AS CHAR(64)) COLLATE " + s.binCollation() + " AS conv_id")
		args = append(args, c)
	}
	q.WriteString(`) AS c LEFT JOIN conv_head h ON h.conv_id = c.conv_id LEFT JOIN read_position r ON r.uid = ? AND r.conv_id = c.conv_id`)
	args = append(args, uid)
	rows, err := s.read.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, unavailable("read states", err)
	}
	defer rows.Close()
	got := map[string]persist.ReadState{}
	for rows.Next() {
		var r persist.ReadState
		if err := rows.Scan(&r.ConvID, &r.ReadSeq, &r.Head); err != nil {
			return nil, unavailable("read states", err)
		}
		r.ReadSeq = min(r.ReadSeq, r.Head)
		got[r.ConvID] = r
	}
	if err := rows.Err(); err != nil {
		return nil, unavailable("read states", err)
	}
	out := make([]persist.ReadState, len(convIDs))
	for i, c := range convIDs {
		out[i] = got[c]
		out[i].ConvID = c
	}
	return out, nil
}
