package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// The own-send rule on the embedded store (migration 0008). A commit's
// marks (persist.SenderMarks) go into its transaction as ONE row of
// mark_log, a rowid table whose appends fill its last page, not as an
// upsert per sender into read_position, whose random keys cost a page of
// the commit's WAL per mark. The writer goroutine later applies the whole
// log to read_position (each key's highest seq, raised with max, in key
// order) and empties it, in one transaction (flushMarks): a page of
// read_position written then serves every mark of the interval that falls
// on it.
//
// Durability is the log's: a mark is in the file when its commit is. The
// store's reads of positions (ReadStates, MarkRead's answer, ReadCounts,
// ReadPositionsPage) add the marks not yet applied from pendingMarks, an
// in-memory copy of the log, so every read answers what it would if each
// commit had upserted its marks:
//
//   - A commit adds its marks to the copy after its COMMIT, before it
//     answers (on the writer goroutine). A COMMIT of unknown outcome may
//     have logged marks the copy lacks: the copy is then marked stale.
//   - A flush commits, then empties the copy (on the writer goroutine, so
//     no commit adds between the two). A flush of unknown outcome leaves
//     the copy as it was: each mark is then in the copy, or applied, or
//     both, and positions only ever take the highest.
//   - A stale copy (at open, after an unknown outcome) is reloaded from
//     the log by the next read that needs it, holding the copy's lock
//     meanwhile: a commit that the reload's snapshot missed adds its marks
//     after the lock is released. A successful flush makes it current
//     (the log is then empty).
//   - A read takes the copy's marks BEFORE it reads the database: a mark a
//     flush removes from the copy afterwards was applied by a transaction
//     that committed before the removal, so the read's snapshot has it.
//
// Only the process that serves the store (Options.Shared false) commits
// messages; a shared opener (sequencer admin) reads no positions.
const (
	// markFlushEvery is how long logged marks wait to be applied, at most
	// (when the writer is idle; a busy writer flushes between commits).
	markFlushEvery = time.Second
	// markFlushMarks is how many logged marks start a flush sooner: it
	// bounds the copy's memory (about 100 B a mark) and a flush's length.
	markFlushMarks = 50_000
)

// markLogSQL logs one commit's marks.
const markLogSQL = `INSERT INTO mark_log (marks) VALUES (?1)`

// flushMarksSQL applies the whole log, each key's highest seq, in key
// order, and empties it: the flush of a stale copy. ("WHERE true":
// SQLite's upsert after a SELECT with a join needs a WHERE clause to
// parse.)
const flushMarksSQL = `INSERT INTO read_position (conv_id, uid, read_seq)
	SELECT json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'), max(json_extract(j.value, '$[2]'))
	FROM mark_log AS l, json_each(l.marks) AS j WHERE true GROUP BY 1, 2 ORDER BY 1, 2
	ON CONFLICT (conv_id, uid) DO UPDATE SET read_seq = max(read_seq, excluded.read_seq);
DELETE FROM mark_log;`

// logMarks writes the own-send rule's marks of batches into a commit's
// transaction and returns them (nil if none).
func logMarks(ctx context.Context, tx *sql.Tx, batches []persist.ConvBatch) ([]persist.Mark, error) {
	marks := persist.SenderMarks(batches)
	if len(marks) == 0 {
		return nil, nil
	}
	rows := make([][3]any, len(marks))
	for i, m := range marks {
		rows[i] = [3]any{m.ConvID, int64(m.UID), int64(m.Seq)}
	}
	list, err := json.Marshal(rows)
	if err != nil {
		return nil, fmt.Errorf("sqlite: commit: senders' read positions: %w", err)
	}
	if _, err := tx.ExecContext(ctx, markLogSQL, string(list)); err != nil {
		return nil, classify("commit: senders' read positions", err)
	}
	return marks, nil
}

