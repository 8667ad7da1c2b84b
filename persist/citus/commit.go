package citus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

// SQLSTATEs of Citus's commits (SQ001-SQ003 are persist/postgres's).
const (
	sqlStaleEpoch = "SQ004" // seq_cas_heads: DETAIL: JSON array of conv_ids whose head row has a newer epoch
	sqlNotHere    = "SQ005" // direct writes: the shard is not (only) on this worker
	sqlNotMoved   = "SQ006" // direct writes: DETAIL: JSON array of conv_ids whose head did not move

	sqlUndefinedTable = "42P01"
	sqlNoPrivilege    = "42501"
)

// casHeadsSQL is the head compare-and-set with the fence epochs through
// Citus (migrations_citus/0003_commit_check.sql).
const casHeadsSQL = `SELECT seq_cas_heads($1::text[], $2::int8[], $3::int8[], $4::int8[])`

// Direct writes (Citus). A transaction whose conversations are all in one
// shard runs on the worker holding it; there, every statement on a
// distributed table goes through Citus's planner and local executor (the
// profile in docs/BENCHMARKS.md: an INSERT ... SELECT is planned as "pull
// to coordinator", its rows collected and copied into the shard; the
// head update re-planned per shard task), which cost the worker about
// twice plain PostgreSQL's CPU per message. So the commit writes the
// shard's own tables (conv_head_NNN, im_message_NNN) with the plain
// statements, guarded the way Citus guards its own writes:
//
//  1. lockShardSQL takes the shard's metadata lock in ShareLock, as
//     Citus's executor does before every write (AcquireMetadataLocks). A
//     shard move or split takes it in ExclusiveLock on every node
//     (BlockWritesToShardList) before it switches the placement, and holds
//     it until its transaction commits; one co-located shard's lock blocks
//     the whole group's move.
//  2. shardHereSQL, a later statement (so with a snapshot taken after the
//     lock), checks in the worker's copy of Citus's metadata that both
//     shards have exactly one placement, active, on this worker, and
//     raises sqlNotHere otherwise: after a move the old worker's tables
//     are orphans awaiting deferred drop, and writing them would lose the
//     commit. Then nothing is written; the store runs the commit through
//     Citus on the same connection and reloads the placements
//     (Commit).
//  3. casShardSQL (the head compare-and-set, as persist/postgres's with the
//     epochs of seq_cas_heads) and the rows' INSERT into the shard
//     tables, then COMMIT: no Citus planning, no local executor.
//
// Still one pipelined round trip; a move cannot switch the placement
// between the check and COMMIT, because the lock is held until then.
const lockShardSQL = `SELECT lock_shard_metadata(5, $1::int8[])` // 5: ShareLock

const shardHereSQL = `SELECT seq_raise('SQ005', 'shard not on this worker', $1::int8[]::text)
FROM (SELECT count(*) AS n,
        count(*) FILTER (WHERE p.shardstate = 1 AND p.groupid = (SELECT groupid FROM pg_dist_local_group)) AS here
      FROM pg_dist_placement p WHERE p.shardid = ANY($1::int8[])) c
WHERE c.n <> cardinality($1::int8[]) OR c.here <> c.n`

// casShardSQL moves the heads of one shard's conversations by
// compare-and-set with the fence epochs (the rules of seq_cas_heads,
// migrations_citus/0003) on the shard's conv_head table; it raises
// sqlNotMoved naming the conversations that did not move, which the store
// then classifies as stale epoch or head mismatch (casRefusal).
func casShardSQL(table pgx.Identifier) string {
	return postgres.HeadCASSQL(table.Sanitize(), true, sqlNotMoved, "head not moved")
}

// casShardsSQL is casShardSQL on several shard tables in one statement
// (4 arrays per table, in the order of tables; empty arrays for a table
// the commit does not touch), raising sqlNotMoved once for all of them.
func casShardsSQL(tables []pgx.Identifier) string {
	var ctes, unmoved []string
	for k, t := range tables {
		sfx := strconv.Itoa(k)
		ctes = append(ctes, postgres.HeadCASCTEs(t.Sanitize(), sfx, 1+4*k, true))
		unmoved = append(unmoved, "SELECT u.conv_id FROM u"+sfx+" AS u WHERE NOT EXISTS (SELECT 1 FROM matched"+sfx+" m WHERE m.conv_id = u.conv_id)")
	}
	return "WITH " + strings.Join(ctes, ", ") + `
SELECT seq_raise('` + sqlNotMoved + `', 'head not moved', json_agg(x.conv_id ORDER BY x.conv_id)::text)
FROM (` + strings.Join(unmoved, "\n  UNION ALL ") + `) AS x
HAVING count(*) > 0`
}

