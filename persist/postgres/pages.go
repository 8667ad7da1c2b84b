package postgres

import (
	"context"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// ReadBefore implements persist.PageReader: the newest limit rows below
// beforeSeq, read backwards and returned ascending.
func (s *Store) ReadBefore(ctx context.Context, convID string, afterSeq, beforeSeq uint64, limit int) ([]sequencer.Message, error) {
	return ReadBeforeOn(ctx, s.pool, convID, afterSeq, beforeSeq, limit)
}

// ReadBeforeOn is ReadBefore on pool (persist/citus: a worker's).
func ReadBeforeOn(ctx context.Context, pool *pgxpool.Pool, convID string, afterSeq, beforeSeq uint64, limit int) ([]sequencer.Message, error) {
	if limit <= 0 || afterSeq >= math.MaxInt64 || beforeSeq <= afterSeq+1 {
		return nil, nil
	}
	rows, err := pool.Query(ctx, `SELECT `+MessageColumns+` FROM im_message
		WHERE conv_id = $1 AND seq > $2 AND seq < $3 ORDER BY seq DESC LIMIT $4`,
		convID, int64(afterSeq), int64(min(beforeSeq, math.MaxInt64)), limit)
	if err != nil {
		return nil, unavailable("read before", err)
	}
	defer rows.Close()
	out, err := persist.Collect(rows, func(r persist.Rows) (sequencer.Message, error) { return ScanMessage(r) })
	if err != nil {
		return nil, unavailable("read before", err)
	}
	slices.Reverse(out)
	return out, nil
}

// ReadManyHeadsSQL and ReadManySQL are ReadMany's two statements, sent in
// one batch (one round trip): the cursors go in as arrays, unnest WITH
// ORDINALITY numbers them, and each cursor's range is a LATERAL index scan
// of uk_conv_seq. persist/citus sends them on a worker's shard tables
// (ReplaceTable).
//
// ReadManySQL orders by the ordinal alone: PostgreSQL knows the ordinality
// is ascending and runs no sort, and each cursor's rows come in its
// subquery's seq order. Ordering by (ord, seq) made it sort every
// cursor's rows again (an incremental sort; EXPLAIN ANALYZE of 1,000
// cursors x 10 rows: 12.4 ms with it, 7.2-8.6 without). SQL does not
// promise the subquery's order through the join, so ScanMessages checks
// it: rows out of seq order fail the read instead of answering a page with
// a hole (LIMIT $4 may cut the last cursor's rows).
//
// Its rows are PageColumns, not MessageColumns: see there.
const (
	ReadManyHeadsSQL = `SELECT c.ord, COALESCE(h.head, 0)
FROM unnest($1::text[]) WITH ORDINALITY AS c(conv_id, ord)
LEFT JOIN conv_head h ON h.conv_id = c.conv_id`
	ReadManySQL = `SELECT c.ord, m.*
FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS c(conv_id, after_seq, ord)
CROSS JOIN LATERAL (SELECT ` + PageColumns + ` FROM im_message
	WHERE conv_id = c.conv_id AND seq > c.after_seq ORDER BY seq LIMIT $3) m
ORDER BY c.ord LIMIT $4`
)

// PageReadSettingsSQL comes first in a ReadMany's batch (one implicit
// transaction, so the settings end with it): ReadManySQL's generic plan
// (a nested loop of index scans in seq order) from the first execution on
// a connection, and no JIT. PostgreSQL plans a prepared statement's first
// five executions with their arguments; with 1,000 cursors and a limit of
// 100 that custom plan was a bitmap scan and a sort per cursor, costed
// above jit_above_cost: the first PullMany on a new pool connection took
// 50-206 ms, with these 35-42 ms (docs/BENCHMARKS.md).
const PageReadSettingsSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('jit', 'off', true)`

// ReadMany implements persist.PageReader: two statements (after the
// settings) in one round trip.
func (s *Store) ReadMany(ctx context.Context, cursors []persist.Cursor, limit, total int) ([]persist.Page, error) {
	pages := make([]persist.Page, len(cursors))
	convs := make([]string, len(cursors))
	afters := make([]int64, len(cursors))
	idx := make([]int, len(cursors))
	for i, c := range cursors {
		convs[i], afters[i], idx[i] = c.ConvID, int64(min(c.AfterSeq, math.MaxInt64)), i
	}
	b := &pgx.Batch{}
	b.Queue(PageReadSettingsSQL)
	b.Queue(ReadManyHeadsSQL, convs)
	b.Queue(ReadManySQL, convs, afters, max(limit, 0), max(total, 0))
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, unavailable("read many", err)
	}
	if err := ScanHeads(br, pages, idx); err != nil {
		return nil, unavailable("read many", err)
	}
	if err := ScanMessages(br, cursors, pages, idx, limit); err != nil {
		return nil, unavailable("read many", err)
	}
	return pages, nil
}

// ReplaceTable names with instead of table in stmt (its first occurrence
// as a word between white space).
func ReplaceTable(stmt, table, with string) string {
	for i := 0; i+len(table)+2 <= len(stmt); i++ {
		j := i + 1 + len(table)
		if isSpace(stmt[i]) && stmt[i+1:j] == table && isSpace(stmt[j]) {
			return stmt[:i+1] + with + stmt[j:]
		}
	}
	panic("postgres: no table " + table + " in a read many statement")
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\t' }
