package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.Outbox = (*Store)(nil)

// outboxUpsertSQL records a commit's conversations in the outbox
// (persist.Outbox: a new row as given, an existing one takes only the new
// head), in (part, conv_id) order like outboxRaiseSQL, so the two never
// wait for each other's rows in opposite orders.
const outboxUpsertSQL = `INSERT INTO feed_outbox (part, conv_id, published, head)
SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[], $4::int8[]) ORDER BY 1, 2
ON CONFLICT (part, conv_id) DO UPDATE SET head = excluded.head`

// outboxLockSQL locks the rows an advance touches in (part, conv_id)
// order, the order of a commit's upsert (outboxUpsertSQL): the UPDATE and
// DELETE that follow lock in whatever order their join takes, which
// deadlocked with commits under load.
const outboxLockSQL = `SELECT 1 FROM feed_outbox
WHERE (part, conv_id) IN (SELECT * FROM unnest($1::int8[], $2::text[]))
ORDER BY part, conv_id FOR UPDATE`

const outboxRaiseSQL = `UPDATE feed_outbox AS o SET published = m.pub
FROM (SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[]) AS m(part, conv_id, pub) ORDER BY 1, 2) AS m
WHERE o.part = m.part AND o.conv_id = m.conv_id AND o.published < m.pub`

const outboxDeleteSQL = `DELETE FROM feed_outbox AS o
USING unnest($1::int8[], $2::text[]) AS m(part, conv_id)
WHERE o.part = m.part AND o.conv_id = m.conv_id AND o.published >= o.head`

// queueOutbox queues the commit's outbox upsert on b (nothing when no
// batch asks for it).
func queueOutbox(b *pgx.Batch, batches []persist.ConvBatch) {
	rows := persist.OutboxRowsOf(batches)
	if len(rows) == 0 {
		return
	}
	parts, convs, pubs, heads := make([]int64, len(rows)), make([]string, len(rows)), make([]int64, len(rows)), make([]int64, len(rows))
	for i, r := range rows {
		parts[i], convs[i], pubs[i], heads[i] = int64(r.Partition), r.ConvID, int64(r.Published), int64(r.Head)
	}
	b.Queue(outboxUpsertSQL, parts, convs, pubs, heads)
}

// OutboxPending implements persist.Outbox.
func (s *Store) OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]persist.OutboxRow, error) {
	if s.dist != nil {
		return nil, persist.ErrNoOutbox
	}
	rows, err := s.pool.Query(ctx, `SELECT part, conv_id, published, head FROM feed_outbox
WHERE part = $1 AND conv_id > $2 ORDER BY conv_id LIMIT $3`, int64(part), after, limit)
	if err != nil {
		return nil, unavailable("outbox pending", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (persist.OutboxRow, error) {
		var p, pub, head int64
		var conv string
		err := r.Scan(&p, &conv, &pub, &head)
		return persist.OutboxRow{Partition: uint32(p), ConvID: conv, Published: uint64(pub), Head: uint64(head)}, err
	})
	if err != nil {
		return nil, unavailable("outbox pending", err)
	}
	return out, nil
}

// OutboxAdvance implements persist.Outbox: the raise and the delete in one
// pipelined transaction, committed without waiting for the WAL flush.
func (s *Store) OutboxAdvance(ctx context.Context, moves []persist.OutboxMove) error {
	if s.dist != nil {
		return persist.ErrNoOutbox
	}
	if len(moves) == 0 {
		return nil
	}
	parts, convs, tos := make([]int64, len(moves)), make([]string, len(moves)), make([]int64, len(moves))
	for i, m := range moves {
		parts[i], convs[i], tos[i] = int64(m.Partition), m.ConvID, int64(m.To)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		// A cursor move lost in a crash only makes the next owner publish
		// those messages again (JetStream drops them by Nats-Msg-Id): it
		// need not wait for the WAL's flush.
		b.Queue("SET LOCAL synchronous_commit = off")
		b.Queue(outboxLockSQL, parts, convs)
		b.Queue(outboxRaiseSQL, parts, convs, tos)
		b.Queue(outboxDeleteSQL, parts, convs)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return unavailable("outbox advance", err)
	}
	return nil
}