// insertShardsSQL inserts rows into several shard tables of im_message in
// one statement (RowCols arrays per table, as postgres.InsertInto's, in the order of
// tables; empty arrays for a table the commit does not touch).
func insertShardsSQL(tables []pgx.Identifier) string {
	var ctes []string
	for k, t := range tables {
		ctes = append(ctes, "i"+strconv.Itoa(k)+" AS (INSERT INTO "+t.Sanitize()+" ("+strings.Join(postgres.InsertColumns, ", ")+")\n  "+postgres.UnnestRowsSQL(1+postgres.RowCols*k)+")")
	}
	return "WITH " + strings.Join(ctes, ",\n") + "\nSELECT 1"
}

// headEpochsSQL reads the head rows' epochs of conversations of one worker
// (through Citus, pruned to their shards by conv_id = ANY).
const headEpochsSQL = `SELECT conv_id, epoch FROM conv_head WHERE conv_id = ANY($1::text[])`

// errShardNotHere: a direct write found its shard gone from the worker
// (shardHereSQL), or the worker refused it; nothing was written.
var errShardNotHere = errors.New("citus: the shard is not on this worker")

// conflictDistSQL is conflictSQL on Citus, where every unique key holds
// conv_id: (conv_id, msg_id), (conv_id, seq), (conv_id, from_uid,
// client_msg_id). Every branch names the commit's conversations, so it
// runs on their shard.
const conflictDistSQL = `SELECT 1, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($1::int8[], $2::text[]) AS u(msg_id, conv_id) ON m.conv_id = u.conv_id AND m.msg_id = u.msg_id
  WHERE m.conv_id = ANY($2::text[])
UNION ALL
SELECT 2, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($2::text[], $3::int8[]) AS u(conv_id, seq) ON m.conv_id = u.conv_id AND m.seq = u.seq
  WHERE m.conv_id = ANY($2::text[])
UNION ALL
SELECT 3, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($2::text[], $4::int8[], $5::text[]) AS u(conv_id, from_uid, client_msg_id)
    ON m.conv_id = u.conv_id AND m.from_uid = u.from_uid AND m.client_msg_id = u.client_msg_id
  WHERE m.conv_id = ANY($2::text[])`

// routedPlan is a commit through Citus's own path (several workers, a
// shard that moved, or a store without direct writes): the distributed
// tables, the same rules as direct writes in seq_cas_heads.
type routedPlan struct{}

func (routedPlan) Pieces(batches []persist.ConvBatch) []postgres.CommitPiece {
	return []postgres.CommitPiece{{Batches: batches, MsgTable: pgx.Identifier{"im_message"}, Insert: postgres.InsertInto("im_message")}}
}

func (routedPlan) QueueChecks(b *pgx.Batch, batches []persist.ConvBatch, pieces []postgres.CommitPiece) {
	h := &pieces[0].Heads
	b.Queue(casHeadsSQL, h.Args(true)...)
	postgres.QueueOutbox(b, batches)
}

func (routedPlan) QueueRows(b *pgx.Batch, pieces []postgres.CommitPiece) {
	postgres.QueueRows(b, pieces)
}

func (routedPlan) QueueMarks(b *pgx.Batch, batches []persist.ConvBatch, _ []postgres.CommitPiece) {
	postgres.QueueSenderMarks(b, batches)
}

func (routedPlan) Refusal(_ context.Context, _ *pgxpool.Conn, batches []persist.ConvBatch, pg *pgconn.PgError) error {
	return refusal(batches, pg)
}

// refusal reads seq_cas_heads' refusals.
func refusal(batches []persist.ConvBatch, pg *pgconn.PgError) error {
	switch pg.Code {
	case postgres.SQLHeadMismatch:
		return postgres.HeadMismatch(pg)
	case sqlStaleEpoch:
		return staleEpochs(batches, pg)
	}
	return nil
}

func (routedPlan) ConflictLookup() (string, bool) { return conflictDistSQL, true }

