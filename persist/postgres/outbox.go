package postgres

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.Outbox = (*Store)(nil)

// The outbox's SQL (persist.Outbox), shared by every PostgreSQL store
// that keeps the outbox beside conv_head (Citus too). The statements of an
// advance and a sweep also name the conversations by conv_id = ANY, which
// lets Citus route one shard's conversations to that shard (persist/citus).
const (
	// OutboxInsertSQL records a commit's conversations in the outbox: a
	// missing row is inserted, an existing one is left alone (a key
	// lookup, no write, no lock). It must follow the commit's head update,
	// whose row lock keeps OutboxSweepSQL away from the conversation.
	OutboxInsertSQL = `INSERT INTO feed_outbox (part, conv_id, published)
SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[]) ORDER BY 1, 2
ON CONFLICT (part, conv_id) DO NOTHING`

	// OutboxPendingSQL reads a page of a partition's rows with their
	// conversations' heads.
	OutboxPendingSQL = `SELECT o.part, o.conv_id, o.published, coalesce(h.head, 0) FROM feed_outbox AS o
LEFT JOIN conv_head AS h ON h.conv_id = o.conv_id
WHERE o.part = $1 AND o.conv_id > $2 ORDER BY o.conv_id LIMIT $3`

	// OutboxLockSQL locks the rows an advance raises in (part, conv_id)
	// order (an UPDATE locks in whatever order its join takes: two
	// advances of one row, during a handoff, could deadlock).
	OutboxLockSQL = `SELECT 1 FROM feed_outbox
WHERE (part, conv_id) IN (SELECT * FROM unnest($1::int8[], $2::text[])) AND conv_id = ANY($2::text[])
ORDER BY part, conv_id FOR UPDATE`

	// OutboxRaiseSQL raises published seqs (an update of an unindexed
	// column: HOT, beside the row, with the table's fillfactor).
	OutboxRaiseSQL = `UPDATE feed_outbox AS o SET published = m.pub
FROM (SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[]) AS m(part, conv_id, pub) ORDER BY 1, 2) AS m
WHERE o.part = m.part AND o.conv_id = m.conv_id AND o.published < m.pub AND o.conv_id = ANY($2::text[])`

	// OutboxSweepSQL deletes the named rows published up to their
	// conversation's head. The heads are read with FOR SHARE SKIP LOCKED:
	// a conversation whose commit holds its head row is skipped, and a
	// commit that comes later waits for the sweep, then finds the row
	// gone and inserts it at its PrevHead (OutboxInsertSQL). A head row
	// locked after the statement began is read in its newest committed
	// version (READ COMMITTED).
	OutboxSweepSQL = `WITH l AS MATERIALIZED (SELECT conv_id, head FROM conv_head
  WHERE conv_id = ANY($2::text[]) ORDER BY conv_id FOR SHARE SKIP LOCKED)
DELETE FROM feed_outbox AS o USING unnest($1::int8[], $2::text[]) AS m(part, conv_id), l
WHERE o.part = m.part AND o.conv_id = m.conv_id AND l.conv_id = o.conv_id AND o.published >= l.head
  AND o.conv_id = ANY($2::text[])`
)

// customPlansSQL makes the transaction's statements plan with their
// arguments (plan_cache_mode). The advance's and the sweep's conv_id =
// ANY($2) over thousands of conversations is a hashed lookup in a plan
// made for the array at hand, but a linear scan of the array for every
// outbox row in PostgreSQL's generic plan of a prepared statement, which
// it takes after five executions on a connection: with 7,000 rows, 0.5 s
// instead of 15 ms for the raise, 1.3 s for the lock, and commits waiting
// on the locked rows meanwhile (docs/BENCHMARKS.md, "The firehose").
const customPlansSQL = "SET LOCAL plan_cache_mode = force_custom_plan"

// OutboxInsertInto is OutboxInsertSQL on table (feed_outbox, or one of its
// shard tables on a Citus worker: persist/citus's direct writes), its
// three arrays from parameter $first on.
func OutboxInsertInto(table string, first int) string {
	p := func(k int) string { return "$" + strconv.Itoa(first+k) }
	return `INSERT INTO ` + table + ` (part, conv_id, published)
SELECT * FROM unnest(` + p(0) + `::int8[], ` + p(1) + `::text[], ` + p(2) + `::int8[]) ORDER BY 1, 2
ON CONFLICT (part, conv_id) DO NOTHING`
}

// QueueOutbox queues the commit's outbox insert on b (nothing when no
// batch asks for it), after the head update.
func QueueOutbox(b *pgx.Batch, batches []persist.ConvBatch) {
	if args, n := OutboxArgs(batches); n > 0 {
		b.Queue(OutboxInsertSQL, args...)
	}
}

// OutboxArgs are OutboxInsertSQL's three arrays for the batches' outbox
// rows (empty arrays when none), and the number of rows.
func OutboxArgs(batches []persist.ConvBatch) ([]any, int) {
	rows := persist.OutboxRowsOf(batches)
	parts, convs, pubs := make([]int64, len(rows)), make([]string, len(rows)), make([]int64, len(rows))
	for i, r := range rows {
		parts[i], convs[i], pubs[i] = int64(r.Partition), r.ConvID, int64(r.Published)
	}
	return []any{parts, convs, pubs}, len(rows)
}

// OutboxPending implements persist.Outbox.
func (s *Store) OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]persist.OutboxRow, error) {
	rows, err := s.pool.Query(ctx, OutboxPendingSQL, int64(part), after, limit)
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

// OutboxAdvance implements persist.Outbox: the lock and the raise in one
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
		b.Queue(customPlansSQL)
		b.Queue(OutboxLockSQL, parts, convs)
		b.Queue(OutboxRaiseSQL, parts, convs, tos)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return unavailable("outbox advance", err)
	}
	return nil
}

// OutboxSweep implements persist.Outbox, committed without waiting for
// the WAL flush (a deletion lost in a crash is swept again).
func (s *Store) OutboxSweep(ctx context.Context, keys []persist.OutboxKey) error {
	if len(keys) == 0 {
		return nil
	}
	parts, convs := make([]int64, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		parts[i], convs[i] = int64(k.Partition), k.ConvID
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue("SET LOCAL synchronous_commit = off")
		b.Queue(customPlansSQL)
		b.Queue(OutboxSweepSQL, parts, convs)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return unavailable("outbox sweep", err)
	}
	return nil
}
