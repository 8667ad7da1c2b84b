package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"

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

// MarkRead implements persist.ReadPositions. Concurrent calls share one
// transaction on the writer connection (persist.MarkBatcher, one batch at a
// time: the file has one writer), so a burst of marks costs one sync
// (synchronous=FULL), not one each.
func (s *Store) MarkRead(ctx context.Context, convID string, uid, seq uint64) (persist.ReadState, error) {
	if err := sequencer.CheckMarkRead(convID, uid, seq); err != nil {
		return persist.ReadState{}, err
	}
	s.markOnce.Do(func() { s.marks = &persist.MarkBatcher{Write: s.writeMarks, Flushes: 1} })
	return s.marks.MarkRead(ctx, persist.Mark{ConvID: convID, UID: uid, Seq: seq})
}

// writeMarks is the MarkBatcher's Write: every mark's upsert and read-back
// in one transaction; the answer adds the own-send marks not yet applied
// (marklog.go), taken before the transaction.
func (s *Store) writeMarks(ctx context.Context, marks []persist.Mark) ([]persist.ReadState, error) {
	logged, err := s.pend.of(ctx, s.r, marks)
	if err != nil {
		return nil, err
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return nil, unavailable("mark read: begin", err)
	}
	defer tx.Rollback()
	for _, m := range marks {
		if _, err := tx.ExecContext(ctx, markReadSQL, m.ConvID, int64(m.UID), int64(m.Seq)); err != nil {
			return nil, classify("mark read", err)
		}
	}
	out := make([]persist.ReadState, len(marks))
	for i, m := range marks {
		var read, head int64
		if err := tx.QueryRowContext(ctx, `SELECT
			coalesce((SELECT read_seq FROM read_position WHERE conv_id = ?1 AND uid = ?2), 0),
			coalesce((SELECT head FROM conv_head WHERE conv_id = ?1), 0)`, m.ConvID, int64(m.UID)).Scan(&read, &head); err != nil {
			return nil, unavailable("mark read: read back", err)
		}
		out[i] = persist.ReadState{ConvID: m.ConvID, ReadSeq: max(uint64(read), logged[i]), Head: uint64(head)}
	}
	if err := tx.Commit(); err != nil {
		// The positions may or may not be stored; marking again is harmless.
		return nil, unavailable("mark read: commit", err)
	}
	return out, nil
}

// ReadStates implements persist.ReadPositions with one query: the
// conversations go in as one JSON array (json_each keeps their order and
// duplicates) joined with conv_head and read_position; the own-send marks
// not yet applied (marklog.go) are taken first and added.
func (s *Store) ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]persist.ReadState, error) {
	if err := sequencer.CheckReadStates(uid, convIDs); err != nil {
		return nil, err
	}
	logged, err := s.pend.user(ctx, s.r, uid, convIDs)
	if err != nil {
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
		out[i] = persist.ReadState{ConvID: convIDs[i], ReadSeq: max(uint64(read), logged[i]), Head: uint64(head)}
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

// ReadCounts implements persist.ReadPositions: one range of the primary
// key (conv_id, uid), the conversation's positions at or above the lowest
// bound counted per bucket (persist.BucketSQL; bounds ?2..?n+1). With
// own-send marks of the conversation not yet applied (marklog.go, taken
// first), the stored positions of their users are read in the same
// snapshot and the buckets moved (pendingCounts).
func (s *Store) ReadCounts(ctx context.Context, convID string, bounds []uint64) ([]uint64, error) {
	return persist.ReadCountsOf(convID, bounds, func() ([]persist.BucketCount, error) {
		pending, err := s.pend.conv(ctx, s.r, convID)
		if err != nil {
			return nil, err
		}
		args := persist.ReadCountsArgs(convID, bounds)
		bucket := persist.BucketSQL("read_seq", len(bounds), func(i int) string { return "?" + strconv.Itoa(i+2) })
		q := `SELECT ` + bucket + `, count(*) FROM read_position WHERE conv_id = ?1 AND read_seq >= ?2 GROUP BY 1`
		if pending == nil {
			return queryAll(ctx, s.r, "read counts", persist.ScanBucketCount, q, args...)
		}
		tx, err := s.r.BeginTx(ctx, nil) // one snapshot for both statements
		if err != nil {
			return nil, unavailable("read counts", err)
		}
		defer tx.Rollback()
		counts, err := queryAll(ctx, tx, "read counts", persist.ScanBucketCount, q, args...)
		if err != nil {
			return nil, err
		}
		uids := make([]uint64, 0, len(pending))
		for u := range pending {
			uids = append(uids, u)
		}
		list, err := json.Marshal(uids)
		if err != nil {
			return nil, fmt.Errorf("sqlite: read counts: %w", err)
		}
		have, err := queryAll(ctx, tx, "read counts", persist.ScanReadPosition, `SELECT uid, read_seq FROM read_position
			WHERE conv_id = ?1 AND uid IN (SELECT value FROM json_each(?2))`, convID, string(list))
		if err != nil {
			return nil, err
		}
		stored := make(map[uint64]uint64, len(have))
		for _, p := range have {
			stored[p.UID] = p.ReadSeq
		}
		return pendingCounts(counts, bounds, pending, stored)
	})
}

// ReadPositionsPage implements persist.ReadPositions: one range of the
// primary key (conv_id, uid), merged with the conversation's own-send
// marks not yet applied (marklog.go, taken first; pendingPage).
func (s *Store) ReadPositionsPage(ctx context.Context, convID string, afterUID uint64, limit int) ([]persist.ReadPosition, bool, error) {
	return persist.ReadPage(convID, afterUID, limit, func(n int) ([]persist.ReadPosition, error) {
		pending, err := s.pend.conv(ctx, s.r, convID)
		if err != nil {
			return nil, err
		}
		page, err := queryAll(ctx, s.r, "read positions", persist.ScanReadPosition, `SELECT uid, read_seq FROM read_position
			WHERE conv_id = ?1 AND uid > ?2 ORDER BY uid LIMIT ?3`, convID, int64(afterUID), n)
		if err != nil || pending == nil {
			return page, err
		}
		return pendingPage(page, pending, afterUID, n), nil
	})
}

// queryAll runs q on db (a pool or a transaction) and reads every row with scan.
func queryAll[T any](ctx context.Context, db interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, op string, scan func(persist.Rows) (T, error), q string, args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	out, err := persist.CollectQuery(rows, err, func(r *sql.Rows) { r.Close() }, scan)
	if err != nil {
		return nil, unavailable(op, err)
	}
	return out, nil
}
