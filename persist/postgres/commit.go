package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
)

// fenceSQL locks the partition leases a commit depends on FOR SHARE: an epoch
// bump (UPDATE) waits for in-flight commits, and commits that start after it
// see the new epoch. fenceCheckSQL takes these locks in a commit; tests use
// this statement to hold a fence from outside.
const fenceSQL = `SELECT partition, owner, epoch FROM partition_lease
WHERE partition = ANY($1::int8[]) ORDER BY partition FOR SHARE`

// fenceCheckSQL locks the partition leases of a commit's fences FOR SHARE,
// in partition order (an epoch bump waits for the commit), and fails the
// transaction with SQLSTATE sqlStaleFence if any fence ($1[i], $2[i], $3[i])
// is not the stored (partition, owner, epoch); DETAIL lists the 1-based
// positions i that did not hold. seq_raise comes from migration 0003.
const fenceCheckSQL = `WITH held AS MATERIALIZED (
  SELECT partition, owner, epoch FROM partition_lease
  WHERE partition = ANY($1::int8[]) ORDER BY partition FOR SHARE
)
SELECT seq_raise('SQ001', 'stale fence', string_agg(f.i::text, ',' ORDER BY f.i))
FROM unnest($1::int8[], $2::text[], $3::int8[]) WITH ORDINALITY AS f(p, o, e, i)
WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.partition = f.p AND h.owner = f.o AND h.epoch = f.e)
HAVING count(*) > 0`

// headCheckSQL moves every conversation's head by compare-and-set and fails
// the transaction with SQLSTATE sqlHeadMismatch if any conversation did not
// match; DETAIL is the JSON array of those conv_ids, ascending. A
// conversation with PrevHead 0 matches when it has no row yet (rows are
// created at the first non-empty commit, so a head row is never 0).
var headCheckSQL = headCASSQL("conv_head", false, sqlHeadMismatch, "head mismatch")

// headCASSQL is a commit's head compare-and-set on table, raising code
// (DETAIL: the JSON array of the conversations that did not match,
// ascending) when one did not: headCheckSQL, and with epochs the one of
// Citus's direct writes (casShardSQL), whose head rows carry the fence
// epochs (a head moves only when its row's epoch is at most the batch's,
// or the batch's is 0: unfenced, and takes the larger).
func headCASSQL(table string, epochs bool, code, message string) string {
	return "WITH " + headCASCTEs(table, "", 1, epochs) + `
SELECT seq_raise('` + code + `', '` + message + `', json_agg(u.conv_id ORDER BY u.conv_id)::text)
FROM u WHERE NOT EXISTS (SELECT 1 FROM matched m WHERE m.conv_id = u.conv_id)
HAVING count(*) > 0`
}

// headCASCTEs are the CTEs of headCASSQL for one table: u, upd, ins and
// matched, each name followed by sfx, reading their arrays from parameter
// $first on (3 arrays, 4 with epochs).
func headCASCTEs(table, sfx string, first int, epochs bool) string {
	p := func(k int) string { return "$" + strconv.Itoa(first+k) }
	cols, set, check, ins := "", "", "", ""
	if epochs {
		cols, set = ", "+p(3)+"::int8[]", ", epoch = greatest(h.epoch, u.epoch)"
		check, ins = " AND (u.epoch = 0 OR h.epoch <= u.epoch)", ", epoch"
	}
	from := "u" + sfx // the CTE u, as "u" in the statements that read it
	if sfx != "" {
		from += " AS u"
	}
	return `u` + sfx + ` AS (
  SELECT * FROM unnest(` + p(0) + `::text[], ` + p(1) + `::int8[], ` + p(2) + `::int8[]` + cols + `) AS u(conv_id, prev, head` + ins + `) ORDER BY conv_id
), upd` + sfx + ` AS (
  UPDATE ` + table + ` AS h SET head = u.head` + set + ` FROM ` + from + `
  WHERE h.conv_id = u.conv_id AND h.head = u.prev AND u.prev > 0` + check + `
  RETURNING h.conv_id
), ins` + sfx + ` AS (
  INSERT INTO ` + table + ` (conv_id, head` + ins + `)
  SELECT conv_id, head` + ins + ` FROM ` + from + ` WHERE prev = 0 AND head > 0
  ON CONFLICT (conv_id) DO NOTHING
  RETURNING conv_id
), matched` + sfx + ` AS (
  SELECT conv_id FROM upd` + sfx + `
  UNION ALL SELECT conv_id FROM ins` + sfx + `
  UNION ALL SELECT u.conv_id FROM ` + from + `
    WHERE u.prev = 0 AND u.head = 0 AND NOT EXISTS (SELECT 1 FROM ` + table + ` h WHERE h.conv_id = u.conv_id)
)`
}