// pendingMarks is the in-memory copy of mark_log: per conversation, per
// user, the highest seq logged and not yet applied.
type pendingMarks struct {
	mu     sync.Mutex
	stale  bool // the log may hold marks the copy lacks: reload before use
	convs  map[string]map[uint64]uint64
	logged int       // marks logged since the last flush
	since  time.Time // when the first of them was logged
	retry  time.Time // after a failed flush: not before then
}

func newPendingMarks() *pendingMarks {
	return &pendingMarks{stale: true, convs: map[string]map[uint64]uint64{}}
}

// put raises (conv, uid) to seq (p.mu held).
func (p *pendingMarks) put(conv string, uid, seq uint64) {
	users := p.convs[conv]
	if users == nil {
		users = map[uint64]uint64{}
		p.convs[conv] = users
	}
	if seq > users[uid] {
		users[uid] = seq
	}
}

// committed adds a committed transaction's marks.
func (p *pendingMarks) committed(marks []persist.Mark) {
	if len(marks) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.logged == 0 {
		p.since = time.Now()
	}
	p.logged += len(marks)
	for _, m := range marks {
		p.put(m.ConvID, m.UID, m.Seq)
	}
}

// unknown records a COMMIT of unknown outcome that logged marks.
func (p *pendingMarks) unknown() {
	p.mu.Lock()
	p.stale = true
	if p.logged == 0 {
		p.since = time.Now()
	}
	p.logged++ // a flush is due: it makes the copy current
	p.mu.Unlock()
}

// flushed empties the copy after a flush committed: the log is empty.
func (p *pendingMarks) flushed() {
	p.mu.Lock()
	clear(p.convs)
	p.logged = 0
	p.stale = false
	p.mu.Unlock()
}

// due reports whether a flush is due at now, and how long until one is
// if none is (zero: no marks logged); needed whether a flush would apply
// anything the copy knows of or may lack.
func (p *pendingMarks) due(now time.Time) (due bool, wait time.Duration, needed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	needed = p.logged > 0 || p.stale
	if p.logged == 0 {
		return false, 0, needed
	}
	at := p.since.Add(markFlushEvery)
	if p.logged >= markFlushMarks {
		at = now
	}
	if at.Before(p.retry) {
		at = p.retry
	}
	if wait = at.Sub(now); wait <= 0 {
		return true, 0, needed
	}
	return false, wait, needed
}

// view returns f's result over a current copy, reloading it from db first
// if it is stale. The copy's lock is held throughout.
func (p *pendingMarks) view(ctx context.Context, db *sql.DB, f func()) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stale {
		if err := p.reload(ctx, db); err != nil {
			return err
		}
	}
	f()
	return nil
}

// reload replaces the copy with the log's content (p.mu held). A database
// without the table (before migration 0008) has no logged marks.
func (p *pendingMarks) reload(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, `SELECT marks FROM mark_log ORDER BY id`)
	if err != nil {
		if strings.Contains(err.Error(), "no such table: mark_log") {
			clear(p.convs)
			p.stale = false
			return nil
		}
		return unavailable("read the mark log", err)
	}
	defer rows.Close()
	fresh := map[string]map[uint64]uint64{}
	old := p.convs
	p.convs = fresh
	n := 0
	for rows.Next() {
		var text string
		var list [][3]json.RawMessage
		if err := rows.Scan(&text); err == nil {
			err = json.Unmarshal([]byte(text), &list)
		}
		if err != nil {
			p.convs = old
			return unavailable("read the mark log", err)
		}
		for _, m := range list {
			var conv string
			var uid, seq uint64
			if json.Unmarshal(m[0], &conv) != nil || json.Unmarshal(m[1], &uid) != nil || json.Unmarshal(m[2], &seq) != nil {
				p.convs = old
				return sequencer.Errorf(sequencer.CodeInternal, "sqlite: a malformed mark in the mark log: %s", text)
			}
			p.put(conv, uid, seq)
			n++
		}
	}
	if err := rows.Err(); err != nil {
		p.convs = old
		return unavailable("read the mark log", err)
	}
	p.stale = false
	if n > 0 && p.logged == 0 {
		p.since = time.Now()
	}
	p.logged = max(p.logged, n)
	return nil
}