// The CommitPlan of direct writes (directPlan, store.go): the shard tables
// of one worker, guarded as "Direct writes" says.

func (p *directPlan) Pieces(batches []persist.ConvBatch) []postgres.CommitPiece {
	return p.pieces(batches)
}

func (p *directPlan) QueueChecks(b *pgx.Batch, _ []persist.ConvBatch, pieces []postgres.CommitPiece) {
	// The fences were checked against the cached lease table
	// (checkFences), the head rows carry the epochs (fence.go, "Fencing
	// on Citus").
	b.Queue(lockShardSQL, p.lockIDs())
	b.Queue(shardHereSQL, p.shardIDs())
	if p.all != nil {
		args := make([]any, 0, 4*len(pieces))
		for i := range pieces {
			h := &pieces[i].Heads
			args = append(args, h.Args(true)...)
		}
		b.Queue(p.all.cas, args...)
	} else {
		for i := range pieces {
			h := &pieces[i].Heads
			b.Queue(casShardSQL(p.shards[i].headTable), h.Args(true)...)
		}
	}
	// The outbox rows in the co-located shards of feed_outbox, in this
	// transaction.
	outboxWrite.queue(b, pieces, p.pieceShards(), p.all)
}

func (p *directPlan) QueueRows(b *pgx.Batch, pieces []postgres.CommitPiece) {
	if p.all == nil {
		postgres.QueueRows(b, pieces)
		return
	}
	args := make([]any, 0, postgres.RowCols*len(pieces))
	for i := range pieces {
		args = append(args, pieces[i].Rows.Args()...)
	}
	b.Queue(p.all.insert, args...)
}

// QueueMarks writes the own-send rule into the co-located shards of
// read_position.
func (p *directPlan) QueueMarks(b *pgx.Batch, _ []persist.ConvBatch, pieces []postgres.CommitPiece) {
	marksWrite.queue(b, pieces, p.pieceShards(), p.all)
}

func (p *directPlan) Refusal(ctx context.Context, conn *pgxpool.Conn, batches []persist.ConvBatch, pg *pgconn.PgError) error {
	switch pg.Code {
	case sqlNotHere, sqlUndefinedTable, sqlNoPrivilege:
		// A shard left this worker (its tables are gone or orphans), or
		// the worker refused the metadata lock (it does not see the
		// store's user as the tables' owner): nothing was written.
		return fmt.Errorf("%w: %w", errShardNotHere, postgres.Unavailable("commit", pg))
	case sqlNotMoved:
		return casRefusal(ctx, conn, batches, pg)
	}
	return refusal(batches, pg)
}

func (p *directPlan) ConflictLookup() (string, bool) { return conflictDistSQL, true }

// shardWrite is a per-shard write of a commit besides its messages (Citus,
// direct writes): the outbox rows or the senders' read positions, into
// the piece's co-located shard table.
type shardWrite struct {
	args  func([]persist.ConvBatch) ([]any, int) // a piece's arrays and row count
	into  func(table string, first int) string   // the statement on one table
	table func(*shardRange) pgx.Identifier
	all   func(*workerTables) string // the statement on the worker's every shard
}

var outboxWrite = shardWrite{
	args:  postgres.OutboxArgs,
	into:  postgres.OutboxInsertInto,
	table: func(sh *shardRange) pgx.Identifier { return sh.outTable },
	all:   func(w *workerTables) string { return w.outbox },
}

var marksWrite = shardWrite{
	args: func(bs []persist.ConvBatch) ([]any, int) {
		marks := persist.SenderMarks(bs)
		return postgres.SenderMarksArrays(marks), len(marks)
	},
	into:  postgres.SenderMarksInto,
	table: func(sh *shardRange) pgx.Identifier { return sh.posTable },
	all:   func(w *workerTables) string { return w.marks },
}

// queue queues the write of the pieces (pieces[k] in shards[k]): with all
// (the worker's every shard) one statement with each piece's arrays in
// shard order, else a statement per piece that has rows.
func (w shardWrite) queue(b *pgx.Batch, pieces []postgres.CommitPiece, shards []shardRange, all *workerTables) {
	var every []any
	n := 0
	for i := range pieces {
		a, k := w.args(pieces[i].Batches)
		n += k
		if all != nil {
			every = append(every, a...)
		} else if k > 0 {
			b.Queue(w.into(w.table(&shards[i]).Sanitize(), 1), a...)
		}
	}
	if all != nil && n > 0 {
		b.Queue(w.all(all), every...)
	}
}