// unfencedCheckSQL refuses a commit without fences (a node started without
// --cluster-listen) in a database whose partitions a cluster holds: such a
// node would write conversations that cluster nodes own, unfenced.
const unfencedCheckSQL = `SELECT seq_raise('SQ003', 'unfenced commit in a cluster database', '')
WHERE EXISTS (SELECT 1 FROM partition_lease WHERE owner <> '')`

// SQLSTATEs raised by fenceCheckSQL, headCheckSQL and unfencedCheckSQL.
const (
	sqlStaleFence   = "SQ001" // DETAIL: 1-based positions of the stale fences, comma-separated
	sqlHeadMismatch = "SQ002" // DETAIL: JSON array of the mismatched conv_ids
	sqlUnfenced     = "SQ003"
	sqlStaleEpoch   = "SQ004" // Citus: DETAIL: JSON array of conv_ids whose head row has a newer epoch
	sqlNotHere      = "SQ005" // Citus, direct writes: the shard is not (only) on this worker
	sqlNotMoved     = "SQ006" // Citus, direct writes: DETAIL: JSON array of conv_ids whose head did not move

	sqlUndefinedTable = "42P01"
	sqlNoPrivilege    = "42501"
)

// casHeadsSQL is the distributed mode's head compare-and-set with the fence
// epochs (migrations_citus/0003_commit_check.sql).
const casHeadsSQL = `SELECT seq_cas_heads($1::text[], $2::int8[], $3::int8[], $4::int8[])`

// insertSQL writes all rows of a commit in one statement.
var insertSQL = `INSERT INTO im_message (` + strings.Join(imMessageColumns, ", ") + `)
` + insertRowsSQL

var insertRowsSQL = unnestRowsSQL(1)

// unnestRowsSQL selects rows of im_message from rowCols arrays (the columns
// of imMessageColumns), parameters $first to $first+rowCols-1.
func unnestRowsSQL(first int) string {
	types := []string{"int8", "text", "int8", "int8", "int2", "bytea", "text", "timestamptz", "int2", "int8"}
	args := make([]string, len(types))
	for i, t := range types {
		args[i] = "$" + strconv.Itoa(first+i) + "::" + t + "[]"
	}
	return "SELECT * FROM unnest(" + strings.Join(args, ", ") + ")"
}

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
//     (commitDist).
//  3. casShardSQL (the head compare-and-set, as headCheckSQL with the
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
	return headCASSQL(table.Sanitize(), true, sqlNotMoved, "head not moved")
}

// casShardsSQL is casShardSQL on several shard tables in one statement
// (4 arrays per table, in the order of tables; empty arrays for a table
// the commit does not touch), raising sqlNotMoved once for all of them.
func casShardsSQL(tables []pgx.Identifier) string {
	var ctes, unmoved []string
	for k, t := range tables {
		sfx := strconv.Itoa(k)
		ctes = append(ctes, headCASCTEs(t.Sanitize(), sfx, 1+4*k, true))
		unmoved = append(unmoved, "SELECT u.conv_id FROM u"+sfx+" AS u WHERE NOT EXISTS (SELECT 1 FROM matched"+sfx+" m WHERE m.conv_id = u.conv_id)")
	}
	return "WITH " + strings.Join(ctes, ", ") + `
SELECT seq_raise('` + sqlNotMoved + `', 'head not moved', json_agg(x.conv_id ORDER BY x.conv_id)::text)
FROM (` + strings.Join(unmoved, "\n  UNION ALL ") + `) AS x
HAVING count(*) > 0`
}

// insertShardsSQL inserts rows into several shard tables of im_message in
// one statement (rowCols arrays per table, as insertRowsSQL's, in the order of
// tables; empty arrays for a table the commit does not touch).
func insertShardsSQL(tables []pgx.Identifier) string {
	var ctes []string
	for k, t := range tables {
		ctes = append(ctes, "i"+strconv.Itoa(k)+" AS (INSERT INTO "+t.Sanitize()+" ("+strings.Join(imMessageColumns, ", ")+")\n  "+unnestRowsSQL(1+rowCols*k)+")")
	}
	return "WITH " + strings.Join(ctes, ",\n") + "\nSELECT 1"
}

// headEpochsSQL reads the head rows' epochs of conversations of one worker
// (through Citus, pruned to their shards by conv_id = ANY).
const headEpochsSQL = `SELECT conv_id, epoch FROM conv_head WHERE conv_id = ANY($1::text[])`

