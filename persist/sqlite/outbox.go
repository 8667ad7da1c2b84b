package sqlite

import (
	"context"
	"database/sql"
	"strings"

	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.Outbox = (*Store)(nil)

// outboxUpsertSQL records n conversations in the outbox (persist.Outbox:
// a new row as given, an existing one takes only the new head).
func outboxUpsertSQL(n int) string {
	return `INSERT INTO feed_outbox (part, conv_id, published, head) VALUES (?,?,?,?)` + strings.Repeat(",(?,?,?,?)", n-1) + `
		ON CONFLICT (part, conv_id) DO UPDATE SET head = excluded.head`
}

// stageOutbox writes the commit's outbox rows inside its transaction.
func stageOutbox(ctx context.Context, tx *sql.Tx, batches []persist.ConvBatch) error {
	rows := persist.OutboxRowsOf(batches)
	for lo := 0; lo < len(rows); lo += headChunk {
		hi := min(lo+headChunk, len(rows))
		args := make([]any, 0, 4*(hi-lo))
		for _, r := range rows[lo:hi] {
			args = append(args, int64(r.Partition), r.ConvID, int64(r.Published), int64(r.Head))
		}
		if _, err := tx.ExecContext(ctx, outboxUpsertSQL(hi-lo), args...); err != nil {
			return classify("commit: outbox", err)
		}
	}
	return nil
}

// OutboxPending implements persist.Outbox.
func (s *Store) OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]persist.OutboxRow, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT part, conv_id, published, head FROM feed_outbox
		WHERE part = ? AND conv_id > ? ORDER BY conv_id LIMIT ?`, int64(part), after, limit)
	if err != nil {
		return nil, classify("outbox pending", err)
	}
	defer rows.Close()
	var out []persist.OutboxRow
	for rows.Next() {
		var p, pub, head int64
		var conv string
		if err := rows.Scan(&p, &conv, &pub, &head); err != nil {
			return nil, classify("outbox pending", err)
		}
		out = append(out, persist.OutboxRow{Partition: uint32(p), ConvID: conv, Published: uint64(pub), Head: uint64(head)})
	}
	if err := rows.Err(); err != nil {
		return nil, classify("outbox pending", err)
	}
	return out, nil
}

// OutboxAdvance implements persist.Outbox.
func (s *Store) OutboxAdvance(ctx context.Context, moves []persist.OutboxMove) error {
	if len(moves) == 0 {
		return nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return unavailable("outbox advance: begin", err)
	}
	defer tx.Rollback()
	for _, m := range moves {
		if _, err := tx.ExecContext(ctx, `UPDATE feed_outbox SET published = ?3
			WHERE part = ?1 AND conv_id = ?2 AND published < ?3`, int64(m.Partition), m.ConvID, int64(m.To)); err != nil {
			return classify("outbox advance", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM feed_outbox
			WHERE part = ?1 AND conv_id = ?2 AND published >= head`, int64(m.Partition), m.ConvID); err != nil {
			return classify("outbox advance", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return unavailable("outbox advance: commit", err)
	}
	return nil
}
