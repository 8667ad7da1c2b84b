package postgres

import (
	"context"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.Outbox = (*Store)(nil)

// outboxUpsertSQL records a commit's conversations in the outbox
// (persist.Outbox: a new row as given, an existing one takes only the new
// head), in (part, conv_id) order like outboxRaiseSQL, so the two never
// wait for each other's rows in opposite orders.
var outboxUpsertSQL = outboxUpsertInto("feed_outbox", 1)

// outboxUpsertInto is outboxUpsertSQL on table (feed_outbox, or one of its
// shard tables on a Citus worker: direct writes), its four arrays from
// parameter $first on.
func outboxUpsertInto(table string, first int) string {
	p := func(k int) string { return "$" + strconv.Itoa(first+k) }
	return `INSERT INTO ` + table + ` (part, conv_id, published, head)
SELECT * FROM unnest(` + p(0) + `::int8[], ` + p(1) + `::text[], ` + p(2) + `::int8[], ` + p(3) + `::int8[]) ORDER BY 1, 2
ON CONFLICT (part, conv_id) DO UPDATE SET head = excluded.head`
}

// outboxShardsSQL is outboxUpsertInto on several shard tables of
// feed_outbox (Citus, direct writes) in one statement: four arrays per
// table, in the order of tables, empty for a table the commit does not
// touch.
func outboxShardsSQL(tables []pgx.Identifier) string {
	ctes := make([]string, len(tables))
	for k, t := range tables {
		ctes[k] = "o" + strconv.Itoa(k) + " AS (" + outboxUpsertInto(t.Sanitize(), 1+4*k) + ")"
	}
	return "WITH " + strings.Join(ctes, ",\n") + "\nSELECT 1"
}

// outboxLockSQL locks the rows an advance touches in (part, conv_id)
// order, the order of a commit's upsert (outboxUpsertSQL): the UPDATE and
// DELETE that follow lock in whatever order their join takes, which
// deadlocked with commits under load. The three statements also name the
// conversations by conv_id = ANY, which lets Citus route an advance of one
// shard's conversations to that shard (persist/citus).
const outboxLockSQL = `SELECT 1 FROM feed_outbox
WHERE (part, conv_id) IN (SELECT * FROM unnest($1::int8[], $2::text[])) AND conv_id = ANY($2::text[])
ORDER BY part, conv_id FOR UPDATE`

const outboxRaiseSQL = `UPDATE feed_outbox AS o SET published = m.pub
FROM (SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[]) AS m(part, conv_id, pub) ORDER BY 1, 2) AS m
WHERE o.part = m.part AND o.conv_id = m.conv_id AND o.published < m.pub AND o.conv_id = ANY($2::text[])`

const outboxDeleteSQL = `DELETE FROM feed_outbox AS o
USING unnest($1::int8[], $2::text[]) AS m(part, conv_id)
WHERE o.part = m.part AND o.conv_id = m.conv_id AND o.published >= o.head AND o.conv_id = ANY($2::text[])`

// queueOutbox queues the commit's outbox upsert on b (nothing when no
// batch asks for it).
func queueOutbox(b *pgx.Batch, batches []persist.ConvBatch) {
	if args, n := outboxArgs(batches); n > 0 {
		b.Queue(outboxUpsertSQL, args...)
	}
}

// outboxArgs are outboxUpsertSQL's four arrays for the batches' outbox
// rows (empty arrays when none), and the number of rows.
func outboxArgs(batches []persist.ConvBatch) ([]any, int) {
	rows := persist.OutboxRowsOf(batches)
	parts, convs, pubs, heads := make([]int64, len(rows)), make([]string, len(rows)), make([]int64, len(rows)), make([]int64, len(rows))
	for i, r := range rows {
		parts[i], convs[i], pubs[i], heads[i] = int64(r.Partition), r.ConvID, int64(r.Published), int64(r.Head)
	}
	return []any{parts, convs, pubs, heads}, len(rows)
}

// OutboxPending implements persist.Outbox.
func (s *Store) OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]persist.OutboxRow, error) {
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