// errShardNotHere: a direct write found its shard gone from the worker
// (shardHereSQL), or the worker refused it; nothing was written.
var errShardNotHere = errors.New("citus: the shard is not on this worker")

// conflictSQL finds the stored rows holding any unique key of a failed batch.
const conflictSQL = `SELECT 1, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  WHERE m.msg_id = ANY($1::int8[])
UNION ALL
SELECT 2, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($2::text[], $3::int8[]) AS u(conv_id, seq) ON m.conv_id = u.conv_id AND m.seq = u.seq
UNION ALL
SELECT 3, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($4::int8[], $5::text[]) AS u(from_uid, client_msg_id) ON m.from_uid = u.from_uid AND m.client_msg_id = u.client_msg_id`

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

var imMessageColumns = []string{"msg_id", "conv_id", "seq", "from_uid", "msg_type", "body", "client_msg_id", "server_at", "kind", "target_msg_id"}

// rowCols is the number of columns a commit writes per row (imMessageColumns).
const rowCols = 10

// rowArrays is a commit's rows as column arrays (for unnest or COPY).
type rowArrays struct {
	msgID    []int64
	convID   []string
	seq      []int64
	fromUID  []int64
	msgType  []int16
	body     [][]byte
	clientID []string
	serverAt []time.Time
	kind     []int16
	target   []int64
	events   int // rows of kind edit or recall
}

// args returns the arrays in the order of imMessageColumns.
func (r *rowArrays) args() []any {
	return []any{r.msgID, r.convID, r.seq, r.fromUID, r.msgType, r.body, r.clientID, r.serverAt, r.kind, r.target}
}

func buildRows(batches []persist.ConvBatch) *rowArrays {
	n := 0
	for i := range batches {
		n += len(batches[i].Messages)
	}
	r := &rowArrays{
		msgID: make([]int64, 0, n), convID: make([]string, 0, n), seq: make([]int64, 0, n),
		fromUID: make([]int64, 0, n), msgType: make([]int16, 0, n), body: make([][]byte, 0, n),
		clientID: make([]string, 0, n), serverAt: make([]time.Time, 0, n),
		kind: make([]int16, 0, n), target: make([]int64, 0, n),
	}
	for i := range batches {
		for j := range batches[i].Messages {
			m := &batches[i].Messages[j]
			body := m.Body
			if body == nil {
				body = []byte{} // NULL would break NOT NULL
			}
			r.msgID = append(r.msgID, int64(m.MsgID))
			r.convID = append(r.convID, m.ConvID)
			r.seq = append(r.seq, int64(m.Seq))
			r.fromUID = append(r.fromUID, int64(m.FromUID))
			r.msgType = append(r.msgType, m.MsgType)
			r.body = append(r.body, body)
			r.clientID = append(r.clientID, m.ClientMsgID)
			r.serverAt = append(r.serverAt, storedTime(m.ServerAt))
			r.kind = append(r.kind, int16(m.Kind))
			r.target = append(r.target, int64(m.TargetMsgID))
			if m.Kind != sequencer.KindMessage {
				r.events++
			}
		}
	}
	return r
}

// storedTime is t as stored: UTC, truncated to the millisecond (the column is
// TIMESTAMPTZ(3), which would round instead).
func storedTime(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

func (r *rowArrays) copySource() pgx.CopyFromSource {
	i := -1
	return pgx.CopyFromFunc(func() ([]any, error) {
		i++
		if i >= len(r.msgID) {
			return nil, nil
		}
		return []any{r.msgID[i], r.convID[i], r.seq[i], r.fromUID[i], r.msgType[i], r.body[i], r.clientID[i], r.serverAt[i], r.kind[i], r.target[i]}, nil
	})
}

// Commit writes all batches in one transaction; see persist.Store.
//
// Below copyMinRows rows (the common case) it is ONE round trip: a pipelined
// batch of BEGIN, the fence check and the head compare-and-set (which raise
// inside the server when they refuse: fenceCheckSQL, headCheckSQL), the
// INSERT of every row, and COMMIT. A refusal or unique violation aborts the transaction on the server,
// so the pipelined COMMIT does nothing; only then are follow-up reads made
// (after ROLLBACK) to name the conflicting rows. Once that batch is written,
// a lost connection, timeout or cancel is ErrUnknownOutcome (COMMIT may have
// run); a server error before COMMIT's answer means nothing was written.
//
// From copyMinRows rows the rows go by COPY, which cannot be pipelined:
// BEGIN and the checks, then COPY, then COMMIT (three round trips); failures
// before COMMIT is sent are ErrStoreUnavailable.
func (s *Store) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	check := persist.CheckBatches
	if s.dist != nil {
		check = persist.CheckBatchesKeysPerConv
	}
	if err := check(batches); err != nil {
		return err
	}
	if len(batches) == 0 {
		return nil
	}
	if s.dist != nil {
		return s.commitDist(ctx, batches)
	}
	conn, err := s.commits.Acquire(ctx)
	if err != nil {
		return unavailable("commit: acquire connection", err)
	}
	defer conn.Release() // destroys the connection if a transaction is left open
	backend := backendOf(conn.Conn().PgConn())
	if s.commitBackend != nil {
		s.commitBackend(backend.pid)
	}
	err = s.commitOn(ctx, conn, batches, nil)
	if errors.Is(err, sequencer.ErrUnknownOutcome) {
		// The transaction may still commit on the server: Settle must end
		// it before anyone re-reads. Never reuse this connection.
		s.unsettle(backend, nil, batches)
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Conn().Close(cctx)
		cancel()
	}
	return err
}

