package citus

// Read-only views of the Citus placements for operators: `sequencer admin
// shards` (CitusShards: the coordinator's metadata, then each worker's
// shard sizes and rows) and the console's workers (CitusWorkers: the
// node's own view, each worker pinged from this node). Nothing here is on
// the commit path.

import (
	"context"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

// CitusShard and CitusWorker are persist's (the Sharded ability).
type (
	CitusShard  = persist.CitusShard
	CitusWorker = persist.CitusWorker
)

// distributedRelations are the tables distributed by conv_id, co-located
// with conv_head (migrations_citus).
var distributedRelations = []string{"conv_head", "im_message", "read_position"}

// workerTimeout bounds one worker's answers in the views below.
const workerTimeout = 5 * time.Second

// CitusShards reads every shard group and every primary worker from the
// coordinator's metadata (pg_dist_shard, pg_dist_placement, pg_dist_node:
// not the store's cached copy), then asks each worker, in parallel and
// directly, the size of its shards and conv_head's rows in each (a scan of
// conv_head: one row per conversation). A worker that does not answer is
// reported unreachable and its shards unknown; an error means the
// coordinator did not answer (or the store is not on Citus).
func (s *Store) CitusShards(ctx context.Context) ([]CitusShard, []CitusWorker, error) {
	rows, err := s.Pool().Query(ctx, `SELECT s.logicalrelid::regclass::text, s.shardid,
			s.shardminvalue::int4, s.shardmaxvalue::int4, n.nodename, n.nodeport
		FROM pg_dist_shard s
		JOIN pg_dist_placement p ON p.shardid = s.shardid
		JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary'
		WHERE s.logicalrelid::regclass::text = ANY($1)
		ORDER BY s.shardminvalue::int4, s.logicalrelid::regclass::text`, distributedRelations)
	if err != nil {
		return nil, nil, postgres.Unavailable("citus: read shards", err)
	}
	type placement struct {
		rel      string
		id       int64
		min, max int32
		host     string
		port     int32
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (placement, error) {
		var p placement
		err := r.Scan(&p.rel, &p.id, &p.min, &p.max, &p.host, &p.port)
		return p, err
	})
	if err != nil {
		return nil, nil, postgres.Unavailable("citus: read shards", err)
	}
	addrs, err := s.primaryWorkers(ctx)
	if err != nil {
		return nil, nil, err
	}
	var shards []CitusShard
	byRange := map[[2]int32]int{}
	for _, p := range ps {
		k := [2]int32{p.min, p.max}
		i, ok := byRange[k]
		if !ok {
			i = len(shards)
			byRange[k] = i
			shards = append(shards, CitusShard{MinHash: p.min, MaxHash: p.max})
		}
		sh := &shards[i]
		sh.Tables = append(sh.Tables, p.rel+"_"+strconv.FormatInt(p.id, 10))
		if p.rel == "conv_head" {
			sh.ID, sh.Worker = p.id, p.host+":"+strconv.Itoa(int(p.port))
		}
	}
	sort.Slice(shards, func(i, j int) bool { return shards[i].MinHash < shards[j].MinHash })
	onWorker := map[string][]int{}
	for i, sh := range shards {
		onWorker[sh.Worker] = append(onWorker[sh.Worker], i)
		if !slices.Contains(addrs, sh.Worker) {
			addrs = append(addrs, sh.Worker) // a placement on a node no longer primary: show it
		}
	}
	workers := make([]CitusWorker, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		workers[i] = CitusWorker{Addr: addr, Shards: len(onWorker[addr])}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &workers[i]
			wctx, cancel := context.WithTimeout(ctx, workerTimeout)
			defer cancel()
			err := s.OnWorker(wctx, addr, func(c *pgx.Conn) error {
				for _, k := range onWorker[addr] {
					if err := readShard(wctx, c, &shards[k]); err != nil {
						return err
					}
					w.Bytes += shards[k].Bytes
				}
				return nil
			})
			w.Reachable, w.Err = err == nil, errString(err)
			if err != nil {
				w.Bytes = 0
				for _, k := range onWorker[addr] {
					shards[k].Known, shards[k].Bytes, shards[k].Conversations, shards[k].Messages = false, 0, 0, 0
				}
			}
		}()
	}
	wg.Wait()
	sort.Slice(workers, func(i, j int) bool { return workers[i].Addr < workers[j].Addr })
	return shards, workers, nil
}

// readShard reads one shard group's size and conv_head's rows on the
// worker holding it. A relation that is not there (the shard moved since
// the metadata was read) counts as empty.
func readShard(ctx context.Context, c *pgx.Conn, sh *CitusShard) error {
	if err := c.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(to_regclass(t))), 0)::int8
		FROM unnest($1::text[]) AS t`, sh.Tables).Scan(&sh.Bytes); err != nil {
		return err
	}
	head := pgx.Identifier{"conv_head_" + strconv.FormatInt(sh.ID, 10)}
	var exists bool
	if err := c.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, head.Sanitize()).Scan(&exists); err != nil {
		return err
	}
	if exists {
		if err := c.QueryRow(ctx, `SELECT count(*), coalesce(sum(head), 0)::int8 FROM `+head.Sanitize()).
			Scan(&sh.Conversations, &sh.Messages); err != nil {
			return err
		}
	}
	sh.Known = true
	return nil
}

// primaryWorkers lists the primary workers of pg_dist_node (host:port),
// the coordinator excluded (group 0).
func (s *Store) primaryWorkers(ctx context.Context) ([]string, error) {
	rows, err := s.Pool().Query(ctx, `SELECT nodename, nodeport FROM pg_dist_node
		WHERE noderole = 'primary' AND groupid <> 0 AND isactive ORDER BY nodename, nodeport`)
	if err != nil {
		return nil, postgres.Unavailable("citus: read workers", err)
	}
	addrs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var host string
		var port int32
		err := r.Scan(&host, &port)
		return host + ":" + strconv.Itoa(int(port)), err
	})
	if err != nil {
		return nil, postgres.Unavailable("citus: read workers", err)
	}
	return addrs, nil
}

// CitusWorkerAddrs lists the workers (host:port) holding shards, as the
// store last loaded the placements.
func (s *Store) CitusWorkerAddrs() []string {
	held := s.ShardsByWorker()
	out := make([]string, 0, len(held))
	for a := range held {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// CitusWorkers is this node's view of the workers, for the console: those
// of its cached placements (re-read every 2 s) with the shards it routes to
// each, and the primaries of pg_dist_node when the coordinator answers
// (a worker just added holds no shard yet); each is pinged from this node,
// in parallel, within ctx.
func (s *Store) CitusWorkers(ctx context.Context) ([]CitusWorker, error) {
	held := s.ShardsByWorker()
	addrs := make([]string, 0, len(held))
	for a := range held {
		addrs = append(addrs, a)
	}
	if more, err := s.primaryWorkers(ctx); err == nil {
		for _, a := range more {
			if !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	sort.Strings(addrs)
	out := make([]CitusWorker, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		out[i] = CitusWorker{Addr: a, Shards: held[a]}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.OnWorker(ctx, a, func(c *pgx.Conn) error { return c.Ping(ctx) })
			out[i].Reachable, out[i].Err = err == nil, errString(err)
		}()
	}
	wg.Wait()
	return out, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
