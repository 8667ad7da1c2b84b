package postgres

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.ReadPositions = (*Store)(nil)

// markReadSQL writes a batch of marks (persist.MarkBatcher) in ONE
// statement (one transaction, one WAL flush): each mark's head is read from
// conv_head, its position clamped to LEAST(seq, head); the marks of one
// (conv_id, uid) are merged (max), written in key order (concurrent batches
// lock rows in the same order: no deadlock) with GREATEST over the stored
// position, and every mark is answered with the row as written. Concurrent
// writers of one row serialize on it (ON CONFLICT waits and re-evaluates
// GREATEST on the other's result), so they end at the highest. A mark that
// writes nothing (head 0, seq 0) answers the stored position.
const markReadSQL = `WITH q AS (
	SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[]) WITH ORDINALITY AS q(conv_id, uid, seq, ord)
), h AS (
	SELECT q.ord, q.conv_id, q.uid, COALESCE(c.head, 0) AS head, LEAST(q.seq, COALESCE(c.head, 0)) AS want
	FROM q LEFT JOIN conv_head c ON c.conv_id = q.conv_id
), up AS (
	INSERT INTO read_position (conv_id, uid, read_seq)
	SELECT conv_id, uid, max(want) FROM h WHERE want > 0 GROUP BY conv_id, uid ORDER BY conv_id, uid
	ON CONFLICT (conv_id, uid) DO UPDATE SET read_seq = GREATEST(read_position.read_seq, EXCLUDED.read_seq)
	RETURNING conv_id, uid, read_seq
)
SELECT h.ord, COALESCE(up.read_seq,
	(SELECT r.read_seq FROM read_position r WHERE r.conv_id = h.conv_id AND r.uid = h.uid), 0), h.head
FROM h LEFT JOIN up ON up.conv_id = h.conv_id AND up.uid = h.uid
ORDER BY h.ord`

// readStatesSQL answers every conversation of the list with one query: the
// list goes in as one array, unnest WITH ORDINALITY keeps its order and
// duplicates.
const readStatesSQL = `SELECT q.ord, COALESCE(r.read_seq, 0), COALESCE(h.head, 0)
FROM unnest($2::text[]) WITH ORDINALITY AS q(conv_id, ord)
LEFT JOIN conv_head h ON h.conv_id = q.conv_id
LEFT JOIN read_position r ON r.conv_id = q.conv_id AND r.uid = $1
ORDER BY q.ord`

// MarkRead implements persist.ReadPositions. Concurrent calls share one
// statement (persist.MarkBatcher, at most two batches in flight) on the
// read pool (the commit pool stays for Commit); the answer comes after the
// transaction committed (synchronous_commit as the server has it, like
// commits).
func (s *Store) MarkRead(ctx context.Context, convID string, uid, seq uint64) (persist.ReadState, error) {
	if err := sequencer.CheckMarkRead(convID, uid, seq); err != nil {
		return persist.ReadState{}, err
	}
	s.markOnce.Do(func() { s.marks = &persist.MarkBatcher{Write: s.writeMarks} })
	return s.marks.MarkRead(ctx, persist.Mark{ConvID: convID, UID: uid, Seq: seq})
}