// commitOn runs the commit on conn. plan (Citus only) names the shards
// whose tables it writes directly ("Direct writes"); nil: the tables of
// plain PostgreSQL, or the distributed tables through Citus.
func (s *Store) commitOn(ctx context.Context, conn *pgxpool.Conn, batches []persist.ConvBatch, plan *directPlan) error {
	// Distinct non-zero fences, in partition order.
	fences, unfenced := persist.Fences(batches)
	parts := make([]int64, len(fences))
	owners := make([]string, len(fences))
	epochs := make([]int64, len(fences))
	for i, f := range fences {
		parts[i], owners[i], epochs[i] = int64(f.Partition), f.Owner, int64(f.Epoch)
	}
	// The commit's pieces: one, or one per shard with direct writes.
	var pieces []commitPiece
	if plan != nil {
		pieces = plan.pieces(batches)
	} else {
		pieces = []commitPiece{{batches: batches, msgTable: pgx.Identifier{"im_message"}, insert: insertSQL}}
	}
	var all *rowArrays // every row, for the conflict lookup
	nrows := 0
	for i := range pieces {
		pieces[i].prepare()
		nrows += len(pieces[i].rows.msgID)
	}
	if len(pieces) == 1 {
		all = pieces[0].rows
	}
	useCopy := nrows > 0 && (s.mode == insertCopy || (s.mode == insertAuto && nrows >= copyMinRows))

	b := &pgx.Batch{}
	b.Queue("BEGIN")
	switch {
	case plan != nil:
		// Citus, direct writes; the fences were checked against the cached
		// lease table (checkFences), the head rows carry the epochs
		// (citus.go, "Fencing on Citus").
		b.Queue(lockShardSQL, plan.lockIDs())
		b.Queue(shardHereSQL, plan.shardIDs())
		if plan.all != nil {
			args := make([]any, 0, 4*len(pieces))
			for i := range pieces {
				h := &pieces[i].heads
				args = append(args, h.convs, h.prevs, h.heads, h.epochs)
			}
			b.Queue(plan.all.cas, args...)
		} else {
			for i := range pieces {
				h := &pieces[i].heads
				b.Queue(pieces[i].cas, h.convs, h.prevs, h.heads, h.epochs)
			}
		}
		// The outbox rows in the co-located shards of feed_outbox, in
		// this transaction.
		outboxWrite.queue(b, pieces, plan.all)
	case s.dist != nil:
		// Citus, through its own path (several workers, or a shard that
		// moved): the same rules in seq_cas_heads.
		h := &pieces[0].heads
		b.Queue(casHeadsSQL, h.convs, h.prevs, h.heads, h.epochs)
		queueOutbox(b, batches)
	default:
		if len(fences) > 0 {
			b.Queue(fenceCheckSQL, parts, owners, epochs)
		}
		if unfenced {
			b.Queue(unfencedCheckSQL)
		}
		h := &pieces[0].heads
		b.Queue(headCheckSQL, h.convs, h.prevs, h.heads)
		queueOutbox(b, batches)
	}
	insertFrom, commitAt := -1, -1
	if !useCopy {
		insertFrom = b.Len()
		switch {
		case nrows == 0:
		case plan != nil && plan.all != nil:
			args := make([]any, 0, rowCols*len(pieces))
			for i := range pieces {
				args = append(args, pieces[i].rows.args()...)
			}
			b.Queue(plan.all.insert, args...)
		default:
			for i := range pieces {
				if r := pieces[i].rows; len(r.msgID) > 0 {
					b.Queue(pieces[i].insert, r.args()...)
				}
			}
		}
		for i := range pieces {
			pieces[i].queueEvents(b)
		}
		queueMarks(b, pieces, plan, batches)
		commitAt = b.Len()
		b.Queue("COMMIT")
	}
	conflicts := func(err error) error {
		if all == nil {
			all = concatRows(pieces)
		}
		return s.conflicts(ctx, conn, all, err)
	}
	br := conn.SendBatch(ctx, b)
	var tag pgconn.CommandTag
	var err error
	failedAt := -1
	for i := 0; i < b.Len(); i++ {
		if tag, err = br.Exec(); err != nil {
			failedAt = i
			break
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		if commitAt >= 0 && tag.String() == "COMMIT" {
			return nil // COMMIT answered; only reading the end of the batch failed
		}
		err, failedAt = cerr, b.Len()
	}

	if err != nil {
		var pg *pgconn.PgError
		isPg := errors.As(err, &pg)
		switch {
		case commitAt >= 0 && failedAt >= commitAt:
			// The answer to COMMIT itself.
			return commitError(err)
		case commitAt >= 0 && !isPg && !sentNothing(err):
			// COMMIT went out with the batch and the connection failed
			// before its answer: it may have run.
			return unknownOutcome("commit: batch with COMMIT", err)
		}
		// The server refused a statement before COMMIT (the transaction is
		// aborted and the pipelined COMMIT skipped), or nothing that could
		// commit was sent.
		rollback(conn)
		if isPg {
			switch {
			case plan != nil && (pg.Code == sqlNotHere || pg.Code == sqlUndefinedTable || pg.Code == sqlNoPrivilege):
				// A shard left this worker (its tables are gone or
				// orphans), or the worker refused the metadata lock (it
				// does not see the store's user as the tables' owner):
				// nothing was written.
				return fmt.Errorf("%w: %w", errShardNotHere, unavailable("commit", err))
			case pg.Code == sqlNotMoved:
				return s.casRefusal(ctx, conn, batches, pg)
			case pg.Code == sqlStaleFence:
				return staleFences(fences, pg)
			case pg.Code == sqlHeadMismatch:
				return headMismatch(pg)
			case pg.Code == sqlStaleEpoch:
				return staleEpochs(batches, pg)
			case pg.Code == sqlUnfenced:
				return persist.ErrUnfenced
			case insertFrom >= 0 && failedAt >= insertFrom && isUniqueViolation(err):
				return conflicts(err)
			}
		}
		return classify("commit", err)
	}
	if commitAt < 0 {
		// COPY path: the checks passed; rows, then COMMIT.
		for i := range pieces {
			p := &pieces[i]
			if len(p.rows.msgID) == 0 {
				continue
			}
			if _, err := conn.Conn().CopyFrom(ctx, p.msgTable, imMessageColumns, p.rows.copySource()); err != nil {
				rollback(conn)
				if isUniqueViolation(err) {
					return conflicts(err)
				}
				return classify("commit: insert rows", err)
			}
		}
		ev := &pgx.Batch{}
		for i := range pieces {
			pieces[i].queueEvents(ev)
		}
		queueMarks(ev, pieces, plan, batches)
		if ev.Len() > 0 {
			if err := conn.SendBatch(ctx, ev).Close(); err != nil {
				rollback(conn)
				return classify("commit: the targets of edits and recalls, the senders' read positions", err)
			}
		}
		tag, err = conn.Exec(ctx, "COMMIT")
		if err != nil {
			return commitError(err)
		}
	}
	if tag.String() != "COMMIT" {
		// COMMIT of an aborted transaction answers ROLLBACK.
		rollback(conn)
		return unavailable("commit", fmt.Errorf("transaction rolled back (%s)", tag))
	}
	return nil
}

// commitPiece is the part of a commit written to one pair of tables: all of
// it, or one shard's conversations with direct writes (Citus).
type commitPiece struct {
	batches  []persist.ConvBatch
	msgTable pgx.Identifier // im_message, or the shard's table
	insert   string         // the rows' INSERT into msgTable
	cas      string         // direct writes: the head compare-and-set on the shard's conv_head table
	// Direct writes: the shard's tables of read_position and feed_outbox
	// (the own-send rule and the outbox, in the commit's transaction).
	posTable, outTable pgx.Identifier

	heads headArrays
	rows  *rowArrays
}

// headArrays are the head compare-and-set's arguments, in conv_id order.
type headArrays struct {
	convs                []string
	prevs, heads, epochs []int64
}

// prepare builds the piece's head arrays (in conv_id order) and rows.
func (p *commitPiece) prepare() {
	order := make([]int, len(p.batches))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return p.batches[order[a]].ConvID < p.batches[order[b]].ConvID })
	h := headArrays{
		convs: make([]string, len(order)), prevs: make([]int64, len(order)),
		heads: make([]int64, len(order)), epochs: make([]int64, len(order)),
	}
	for k, i := range order {
		b := &p.batches[i]
		h.convs[k], h.prevs[k], h.heads[k], h.epochs[k] = b.ConvID, int64(b.PrevHead), int64(b.LastSeq()), int64(b.Fence.Epoch)
	}
	p.heads = h
	p.rows = buildRows(p.batches)
}

