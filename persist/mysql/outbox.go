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
// given, an existing one takes only the new head) into the transaction's
// statements, in (part, conv_id) order like OutboxAdvance's.
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
	b.WriteString("INSERT INTO feed_outbox (part, conv_id, published, head) VALUES ")
	sqlList(b, len(rows), "(?,?,?,?)")
	b.WriteString(" ON DUPLICATE KEY UPDATE head = VALUES(head);")
	for _, r := range rows {
		args = append(args, r.Partition, r.ConvID, r.Published, r.Head)
	}
	return args
}

// OutboxPending implements persist.Outbox.
func (s *Store) OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]persist.OutboxRow, error) {
	var out []persist.OutboxRow
	err := s.readRows(ctx, `SELECT part, conv_id, published, head FROM feed_outbox
		WHERE part = ? AND conv_id > ? ORDER BY conv_id LIMIT ?`, []any{part, after, limit}, func(rows *sql.Rows) error {
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

// OutboxAdvance implements persist.Outbox: the raises and the deletes in
// one transaction.
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
		if _, err := tx.ExecContext(ctx, `DELETE FROM feed_outbox WHERE part = ? AND conv_id = ? AND published >= head`,
			m.Partition, m.ConvID); err != nil {
			return classify("outbox advance", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return unavailable("outbox advance: commit", err)
	}
	return nil
}