// outboxShardsSQL is outboxInsertInto on several shard tables of
// feed_outbox (Citus, direct writes) in one statement: three arrays per
// table, in the order of tables, empty for a table the commit does not
// touch.
func outboxShardsSQL(tables []pgx.Identifier) string {
	ctes := make([]string, len(tables))
	for k, t := range tables {
		ctes[k] = "o" + strconv.Itoa(k) + " AS (" + postgres.OutboxInsertInto(t.Sanitize(), 1+3*k) + ")"
	}
	return "WITH " + strings.Join(ctes, ",\n") + "\nSELECT 1"
}

// senderMarksShardsSQL is senderMarksInto on several shard tables of
// read_position (Citus, direct writes) in one statement: three arrays per
// table, in the order of tables, empty for a table the commit does not
// touch.
func senderMarksShardsSQL(tables []pgx.Identifier) string {
	ctes := make([]string, len(tables))
	for k, t := range tables {
		ctes[k] = "r" + strconv.Itoa(k) + " AS (" + postgres.SenderMarksInto(t.Sanitize(), 1+3*k) + ")"
	}
	return "WITH " + strings.Join(ctes, ",\n") + "\nSELECT 1"
}

// casRefusal classifies a casShardSQL refusal (sqlNotMoved, DETAIL: the
// conversations whose head did not move) as seq_cas_heads does: the
// conversations whose head row carries a newer epoch than their batch's
// fence make a *StaleFenceError; otherwise all of them a
// *HeadMismatchError. The epochs are read after the rollback: an epoch
// only grows, so a later read can only find a stale owner staler.
func casRefusal(ctx context.Context, conn *pgxpool.Conn, batches []persist.ConvBatch, pg *pgconn.PgError) error {
	var convs []string
	if err := json.Unmarshal([]byte(pg.Detail), &convs); err != nil || len(convs) == 0 {
		return postgres.Unavailable("commit: unreadable compare-and-set report", pg)
	}
	rows, err := conn.Query(ctx, headEpochsSQL, convs)
	if err != nil {
		return postgres.Unavailable("commit: read head epochs", errors.Join(pg, err))
	}
	epochs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		conv  string
		epoch int64
	}, error) {
		var v struct {
			conv  string
			epoch int64
		}
		err := r.Scan(&v.conv, &v.epoch)
		return v, err
	})
	if err != nil {
		return postgres.Unavailable("commit: read head epochs", errors.Join(pg, err))
	}
	stored := make(map[string]int64, len(epochs))
	for _, e := range epochs {
		stored[e.conv] = e.epoch
	}
	if err := staleByHead(batches, func(b *persist.ConvBatch) bool {
		e, ok := stored[b.ConvID]
		return ok && b.Fence.Epoch > 0 && e > int64(b.Fence.Epoch)
	}); err != nil {
		return err
	}
	return persist.HeadsMismatched(convs)
}

// staleEpochs builds the *StaleFenceError of a seq_cas_heads refusal (Citus):
// DETAIL is the JSON array of the conversations whose head row carries a
// newer epoch; the error names their batches' fences.
func staleEpochs(batches []persist.ConvBatch, pg *pgconn.PgError) error {
	var convs []string
	if err := json.Unmarshal([]byte(pg.Detail), &convs); err != nil || len(convs) == 0 {
		return postgres.Unavailable("commit: unreadable stale-epoch report", pg)
	}
	named := map[string]bool{}
	for _, c := range convs {
		named[c] = true
	}
	return staleByHead(batches, func(b *persist.ConvBatch) bool { return named[b.ConvID] })
}

// staleByHead is the head-row fence (Citus: the head carries its owner's
// epoch): the distinct fences of the batches whose head row is newer, in
// batch order, as membership.CheckFences refuses them; nil if none.
func staleByHead(batches []persist.ConvBatch, newer func(*persist.ConvBatch) bool) error {
	var stale []persist.Fence
	for i := range batches {
		if f := batches[i].Fence; newer(&batches[i]) && !slices.Contains(stale, f) {
			stale = append(stale, f)
		}
	}
	return membership.CheckFences(stale, false, membership.NotIn(stale), nil)
}