// queueEvents queues the target updates of the piece's edits and recalls
// (persist/events.go) on its message table, after its rows: at most three
// statements whatever the number of events (issue 32: an event costs no
// more than a send), each over arrays with one element per target. An
// edited target gets its last edit's body and time and its edit_count
// raised by its number of edits; a recalled target, and its edit events
// (those of this commit too: they are inserted before), lose their bodies.
// The edits go first: a recall in the same commit leaves its target
// recalled, as the events in seq order would (the rules refuse an edit of a
// recalled message, so no edit follows a recall of its target).
func (p *commitPiece) queueEvents(b *pgx.Batch) {
	if p.rows.events == 0 {
		return
	}
	ev := eventArraysOf(p.batches)
	t := p.msgTable.Sanitize()
	if len(ev.edit.convs) > 0 {
		b.Queue(`UPDATE `+t+` AS m SET body = u.body, edit_count = m.edit_count + u.n, edited_at = u.at
			FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::timestamptz[], $5::int[]) AS u(conv_id, msg_id, body, at, n)
			WHERE m.conv_id = u.conv_id AND m.msg_id = u.msg_id AND m.kind = 0`,
			ev.edit.convs, ev.edit.ids, ev.edit.bodies, ev.edit.ats, ev.edit.counts)
	}
	if len(ev.recall.convs) > 0 {
		b.Queue(`UPDATE `+t+` AS m SET body = '\x', recalled = true
			FROM unnest($1::text[], $2::bigint[]) AS u(conv_id, msg_id)
			WHERE m.conv_id = u.conv_id AND m.msg_id = u.msg_id AND m.kind = 0`, ev.recall.convs, ev.recall.ids)
		b.Queue(`UPDATE `+t+` AS m SET body = '\x', recalled = true
			FROM unnest($1::text[], $2::bigint[]) AS u(conv_id, msg_id)
			WHERE m.conv_id = u.conv_id AND m.target_msg_id = u.msg_id AND m.target_msg_id <> 0 AND m.kind = 1`,
			ev.recall.convs, ev.recall.ids)
	}
}

