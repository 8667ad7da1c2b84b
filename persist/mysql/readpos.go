package mysql

import (
	"context"
	"database/sql"
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

// senderMarks writes the own-send rule's statement into a commit's round
// trip (persist.SenderMarks): each sender's position raised to their last
// seq, never lowered.
func senderMarks(b *strings.Builder, args []any, marks []persist.Mark) []any {
	b.WriteString("INSERT INTO read_position (uid, conv_id, read_seq) VALUES ")
	sqlList(b, len(marks), "(?,?,?)")
	b.WriteString(" ON DUPLICATE KEY UPDATE read_seq = GREATEST(read_seq, VALUES(read_seq));")
	for _, m := range marks {
		args = append(args, m.UID, m.ConvID, m.Seq)
	}
	return args
}

// ReadCounts implements persist.ReadPositions: the conversation's range of
// the primary key (conv_id, uid), whose leaves hold read_seq (migration
// 0008), counted per bucket (persist.BucketSQL; the bounds are bound twice:
// ? is positional). Its cost is the conversation's readers, as on
// PostgreSQL (docs/API.md).
func (s *Store) ReadCounts(ctx context.Context, convID string, bounds []uint64) ([]uint64, error) {
	return persist.ReadCountsOf(convID, bounds, func() (out []persist.BucketCount, err error) {
		var args []any
		bucket := persist.BucketSQL("read_seq", len(bounds), func(i int) string {
			args = append(args, bounds[i])
			return "?"
		})
		args = append(args, convID, bounds[0])
		err = s.readRows(ctx, `SELECT `+bucket+`, COUNT(*) FROM read_position FORCE INDEX (PRIMARY)
			WHERE conv_id = ? AND read_seq >= ? GROUP BY 1`, args, func(r *sql.Rows) error {
			c, err := persist.ScanBucketCount(r)
			out = append(out, c)
			return err
		})
		if err != nil {
			return nil, unavailable("read counts", err)
		}
		return out, nil
	})
}

// ReadPositionsPage implements persist.ReadPositions: one range of the
// primary key (conv_id, uid).
func (s *Store) ReadPositionsPage(ctx context.Context, convID string, afterUID uint64, limit int) ([]persist.ReadPosition, bool, error) {
	return persist.ReadPage(convID, afterUID, limit, func(n int) (out []persist.ReadPosition, err error) {
		err = s.readRows(ctx, `SELECT uid, read_seq FROM read_position FORCE INDEX (PRIMARY)
			WHERE conv_id = ? AND uid > ? ORDER BY uid LIMIT ?`, []any{convID, afterUID, n}, func(r *sql.Rows) error {
			p, err := persist.ScanReadPosition(r)
			out = append(out, p)
			return err
		})
		if err != nil {
			return nil, unavailable("read positions", err)
		}
		return out, nil
	})
}
