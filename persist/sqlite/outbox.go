package sqlite

import (
	"context"
	"database/sql"
	"strings"

	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.Outbox = (*Store)(nil)

// outboxUpsertSQL records n conversations in the outbox (persist.Outbox:
// a new row as given, an existing one left alone).
func outboxUpsertSQL(n int) string {
	return `INSERT INTO feed_outbox (part, conv_id, published) VALUES (?,?,?)` + strings.Repeat(",(?,?,?)", n-1) + `
		ON CONFLICT (part, conv_id) DO NOTHING`
}

// stageOutbox writes the commit's outbox rows inside its transaction.
func stageOutbox(ctx context.Context, tx *sql.Tx, batches []persist.ConvBatch) error {
	rows := persist.OutboxRowsOf(batches)
	for lo := 0; lo < len(rows); lo += headChunk {
		hi := min(lo+headChunk, len(rows))
		args := make([]any, 0, 3*(hi-lo))
		for _, r := range rows[lo:hi] {
			args = append(args, int64(r.Partition), r.ConvID, int64(r.Published))
		}
		if _, err := tx.ExecContext(ctx, outboxUpsertSQL(hi-lo), args...); err != nil {
			return classify("commit: outbox", err)
		}
	}
	return nil
}

// OutboxPending implements persist.Outbox.
func (s *Store) OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]persist.OutboxRow, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT o.part, o.conv_id, o.published, COALESCE(h.head, 0) FROM feed_outbox AS o
		LEFT JOIN conv_head AS h ON h.conv_id = o.conv_id
		WHERE o.part = ? AND o.conv_id > ? ORDER BY o.conv_id LIMIT ?`, int64(part), after, limit)
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
	}
	if err := tx.Commit(); err != nil {
		return unavailable("outbox advance: commit", err)
	}
	return nil
}

// OutboxSweep implements persist.Outbox (the database has one writer: no
// commit is in progress during the sweep's transaction).
func (s *Store) OutboxSweep(ctx context.Context, keys []persist.OutboxKey) error {
	if len(keys) == 0 {
		return nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return unavailable("outbox sweep: begin", err)
	}
	defer tx.Rollback()
	for _, k := range keys {
		if _, err := tx.ExecContext(ctx, `DELETE FROM feed_outbox WHERE part = ?1 AND conv_id = ?2
			AND published >= (SELECT head FROM conv_head WHERE conv_id = ?2)`, int64(k.Partition), k.ConvID); err != nil {
			return classify("outbox sweep", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return unavailable("outbox sweep: commit", err)
	}
	return nil
}