// eventArrays are a commit's target updates, one element per target.
type eventArrays struct {
	edit struct {
		convs  []string
		ids    []int64
		bodies [][]byte
		ats    []time.Time
		counts []int32
	}
	recall struct {
		convs []string
		ids   []int64
	}
}

// eventArraysOf folds the events of batches into one update per target.
func eventArraysOf(batches []persist.ConvBatch) *eventArrays {
	ev := &eventArrays{}
	type key struct {
		conv string
		id   uint64
	}
	edited := map[key]int{}
	recalled := map[key]bool{}
	for i := range batches {
		for j := range batches[i].Messages {
			m := &batches[i].Messages[j]
			k := key{m.ConvID, m.TargetMsgID}
			switch m.Kind {
			case sequencer.KindEdit:
				body := m.Body
				if body == nil {
					body = []byte{}
				}
				e := &ev.edit
				if at, ok := edited[k]; ok {
					e.bodies[at], e.ats[at] = body, storedTime(m.ServerAt)
					e.counts[at]++
					continue
				}
				edited[k] = len(e.convs)
				e.convs, e.ids = append(e.convs, m.ConvID), append(e.ids, int64(m.TargetMsgID))
				e.bodies, e.ats, e.counts = append(e.bodies, body), append(e.ats, storedTime(m.ServerAt)), append(e.counts, 1)
			case sequencer.KindRecall:
				if recalled[k] {
					continue
				}
				recalled[k] = true
				ev.recall.convs, ev.recall.ids = append(ev.recall.convs, m.ConvID), append(ev.recall.ids, int64(m.TargetMsgID))
			}
		}
	}
	return ev
}

// queueMarks queues the own-send rule (persist.SenderMarks) of a commit:
// senderMarksSQL (plain PostgreSQL, or Citus's own path), or with direct
// writes into the co-located shards of read_position.
func queueMarks(b *pgx.Batch, pieces []commitPiece, plan *directPlan, batches []persist.ConvBatch) {
	if plan == nil {
		queueSenderMarks(b, batches)
		return
	}
	marksWrite.queue(b, pieces, plan.all)
}