// user returns uid's pending seq in each of convIDs (0 if none).
func (p *pendingMarks) user(ctx context.Context, db *sql.DB, uid uint64, convIDs []string) ([]uint64, error) {
	out := make([]uint64, len(convIDs))
	err := p.view(ctx, db, func() {
		for i, c := range convIDs {
			out[i] = p.convs[c][uid]
		}
	})
	return out, err
}

// of returns each mark's pending seq for its (conv, uid) (0 if none);
// the marks' own seqs are not used.
func (p *pendingMarks) of(ctx context.Context, db *sql.DB, marks []persist.Mark) ([]uint64, error) {
	out := make([]uint64, len(marks))
	err := p.view(ctx, db, func() {
		for i, m := range marks {
			out[i] = p.convs[m.ConvID][m.UID]
		}
	})
	return out, err
}

// conv returns a copy of convID's pending marks (nil if none).
func (p *pendingMarks) conv(ctx context.Context, db *sql.DB, convID string) (map[uint64]uint64, error) {
	var out map[uint64]uint64
	err := p.view(ctx, db, func() {
		if users := p.convs[convID]; len(users) > 0 {
			out = make(map[uint64]uint64, len(users))
			for u, s := range users {
				out[u] = s
			}
		}
	})
	return out, err
}

// flushMarks applies the log if a flush is due (when force: if the copy
// has marks or may lack some), on the writer goroutine between commits. It
// returns how long until the next one is due (0: nothing logged). A failed
// flush is tried again a second later at the earliest; the marks stay in
// the log and the copy meanwhile.
func (s *Store) flushMarks(force bool) time.Duration {
	due, wait, needed := s.pend.due(time.Now())
	if !(due || force && needed) {
		return wait
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := s.applyMarkLog(ctx)
	s.wrote(err)
	if err != nil {
		s.pend.mu.Lock()
		s.pend.retry = time.Now().Add(markFlushEvery)
		s.pend.mu.Unlock()
		return markFlushEvery
	}
	s.pend.flushed()
	return 0
}

// flushRows is how many marks one statement of a flush upserts.
const flushRows = 256

// upsertMarksSQL raises the positions of n marks.
func upsertMarksSQL(n int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO read_position (conv_id, uid, read_seq) VALUES ")
	writeList(&b, n, "(?,?,?)")
	b.WriteString(" ON CONFLICT (conv_id, uid) DO UPDATE SET read_seq = max(read_seq, excluded.read_seq)")
	return b.String()
}

// marks returns the copy's marks in no order, or nil if it is stale
// (p.mu held).
func (p *pendingMarks) marks() []persist.Mark {
	if p.stale {
		return nil
	}
	var out []persist.Mark
	for conv, users := range p.convs {
		for uid, seq := range users {
			out = append(out, persist.Mark{ConvID: conv, UID: uid, Seq: seq})
		}
	}
	return out
}

// sortMarks sorts marks by key (conv_id, uid): the flush writes the
// B-tree's pages in order.
func sortMarks(marks []persist.Mark) {
	slices.SortFunc(marks, func(a, b persist.Mark) int {
		if c := strings.Compare(a.ConvID, b.ConvID); c != 0 {
			return c
		}
		return cmp.Compare(a.UID, b.UID)
	})
}

// applyMarkLog is a flush's transaction on the writer connection: the
// copy's marks (the log's, coalesced) upserted in key order when the copy
// is current, else the log applied by SQL (flushMarksSQL); then the log
// emptied. On the writer goroutine: no commit adds marks meanwhile.
func (s *Store) applyMarkLog(ctx context.Context) error {
	s.pend.mu.Lock()
	marks := s.pend.marks()
	stale := s.pend.stale
	s.pend.mu.Unlock()
	sortMarks(marks) // outside the lock: reads wait for it
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return unavailable("apply the mark log: begin", err)
	}
	defer tx.Rollback()
	if stale {
		if _, err := tx.ExecContext(ctx, flushMarksSQL); err != nil {
			return classify("apply the mark log", err)
		}
	} else {
		if err := upsertMarks(ctx, tx, marks); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM mark_log`); err != nil {
			return classify("apply the mark log: empty it", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return unknownOutcome("apply the mark log: COMMIT", err)
	}
	return nil
}

// upsertMarks raises the positions of marks, flushRows to a statement.
func upsertMarks(ctx context.Context, tx *sql.Tx, marks []persist.Mark) error {
	var full *sql.Stmt
	if len(marks) >= flushRows {
		st, err := tx.PrepareContext(ctx, upsertMarksSQL(flushRows))
		if err != nil {
			return classify("apply the mark log: prepare", err)
		}
		defer st.Close()
		full = st
	}
	args := make([]any, 0, 3*flushRows)
	for len(marks) > 0 {
		n := min(len(marks), flushRows)
		args = args[:0]
		for _, m := range marks[:n] {
			args = append(args, m.ConvID, int64(m.UID), int64(m.Seq))
		}
		var err error
		if n == flushRows {
			_, err = full.ExecContext(ctx, args...)
		} else {
			_, err = tx.ExecContext(ctx, upsertMarksSQL(n), args...)
		}
		if err != nil {
			return classify("apply the mark log", err)
		}
		marks = marks[n:]
	}
	return nil
}

// pendingCounts adds pending, convID's marks not yet applied, to counts,
// the buckets ReadCounts read from read_position (persist.BucketSQL over
// bounds), given stored: the positions read_position holds for those
// users (from the same snapshot). A user's position is the higher of the
// two: it leaves its stored bucket for the pending one.
func pendingCounts(counts []persist.BucketCount, bounds []uint64, pending, stored map[uint64]uint64) ([]persist.BucketCount, error) {
	n := make([]int64, len(bounds)+1)
	for _, c := range counts {
		if c.Bucket < 0 || c.Bucket > len(bounds) {
			return nil, sequencer.Errorf(sequencer.CodeInternal, "read counts: bucket %d of %d bounds", c.Bucket, len(bounds))
		}
		n[c.Bucket] += int64(c.Users)
	}
	bucket := func(seq uint64) int { // how many bounds are <= seq
		i, found := slices.BinarySearch(bounds, seq)
		if found {
			i++
		}
		return i
	}
	for uid, seq := range pending {
		old, ok := stored[uid]
		if ok && old >= bounds[0] {
			n[bucket(old)]--
		}
		if seq = max(seq, old); seq >= bounds[0] {
			n[bucket(seq)]++
		}
	}
	out := make([]persist.BucketCount, 0, len(n))
	for b, users := range n {
		if users < 0 {
			return nil, sequencer.Errorf(sequencer.CodeInternal, "read counts: bucket %d counts %d users", b, users)
		}
		if users > 0 {
			out = append(out, persist.BucketCount{Bucket: b, Users: uint64(users)})
		}
	}
	return out, nil
}

// pendingPage merges pending, convID's marks not yet applied, into page,
// the first n positions of read_position after afterUID in uid order: the
// first n of the union, each user at the higher of the two.
func pendingPage(page []persist.ReadPosition, pending map[uint64]uint64, afterUID uint64, n int) []persist.ReadPosition {
	at := make(map[uint64]int, len(page))
	for i, p := range page {
		at[p.UID] = i
	}
	for uid, seq := range pending {
		if uid <= afterUID {
			continue
		}
		if i, ok := at[uid]; ok {
			page[i].ReadSeq = max(page[i].ReadSeq, seq)
			continue
		}
		page = append(page, persist.ReadPosition{UID: uid, ReadSeq: seq})
	}
	slices.SortFunc(page, func(a, b persist.ReadPosition) int {
		switch {
		case a.UID < b.UID:
			return -1
		case a.UID > b.UID:
			return 1
		}
		return 0
	})
	return page[:min(len(page), n)]
}
