package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
var headCheckSQL = HeadCASSQL("conv_head", false, sqlHeadMismatch, "head mismatch")

// HeadCASSQL is a commit's head compare-and-set on table, raising code
// (DETAIL: the JSON array of the conversations that did not match,
// ascending) when one did not: headCheckSQL, and with epochs the one of
// Citus's direct writes (persist/citus), whose head rows carry the fence
// epochs (a head moves only when its row's epoch is at most the batch's,
// or the batch's is 0: unfenced, and takes the larger).
func HeadCASSQL(table string, epochs bool, code, message string) string {
	return "WITH " + HeadCASCTEs(table, "", 1, epochs) + `
SELECT seq_raise('` + code + `', '` + message + `', json_agg(u.conv_id ORDER BY u.conv_id)::text)
FROM u WHERE NOT EXISTS (SELECT 1 FROM matched m WHERE m.conv_id = u.conv_id)
HAVING count(*) > 0`
}

// HeadCASCTEs are the CTEs of HeadCASSQL for one table: u, upd, ins and
// matched, each name followed by sfx, reading their arrays from parameter
// $first on (3 arrays, 4 with epochs).
func HeadCASCTEs(table, sfx string, first int, epochs bool) string {
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

// SQLSTATEs raised by fenceCheckSQL, headCheckSQL and unfencedCheckSQL
// (SQ004 and on: persist/citus's).
const (
	sqlStaleFence   = "SQ001" // DETAIL: 1-based positions of the stale fences, comma-separated
	sqlHeadMismatch = "SQ002" // DETAIL: JSON array of the mismatched conv_ids
	sqlUnfenced     = "SQ003"
)

// SQLHeadMismatch is the SQLSTATE of a head compare-and-set that did not
// match (headCheckSQL, and persist/citus's compare-and-set through Citus).
const SQLHeadMismatch = sqlHeadMismatch

// insertSQL writes all rows of a commit in one statement.
var insertSQL = InsertInto("im_message")

// InsertInto is the INSERT of a commit's rows (RowArrays.Args) into table:
// im_message, or one of its shard tables (persist/citus).
func InsertInto(table string) string {
	return "INSERT INTO " + table + " (" + strings.Join(InsertColumns, ", ") + ")\n" + UnnestRowsSQL(1)
}

// UnnestRowsSQL selects rows of im_message from RowCols arrays (the columns
// of InsertColumns), parameters $first to $first+RowCols-1.
func UnnestRowsSQL(first int) string {
	types := []string{"int8", "text", "int8", "int8", "int2", "bytea", "text", "timestamptz", "int2", "int8"}
	args := make([]string, len(types))
	for i, t := range types {
		args[i] = "$" + strconv.Itoa(first+i) + "::" + t + "[]"
	}
	return "SELECT * FROM unnest(" + strings.Join(args, ", ") + ")"
}

// conflictSQL finds the stored rows holding any unique key of a failed batch.
const conflictSQL = `SELECT 1, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  WHERE m.msg_id = ANY($1::int8[])
UNION ALL
SELECT 2, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($2::text[], $3::int8[]) AS u(conv_id, seq) ON m.conv_id = u.conv_id AND m.seq = u.seq
UNION ALL
SELECT 3, m.msg_id, m.conv_id, m.seq, m.from_uid, m.client_msg_id FROM im_message m
  JOIN unnest($4::int8[], $5::text[]) AS u(from_uid, client_msg_id) ON m.from_uid = u.from_uid AND m.client_msg_id = u.client_msg_id`

// InsertColumns are the columns of im_message a commit writes (RowArrays.Args).
var InsertColumns = []string{"msg_id", "conv_id", "seq", "from_uid", "msg_type", "body", "client_msg_id", "server_at", "kind", "target_msg_id"}

// RowCols is the number of columns a commit writes per row (InsertColumns).
const RowCols = 10

// RowArrays is a commit's rows as column arrays (for unnest or COPY).
type RowArrays struct {
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

// Args returns the arrays in the order of InsertColumns; the first carries
// the size of all ten encoded (presize.go).
func (r *RowArrays) Args() []any {
	return []any{presized[[]int64]{r.msgID, r.encodedSize()}, r.convID, r.seq, r.fromUID, r.msgType, r.body, r.clientID, r.serverAt, r.kind, r.target}
}

// encodedSize is the bytes the arrays take in PostgreSQL's binary array
// format (presize.go): per element its length and its value (8 bytes for
// an int8 or a timestamptz, 2 for an int2, a text's or bytea's own length).
func (r *RowArrays) encodedSize() int {
	const fixed = 4*8 + 8 + 2*2 // msg_id, seq, from_uid, target_msg_id; server_at; msg_type, kind
	n := len(r.msgID)
	size := RowCols*arrayHeaderBytes + n*(RowCols*elemLenBytes+fixed)
	for i := 0; i < n; i++ {
		size += len(r.convID[i]) + len(r.body[i]) + len(r.clientID[i])
	}
	return size
}

// Len is the number of rows.
func (r *RowArrays) Len() int { return len(r.msgID) }

func buildRows(batches []persist.ConvBatch) *RowArrays {
	n := 0
	for i := range batches {
		n += len(batches[i].Messages)
	}
	r := &RowArrays{
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

func (r *RowArrays) copySource() pgx.CopyFromSource {
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
	if err := persist.CheckBatches(batches); err != nil {
		return err
	}
	if len(batches) == 0 {
		return nil
	}
	return s.RunCommit(ctx, s.commits, nil, "", func(conn *pgxpool.Conn) error {
		return s.CommitOn(ctx, conn, batches, plainPlan{})
	}, batches)
}

// CommitGroup implements commit.Grouper: every conversation can share a
// transaction with every other (one group), so the group-commit writer
// fills a commit in queue order, passing over a batch that does not fit.
func (s *Store) CommitGroup(string) uint64 { return 0 }

// RunCommit takes a connection of pool and runs commit on it (a CommitOn).
// When the outcome is unknown the transaction may still commit on the
// server: the connection's backend is remembered for Settle (on settleOn,
// the pool of that server; nil: the store's own) and the connection is
// closed, never reused. node names the server in an acquire error ("": the
// store's own).
func (s *Store) RunCommit(ctx context.Context, pool, settleOn *pgxpool.Pool, node string, commit func(*pgxpool.Conn) error, batches []persist.ConvBatch) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		op := "commit: acquire connection"
		if node != "" {
			op += " " + node
		}
		return unavailable(op, err)
	}
	defer conn.Release() // destroys the connection if a transaction is left open
	backend := backendOf(conn.Conn().PgConn())
	if s.commitBackend != nil {
		s.commitBackend(backend.pid)
	}
	err = commit(conn)
	if errors.Is(err, sequencer.ErrUnknownOutcome) {
		// The transaction may still commit on the server: Settle must end
		// it before anyone re-reads. Never reuse this connection.
		s.unsettle(backend, settleOn, batches)
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Conn().Close(cctx)
		cancel()
	}
	return err
}

// A CommitPlan is where and how CommitOn writes a commit: which tables
// (CommitPieces), which checks, and how the server's refusals read. The
// plain one (plainPlan) is this package's: the fence check on
// partition_lease, the head compare-and-set on conv_head, one piece in
// im_message. persist/citus has its own (the shard tables of a worker, or
// the distributed tables with the fence epochs on the head rows).
type CommitPlan interface {
	// Pieces splits batches by the tables they are written to.
	Pieces(batches []persist.ConvBatch) []CommitPiece
	// QueueChecks queues, after BEGIN, the checks that refuse the commit
	// inside the server (fences, head compare-and-set) and the writes
	// that must follow the head update (the outbox rows).
	QueueChecks(b *pgx.Batch, batches []persist.ConvBatch, pieces []CommitPiece)
	// QueueRows queues the rows' INSERT (the pipelined path; the COPY path
	// copies each piece into its MsgTable).
	QueueRows(b *pgx.Batch, pieces []CommitPiece)
	// QueueMarks queues the senders' read positions (persist.SenderMarks),
	// after the rows and the edits' and recalls' target updates.
	QueueMarks(b *pgx.Batch, batches []persist.ConvBatch, pieces []CommitPiece)
	// Refusal is the error of a server refusal pg of a statement before
	// COMMIT (nothing was written, the transaction is rolled back; conn
	// may be used for reads), nil when pg is not one of the plan's.
	Refusal(ctx context.Context, conn *pgxpool.Conn, batches []persist.ConvBatch, pg *pgconn.PgError) error
	// ConflictLookup is the statement that finds the stored rows holding
	// a failed commit's unique keys (conflictSQL's parameters and
	// answer), and whether the resend key is unique per conversation.
	ConflictLookup() (sql string, keysPerConv bool)
}

// plainPlan is the CommitPlan of plain PostgreSQL.
type plainPlan struct{}

func (plainPlan) Pieces(batches []persist.ConvBatch) []CommitPiece {
	return []CommitPiece{{Batches: batches, MsgTable: pgx.Identifier{"im_message"}, Insert: insertSQL}}
}

func (plainPlan) QueueChecks(b *pgx.Batch, batches []persist.ConvBatch, pieces []CommitPiece) {
	// Distinct non-zero fences, in partition order.
	fences, unfenced := persist.Fences(batches)
	if len(fences) > 0 {
		parts := make([]int64, len(fences))
		owners := make([]string, len(fences))
		epochs := make([]int64, len(fences))
		for i, f := range fences {
			parts[i], owners[i], epochs[i] = int64(f.Partition), f.Owner, int64(f.Epoch)
		}
		b.Queue(fenceCheckSQL, parts, owners, epochs)
	}
	if unfenced {
		b.Queue(unfencedCheckSQL)
	}
	h := &pieces[0].Heads
	b.Queue(headCheckSQL, h.Args(false)...)
	QueueOutbox(b, batches)
}

func (plainPlan) QueueRows(b *pgx.Batch, pieces []CommitPiece) { QueueRows(b, pieces) }

func (plainPlan) QueueMarks(b *pgx.Batch, batches []persist.ConvBatch, _ []CommitPiece) {
	QueueSenderMarks(b, batches)
}

func (plainPlan) Refusal(_ context.Context, _ *pgxpool.Conn, batches []persist.ConvBatch, pg *pgconn.PgError) error {
	switch pg.Code {
	case sqlStaleFence:
		fences, _ := persist.Fences(batches)
		return staleFences(fences, pg)
	case sqlHeadMismatch:
		return HeadMismatch(pg)
	case sqlUnfenced:
		return persist.ErrUnfenced
	}
	return nil
}

func (plainPlan) ConflictLookup() (string, bool) { return conflictSQL, false }

// QueueRows queues each piece's Insert with its rows (pieces without rows
// send nothing).
func QueueRows(b *pgx.Batch, pieces []CommitPiece) {
	for i := range pieces {
		if r := pieces[i].Rows; r.Len() > 0 {
			b.Queue(pieces[i].Insert, r.Args()...)
		}
	}
}

// CommitOn runs a commit of batches on conn, in one transaction, as plan
// says: BEGIN, the plan's checks, the rows (pipelined INSERT, or COPY from
// copyMinRows rows), the edits' and recalls' target updates, the senders'
// read positions, COMMIT; then it classifies the outcome (see Commit).
func (s *Store) CommitOn(ctx context.Context, conn *pgxpool.Conn, batches []persist.ConvBatch, plan CommitPlan) error {
	pieces := plan.Pieces(batches)
	var all *RowArrays // every row, for the conflict lookup
	nrows := 0
	for i := range pieces {
		pieces[i].prepare()
		nrows += pieces[i].Rows.Len()
	}
	if len(pieces) == 1 {
		all = pieces[0].Rows
	}
	useCopy := nrows > 0 && (s.mode == insertCopy || (s.mode == insertAuto && nrows >= copyMinRows))

	b := &pgx.Batch{}
	b.Queue("BEGIN")
	plan.QueueChecks(b, batches, pieces)
	insertFrom, commitAt := -1, -1
	if !useCopy {
		insertFrom = b.Len()
		if nrows > 0 {
			plan.QueueRows(b, pieces)
		}
		for i := range pieces {
			pieces[i].queueEvents(b)
		}
		plan.QueueMarks(b, batches, pieces)
		commitAt = b.Len()
		b.Queue("COMMIT")
	}
	conflicts := func(err error) error {
		if all == nil {
			all = concatRows(pieces)
		}
		return s.conflicts(ctx, conn, plan, all, err)
	}
	if !useCopy {
		growWriteBuffer(conn.Conn().PgConn(), pipelineSize(batches, pieces))
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
			if rerr := plan.Refusal(ctx, conn, batches, pg); rerr != nil {
				return rerr
			}
			if insertFrom >= 0 && failedAt >= insertFrom && isUniqueViolation(err) {
				return conflicts(err)
			}
		}
		return classify("commit", err)
	}
	if commitAt < 0 {
		// COPY path: the checks passed; rows, then COMMIT.
		for i := range pieces {
			p := &pieces[i]
			if p.Rows.Len() == 0 {
				continue
			}
			if _, err := conn.Conn().CopyFrom(ctx, p.MsgTable, InsertColumns, p.Rows.copySource()); err != nil {
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
		plan.QueueMarks(ev, batches, pieces)
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

// CommitPiece is the part of a commit written to one message table: all of
// it, or one shard's conversations (persist/citus's direct writes).
// CommitOn fills Heads and Rows.
type CommitPiece struct {
	Batches  []persist.ConvBatch
	MsgTable pgx.Identifier // im_message, or a shard's table
	Insert   string         // the rows' INSERT into MsgTable (InsertInto)

	Heads HeadArrays
	Rows  *RowArrays
}

// HeadArrays are the head compare-and-set's arguments, in conv_id order.
type HeadArrays struct {
	Convs                []string
	Prevs, Heads, Epochs []int64
}

// Args returns the arrays for a head check (Convs, Prevs, Heads) or, with
// epochs, a compare-and-set (and Epochs); the first carries the size of
// them all encoded (presize.go).
func (h *HeadArrays) Args(epochs bool) []any {
	if !epochs {
		return []any{presized[[]string]{h.Convs, textIntArraysSize(h.Convs, 2)}, h.Prevs, h.Heads}
	}
	return []any{presized[[]string]{h.Convs, textIntArraysSize(h.Convs, 3)}, h.Prevs, h.Heads, h.Epochs}
}

// prepare builds the piece's head arrays (in conv_id order) and rows.
func (p *CommitPiece) prepare() {
	order := make([]int, len(p.Batches))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return p.Batches[order[a]].ConvID < p.Batches[order[b]].ConvID })
	h := HeadArrays{
		Convs: make([]string, len(order)), Prevs: make([]int64, len(order)),
		Heads: make([]int64, len(order)), Epochs: make([]int64, len(order)),
	}
	for k, i := range order {
		b := &p.Batches[i]
		h.Convs[k], h.Prevs[k], h.Heads[k], h.Epochs[k] = b.ConvID, int64(b.PrevHead), int64(b.LastSeq()), int64(b.Fence.Epoch)
	}
	p.Heads = h
	p.Rows = buildRows(p.Batches)
}

// queueEvents queues the target updates of the piece's edits and recalls
// (persist/events.go) on its message table, after its rows: at most three
// statements whatever the number of events (issue 32: an event costs no
// more than a send), each over arrays with one element per target. An
// edited target gets its last edit's body and time and its edit_count
// raised by its number of edits; a recalled target, and its edit events
// (those of this commit too: they are inserted before), lose their bodies;
// the edit events' statement is left out for the targets that their
// writer knows unedited (ConvBatch.RecallsOfUnedited).
// The edits go first: a recall in the same commit leaves its target
// recalled, as the events in seq order would (the rules refuse an edit of a
// recalled message, so no edit follows a recall of its target).
func (p *CommitPiece) queueEvents(b *pgx.Batch) {
	if p.Rows.events == 0 {
		return
	}
	ev := eventArraysOf(p.Batches)
	t := p.MsgTable.Sanitize()
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
	}
	if len(ev.recallEdited.convs) > 0 {
		b.Queue(`UPDATE `+t+` AS m SET body = '\x', recalled = true
			FROM unnest($1::text[], $2::bigint[]) AS u(conv_id, msg_id)
			WHERE m.conv_id = u.conv_id AND m.target_msg_id = u.msg_id AND m.target_msg_id <> 0 AND m.kind = 1`,
			ev.recallEdited.convs, ev.recallEdited.ids)
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
	// recall is every recalled target; recallEdited those whose edit
	// events must lose their bodies too (all but the targets of batches
	// whose writer knows them unedited: ConvBatch.RecallsOfUnedited).
	recall, recallEdited struct {
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
				if !batches[i].RecallsOfUnedited {
					r := &ev.recallEdited
					r.convs, r.ids = append(r.convs, m.ConvID), append(r.ids, int64(m.TargetMsgID))
				}
			}
		}
	}
	return ev
}

// concatRows returns the rows of every piece as one set.
func concatRows(pieces []CommitPiece) *RowArrays {
	out := &RowArrays{}
	for i := range pieces {
		r := pieces[i].Rows
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

// HeadMismatch builds the *HeadMismatchError of a headCheckSQL refusal
// (or persist/citus's, SQLHeadMismatch): DETAIL is the JSON array of the
// conversations whose head did not match.
func HeadMismatch(pg *pgconn.PgError) error {
	var convs []string
	if err := json.Unmarshal([]byte(pg.Detail), &convs); err != nil || len(convs) == 0 {
		return unavailable("commit: unreadable head-mismatch report", pg)
	}
	return persist.HeadsMismatched(convs)
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
func (s *Store) conflicts(ctx context.Context, conn *pgxpool.Conn, plan CommitPlan, r *RowArrays, cause error) error {
	q, perConv := plan.ConflictLookup()
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
		if perConv {
			k.conv = conv // unique per conversation (Citus)
		}
		return k
	}
	byKey := make(map[convKey]int, len(r.msgID))
	for i := range r.msgID {
		byMsgID[r.msgID[i]] = i
		bySeq[convSeq{r.convID[i], r.seq[i]}] = i
		byKey[keyOf(r.convID[i], r.fromUID[i], r.clientID[i])] = i
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