// shardWrite is a per-shard write of a commit besides its messages (Citus,
// direct writes): the outbox rows or the senders' read positions, into
// the piece's co-located shard table.
type shardWrite struct {
	args  func([]persist.ConvBatch) ([]any, int) // a piece's arrays and row count
	into  func(table string, first int) string   // the statement on one table
	table func(*commitPiece) pgx.Identifier
	all   func(*workerTables) string // the statement on the worker's every shard
}

var outboxWrite = shardWrite{
	args:  outboxArgs,
	into:  outboxInsertInto,
	table: func(p *commitPiece) pgx.Identifier { return p.outTable },
	all:   func(w *workerTables) string { return w.outbox },
}

var marksWrite = shardWrite{
	args: func(bs []persist.ConvBatch) ([]any, int) {
		marks := persist.SenderMarks(bs)
		return senderMarksArrays(marks), len(marks)
	},
	into:  senderMarksInto,
	table: func(p *commitPiece) pgx.Identifier { return p.posTable },
	all:   func(w *workerTables) string { return w.marks },
}

// queue queues the write of the pieces: with all (the worker's every
// shard) one statement with each piece's arrays in shard order, else a
// statement per piece that has rows.
func (w shardWrite) queue(b *pgx.Batch, pieces []commitPiece, all *workerTables) {
	var every []any
	n := 0
	for i := range pieces {
		a, k := w.args(pieces[i].batches)
		n += k
		if all != nil {
			every = append(every, a...)
		} else if k > 0 {
			b.Queue(w.into(w.table(&pieces[i]).Sanitize(), 1), a...)
		}
	}
	if all != nil && n > 0 {
		b.Queue(w.all(all), every...)
	}
}

// concatRows returns the rows of every piece as one set.
func concatRows(pieces []commitPiece) *rowArrays {
	out := &rowArrays{}
	for i := range pieces {
		r := pieces[i].rows
		out.msgID = append(out.msgID, r.msgID...)
		out.convID = append(out.convID, r.convID...)
		out.seq = append(out.seq, r.seq...)
		out.fromUID = append(out.fromUID, r.fromUID...)
		out.msgType = append(out.msgType, r.msgType...)
		out.body = append(out.body, r.body...)
		out.clientID = append(out.clientID, r.clientID...)
		out.serverAt = append(out.serverAt, r.serverAt...)
		out.kind = append(out.kind, r.kind...)
		out.target = append(out.target, r.target...)
		out.events += r.events
	}
	return out
}

