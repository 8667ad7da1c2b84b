package citus

import (
	"context"
	"errors"
	"math"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

// ReadMany on Citus: one round trip per worker (a shard group's home),
// the workers read concurrently. A list joined with the distributed tables
// cannot be pushed down by Citus's planner, so the store does what its
// direct commits do: it groups the cursors by the worker holding their
// shard and, on a connection to that worker, reads each shard's own tables
// (postgres.ReadManyHeadsSQL and ReadManySQL on the shard tables) in one
// REPEATABLE READ transaction sent as one batch, which also checks that
// the worker still holds each shard (a moved shard's old tables may linger
// until Citus cleans them up). A shard not held there (moved), a missing
// table or a placement not known yet sends the call through
// persist.ReadManyEach (one conversation at a time, routed by Citus) and
// makes the store reload the placements.

// shardPlacedSQL says whether this worker holds shard $1 (as shardHeadSQL).
const shardPlacedSQL = `SELECT EXISTS (SELECT 1 FROM pg_dist_placement p
  WHERE p.shardid = $1 AND p.shardstate = 1 AND p.groupid = (SELECT groupid FROM pg_dist_local_group))`

// errNotPlaced: a shard's tables are not (or no longer) this worker's.
var errNotPlaced = errors.New("citus: a shard is not on the worker the placements name")

// shardRead is the cursors of one shard, by their index in the call.
type shardRead struct {
	sh  shardRange
	idx []int
}

// ReadMany implements persist.PageReader: one round trip per worker (see
// above).
func (s *Store) ReadMany(ctx context.Context, cursors []persist.Cursor, limit, total int) ([]persist.Page, error) {
	d := s.dist
	byNode := map[string][]*shardRead{}
	pools := map[string]*pgxpool.Pool{}
	placed := true
	d.mu.RLock()
	byShard := map[int]*shardRead{}
	for i, c := range cursors {
		k := d.shardOf(c.ConvID)
		if k < 0 || d.shards[k].msgShard == 0 || len(d.shards[k].msgTable) == 0 || d.readers[d.shards[k].node] == nil {
			placed = false
			break
		}
		r := byShard[k]
		if r == nil {
			r = &shardRead{sh: d.shards[k]}
			byShard[k] = r
			byNode[r.sh.node] = append(byNode[r.sh.node], r)
			pools[r.sh.node] = d.readers[r.sh.node]
		}
		r.idx = append(r.idx, i)
	}
	d.mu.RUnlock()
	if !placed {
		return s.readManyEach(ctx, cursors, limit, total)
	}
	pages := make([]persist.Page, len(cursors))
	var wg sync.WaitGroup
	errs := make([]error, 0, len(byNode))
	var mu sync.Mutex
	for node, reads := range byNode {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each worker's pages are disjoint parts of pages.
			if err := readManyOn(ctx, pools[node], reads, cursors, pages, limit, total); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	d.statMu.Lock()
	d.manyReads += int64(len(byNode))
	d.statMu.Unlock()
	for _, err := range errs {
		var pg *pgconn.PgError
		if errors.Is(err, errNotPlaced) || (errors.As(err, &pg) && pg.Code == sqlUndefinedTable) {
			d.wantReload.Store(true) // a shard moved: read through Citus this time
			return s.readManyEach(ctx, cursors, limit, total)
		}
	}
	if len(errs) > 0 {
		return nil, postgres.Unavailable("read many", errs[0])
	}
	// The total bound, over the whole call in request order (each worker
	// applied it to its own part).
	left := max(total, 0)
	for i := range pages {
		n := min(len(pages[i].Messages), left)
		pages[i].Messages = pages[i].Messages[:n]
		left -= n
	}
	return pages, nil
}

// readManyEach reads one conversation at a time, routed by Citus.
func (s *Store) readManyEach(ctx context.Context, cursors []persist.Cursor, limit, total int) ([]persist.Page, error) {
	s.dist.statMu.Lock()
	s.dist.manyEach++
	s.dist.statMu.Unlock()
	return persist.ReadManyEach(ctx, s, cursors, limit, total)
}

// readManyOn reads the shards of one worker in one round trip and fills
// their cursors' pages.
func readManyOn(ctx context.Context, pool *pgxpool.Pool, reads []*shardRead, cursors []persist.Cursor, pages []persist.Page, limit, total int) error {
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
	b.Queue(postgres.PageReadSettingsSQL)
	for _, r := range reads {
		convs := make([]string, len(r.idx))
		afters := make([]int64, len(r.idx))
		for j, i := range r.idx {
			convs[j], afters[j] = cursors[i].ConvID, int64(min(cursors[i].AfterSeq, math.MaxInt64))
		}
		b.Queue(shardPlacedSQL, r.sh.id)
		b.Queue(shardSQL(postgres.ReadManyHeadsSQL, "conv_head", r.sh.headTable), convs)
		b.Queue(shardSQL(postgres.ReadManySQL, "im_message", r.sh.msgTable), convs, afters, max(limit, 0), max(total, 0))
	}
	b.Queue("COMMIT")
	br := pool.SendBatch(ctx, b)
	defer br.Close()
	for range 2 { // BEGIN, the settings
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	for _, r := range reads {
		var here bool
		if err := br.QueryRow().Scan(&here); err != nil {
			return err
		}
		if !here {
			return errNotPlaced
		}
		if err := postgres.ScanHeads(br, pages, r.idx); err != nil {
			return err
		}
		if err := postgres.ScanMessages(br, cursors, pages, r.idx, limit); err != nil {
			return err
		}
	}
	_, err := br.Exec()
	return err
}

// shardSQL is a ReadMany statement on a shard's table instead of the
// distributed one.
func shardSQL(stmt, table string, shard pgx.Identifier) string {
	return postgres.ReplaceTable(stmt, table, shard.Sanitize())
}