// writeMarks is the MarkBatcher's Write: markReadSQL over the batch.
func (s *Store) writeMarks(ctx context.Context, marks []persist.Mark) ([]persist.ReadState, error) {
	convs := make([]string, len(marks))
	uids := make([]int64, len(marks))
	seqs := make([]int64, len(marks))
	for i, m := range marks {
		convs[i], uids[i], seqs[i] = m.ConvID, int64(m.UID), int64(m.Seq)
	}
	rows, err := s.pool.Query(ctx, markReadSQL, convs, uids, seqs)
	if err != nil {
		// The positions may or may not be stored; marking again is harmless.
		return nil, classify("mark read", err)
	}
	defer rows.Close()
	out := make([]persist.ReadState, len(marks))
	n := 0
	for rows.Next() {
		var ord, read, head int64
		if err := rows.Scan(&ord, &read, &head); err != nil {
			return nil, unavailable("mark read", err)
		}
		i := int(ord - 1)
		if i < 0 || i >= len(out) {
			return nil, fmt.Errorf("postgres: mark read: row for ordinal %d of %d", ord, len(out))
		}
		out[i] = persist.ReadState{ConvID: marks[i].ConvID, ReadSeq: uint64(read), Head: uint64(head)}
		n++
	}
	if err := rows.Err(); err != nil {
		return nil, classify("mark read", err)
	}
	if n != len(out) {
		return nil, fmt.Errorf("postgres: mark read: %d rows for %d marks", n, len(out))
	}
	return out, nil
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

// senderMarksSQL is the own-send rule inside a commit's transaction
// (persist.SenderMarks: distinct (conv_id, uid) in key order, so concurrent
// commits lock rows in one order): each sender's position raised to their
// last seq, never lowered.
var senderMarksSQL = SenderMarksInto("read_position", 1)

// SenderMarksInto is senderMarksSQL on table (read_position, or one of its
// shard tables on a Citus worker: persist/citus's direct writes), its three
// arrays from parameter $first on.
func SenderMarksInto(table string, first int) string {
	p := func(k int) string { return "$" + strconv.Itoa(first+k) }
	return `INSERT INTO ` + table + ` AS r (conv_id, uid, read_seq)
SELECT * FROM unnest(` + p(0) + `::text[], ` + p(1) + `::bigint[], ` + p(2) + `::bigint[])
ON CONFLICT (conv_id, uid) DO UPDATE SET read_seq = GREATEST(r.read_seq, EXCLUDED.read_seq)`
}

// senderMarksArgs are senderMarksSQL's arguments, nil when the commit
// raises no position.
func senderMarksArgs(batches []persist.ConvBatch) []any {
	marks := persist.SenderMarks(batches)
	if len(marks) == 0 {
		return nil
	}
	return SenderMarksArrays(marks)
}

// SenderMarksArrays are senderMarksSQL's three arrays for marks (empty
// arrays for none).
func SenderMarksArrays(marks []persist.Mark) []any {
	convs := make([]string, len(marks))
	uids := make([]int64, len(marks))
	seqs := make([]int64, len(marks))
	for i, m := range marks {
		convs[i], uids[i], seqs[i] = m.ConvID, int64(m.UID), int64(m.Seq)
	}
	return []any{presized[[]string]{convs, textIntArraysSize(convs, 2)}, uids, seqs}
}

// QueueSenderMarks adds senderMarksSQL to a commit's pipelined batch
// (before its COMMIT).
func QueueSenderMarks(b *pgx.Batch, batches []persist.ConvBatch) {
	if args := senderMarksArgs(batches); args != nil {
		b.Queue(senderMarksSQL, args...)
	}
}

// readCountsSQL is ReadCounts for n bounds ($2..$n+1): one range of the
// primary key (conv_id, uid), every position of the conversation, those at
// or above the lowest bound put in their bucket (persist.BucketSQL) and
// counted there. read_seq has no index (migration 0011): the position
// writes of every Send (the own-send rule) and MarkRead stay HOT, and 100
// seqs over 10,000 readers read the same 10,000 rows either way.
func readCountsSQL(n int) string {
	return `SELECT ` + persist.BucketSQL("read_seq", n, func(i int) string { return "$" + strconv.Itoa(i+2) }) + `, count(*)
FROM read_position WHERE conv_id = $1 AND read_seq >= $2 GROUP BY 1`
}

// readPositionsSQL is ReadPositionsPage: one range of the primary key.
const readPositionsSQL = `SELECT uid, read_seq FROM read_position
WHERE conv_id = $1 AND uid > $2 ORDER BY uid LIMIT $3`

// ReadCounts implements persist.ReadPositions (on Citus a single-shard
// query: conv_id is the distribution column).
func (s *Store) ReadCounts(ctx context.Context, convID string, bounds []uint64) ([]uint64, error) {
	return persist.ReadCountsOf(convID, bounds, func() ([]persist.BucketCount, error) {
		args := persist.ReadCountsArgs(convID, bounds)
		return queryAll(ctx, s.pool, "read counts", persist.ScanBucketCount, readCountsSQL(len(bounds)), args...)
	})
}

// ReadPositionsPage implements persist.ReadPositions.
func (s *Store) ReadPositionsPage(ctx context.Context, convID string, afterUID uint64, limit int) ([]persist.ReadPosition, bool, error) {
	return persist.ReadPage(convID, afterUID, limit, func(n int) ([]persist.ReadPosition, error) {
		return queryAll(ctx, s.pool, "read positions", persist.ScanReadPosition, readPositionsSQL, convID, int64(afterUID), n)
	})
}

// queryAll runs q on pool and reads every row with scan.
func queryAll[T any](ctx context.Context, pool *pgxpool.Pool, op string, scan func(persist.Rows) (T, error), q string, args ...any) ([]T, error) {
	rows, err := pool.Query(ctx, q, args...)
	out, err := persist.CollectQuery(rows, err, pgx.Rows.Close, scan)
	if err != nil {
		return nil, unavailable(op, err)
	}
	return out, nil
}