// casRefusal classifies a casShardSQL refusal (sqlNotMoved, DETAIL: the
// conversations whose head did not move) as seq_cas_heads does: the
// conversations whose head row carries a newer epoch than their batch's
// fence make a *StaleFenceError; otherwise all of them a
// *HeadMismatchError. The epochs are read after the rollback: an epoch
// only grows, so a later read can only find a stale owner staler.
func (s *Store) casRefusal(ctx context.Context, conn *pgxpool.Conn, batches []persist.ConvBatch, pg *pgconn.PgError) error {
	var convs []string
	if err := json.Unmarshal([]byte(pg.Detail), &convs); err != nil || len(convs) == 0 {
		return unavailable("commit: unreadable compare-and-set report", pg)
	}
	rows, err := conn.Query(ctx, headEpochsSQL, convs)
	if err != nil {
		return unavailable("commit: read head epochs", errors.Join(pg, err))
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
		return unavailable("commit: read head epochs", errors.Join(pg, err))
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

// sentNothing reports whether err is a failure that happened before anything
// of the batch reached the server (dial, write of zero bytes, or a prepare
// round trip before the batch itself).
func sentNothing(err error) bool {
	if pgconn.SafeToRetry(err) {
		return true
	}
	var pre pgx.ErrPreprocessingBatch
	return errors.As(err, &pre)
}

// staleFences builds the *StaleFenceError of a fenceCheckSQL refusal:
// DETAIL lists the 1-based positions (in fences) that did not hold.
func staleFences(fences []persist.Fence, pg *pgconn.PgError) error {
	var stale []persist.Fence
	for _, p := range strings.Split(pg.Detail, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || i < 1 || i > len(fences) {
			return unavailable("commit: unreadable stale-fence report", pg)
		}
		stale = append(stale, fences[i-1])
	}
	return membership.CheckFences(stale, false, membership.NotIn(stale), nil)
}

// headMismatch builds the *HeadMismatchError of a headCheckSQL refusal:
// DETAIL is the JSON array of the conversations whose head did not match.
func headMismatch(pg *pgconn.PgError) error {
	var convs []string
	if err := json.Unmarshal([]byte(pg.Detail), &convs); err != nil || len(convs) == 0 {
		return unavailable("commit: unreadable head-mismatch report", pg)
	}
	return persist.HeadsMismatched(convs)
}

// staleEpochs builds the *StaleFenceError of a seq_cas_heads refusal (Citus):
// DETAIL is the JSON array of the conversations whose head row carries a
// newer epoch; the error names their batches' fences.
func staleEpochs(batches []persist.ConvBatch, pg *pgconn.PgError) error {
	var convs []string
	if err := json.Unmarshal([]byte(pg.Detail), &convs); err != nil || len(convs) == 0 {
		return unavailable("commit: unreadable stale-epoch report", pg)
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

// commitError classifies an error of the COMMIT statement: not sent at all,
// or refused by the server with an ERROR, means rolled back; anything else
// (connection lost, timeout, cancel, FATAL) means the outcome is unknown.
func commitError(err error) error {
	if pgconn.SafeToRetry(err) {
		return unavailable("commit: COMMIT not sent", err)
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Severity == "ERROR" {
		return unavailable("commit: COMMIT refused", err)
	}
	return unknownOutcome("commit: COMMIT", err)
}

// rollback ends the transaction on conn. If it cannot, the connection is
// left in a transaction and Release destroys it, which rolls back too.
func rollback(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(ctx)
	}
}

func isUniqueViolation(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	// Citus passes a worker's unique violation on from the coordinator as
	// XX000 with the worker's message.
	return pg.Code == "23505" || (pg.Code == "XX000" && strings.HasPrefix(pg.Message, "duplicate key value violates unique constraint"))
}

// conflicts builds the *ConflictError of a batch whose insert hit a unique
// key, by looking up which of its keys stored rows hold (the transaction is
// already rolled back; this is a read).
func (s *Store) conflicts(ctx context.Context, conn *pgxpool.Conn, r *rowArrays, cause error) error {
	type convSeq struct {
		conv string
		seq  int64
	}
	byMsgID := make(map[int64]int, len(r.msgID))
	bySeq := make(map[convSeq]int, len(r.msgID))
	type convKey struct {
		conv string
		key  sequencer.ClientKey
	}
	keyOf := func(conv string, from int64, client string) convKey {
		k := convKey{key: sequencer.ClientKey{FromUID: uint64(from), ClientMsgID: client}}
		if s.dist != nil {
			k.conv = conv // unique per conversation on Citus
		}
		return k
	}
	byKey := make(map[convKey]int, len(r.msgID))
	for i := range r.msgID {
		byMsgID[r.msgID[i]] = i
		bySeq[convSeq{r.convID[i], r.seq[i]}] = i
		byKey[keyOf(r.convID[i], r.fromUID[i], r.clientID[i])] = i
	}
	q := conflictSQL
	if s.dist != nil {
		q = conflictDistSQL
	}
	rs, err := conn.Query(ctx, q, r.msgID, r.convID, r.seq, r.fromUID, r.clientID)
	if err != nil {
		return unavailable("commit: find conflicting rows", errors.Join(cause, err))
	}
	defer rs.Close()
	var out []persist.Conflict
	for rs.Next() {
		var kind int
		var msgID, seq, from int64
		var conv, client string
		if err := rs.Scan(&kind, &msgID, &conv, &seq, &from, &client); err != nil {
			return unavailable("commit: find conflicting rows", errors.Join(cause, err))
		}
		var i int
		var ok bool
		var key persist.ConflictKey
		switch kind {
		case 1:
			i, ok = byMsgID[msgID]
			key = persist.KeyMsgID
		case 2:
			i, ok = bySeq[convSeq{conv, seq}]
			key = persist.KeyConvSeq
		case 3:
			i, ok = byKey[keyOf(conv, from, client)]
			key = persist.KeyClientMsgID
		}
		if !ok {
			continue
		}
		out = append(out, persist.Conflict{Key: key, ConvID: r.convID[i], Seq: uint64(r.seq[i]), MsgID: uint64(r.msgID[i]),
			FromUID: uint64(r.fromUID[i]), ClientMsgID: r.clientID[i]})
	}
	if err := rs.Err(); err != nil {
		return unavailable("commit: find conflicting rows", errors.Join(cause, err))
	}
	if len(out) == 0 {
		// The conflicting row vanished (retention) between the failed insert
		// and the lookup: nothing was written, a retry may well succeed.
		return unavailable("commit: unique key conflict with a row that is gone", cause)
	}
	persist.SortConflicts(out)
	return &persist.ConflictError{Conflicts: out}
}
