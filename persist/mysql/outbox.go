package mysql

import (
	"context"
	"database/sql"
	"slices"
	"strings"

	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.Outbox = (*Store)(nil)

// outboxUpsert writes a commit's outbox rows (persist.Outbox: a new row as
// given, an existing one left alone) into the transaction's statements,
// after the head updates (whose row locks keep OutboxSweep away), in
// (part, conv_id) order like OutboxAdvance's. The no-op update of an
// existing row changes nothing (no row write), where INSERT IGNORE would
// also hide other errors.
func outboxUpsert(b *strings.Builder, args []any, batches []persist.ConvBatch) []any {
	rows := persist.OutboxRowsOf(batches)
	if len(rows) == 0 {
		return args
	}
	slices.SortFunc(rows, func(x, y persist.OutboxRow) int {
		if x.Partition != y.Partition {
			return int(x.Partition) - int(y.Partition)
		}
		return strings.Compare(x.ConvID, y.ConvID)
	})
	b.WriteString("INSERT INTO feed_outbox (part, conv_id, published) VALUES ")
	sqlList(b, len(rows), "(?,?,?)")
	b.WriteString(" ON DUPLICATE KEY UPDATE published = published;")
	for _, r := range rows {
		args = append(args, r.Partition, r.ConvID, r.Published)
	}
	return args
}

// OutboxPending implements persist.Outbox.
func (s *Store) OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]persist.OutboxRow, error) {
	var out []persist.OutboxRow
	err := s.readRows(ctx, `SELECT o.part, o.conv_id, o.published, COALESCE(h.head, 0) FROM feed_outbox AS o
		LEFT JOIN conv_head AS h ON h.conv_id = o.conv_id
		WHERE o.part = ? AND o.conv_id > ? ORDER BY o.conv_id LIMIT ?`, []any{part, after, limit}, func(rows *sql.Rows) error {
		var r persist.OutboxRow
		if err := rows.Scan(&r.Partition, &r.ConvID, &r.Published, &r.Head); err != nil {
			return err
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, classify("outbox pending", err)
	}
	return out, nil
}

// OutboxAdvance implements persist.Outbox: the raises in one transaction.
func (s *Store) OutboxAdvance(ctx context.Context, moves []persist.OutboxMove) error {
	if len(moves) == 0 {
		return nil
	}
	tx, err := s.commits.BeginTx(ctx, nil)
	if err != nil {
		return unavailable("outbox advance: begin", err)
	}
	defer tx.Rollback()
	for _, m := range moves {
		if _, err := tx.ExecContext(ctx, `UPDATE feed_outbox SET published = ? WHERE part = ? AND conv_id = ? AND published < ?`,
			m.To, m.Partition, m.ConvID, m.To); err != nil {
			return classify("outbox advance", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return unavailable("outbox advance: commit", err)
	}
	return nil
}

// OutboxSweep implements persist.Outbox, at READ COMMITTED (no gap locks):
// the heads are locked FOR UPDATE SKIP LOCKED (a conversation whose commit
// holds its head row is skipped; a later commit waits for the sweep, then
// finds the row gone and inserts it at its PrevHead), then each row
// published up to its head is deleted.
func (s *Store) OutboxSweep(ctx context.Context, keys []persist.OutboxKey) error {
	if len(keys) == 0 {
		return nil
	}
	tx, err := s.commits.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return unavailable("outbox sweep: begin", err)
	}
	defer tx.Rollback()
	var q strings.Builder
	q.WriteString("SELECT conv_id, head FROM conv_head FORCE INDEX (PRIMARY) WHERE conv_id IN (")
	sqlList(&q, len(keys), "?")
	q.WriteString(") ORDER BY conv_id FOR UPDATE SKIP LOCKED")
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k.ConvID
	}
	rows, err := tx.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return classify("outbox sweep", err)
	}
	heads := map[string]uint64{}
	for rows.Next() {
		var conv string
		var head uint64
		if err := rows.Scan(&conv, &head); err != nil {
			rows.Close()
			return classify("outbox sweep", err)
		}
		heads[conv] = head
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return classify("outbox sweep", err)
	}
	for _, k := range keys {
		head, ok := heads[k.ConvID]
		if !ok {
			continue
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM feed_outbox WHERE part = ? AND conv_id = ? AND published >= ?`,
			k.Partition, k.ConvID, head); err != nil {
			return classify("outbox sweep", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return unavailable("outbox sweep: commit", err)
	}
	return nil
}
