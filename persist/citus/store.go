package citus

// The distributed store: the DSN names a Citus coordinator's database (one
// with the citus extension). See docs/CITUS.md.
//
//   - Schema: migrations_citus/ replaces the files of persist/postgres's migrations/ with the
//     same version: conv_head and im_message (and read_position) are
//     distributed by conv_id and co-located; the control tables
//     (cluster_member, cluster_version, partition_lease, worker_lease,
//     schema_version) are plain tables of the coordinator.
//   - Commits go straight to the worker, into the shard tables: the store
//     computes a conversation's shard with Citus's own hash (citusHash:
//     PostgreSQL's hashtext of the conv_id, then the shard whose hash range
//     holds it, from pg_dist_shard), keeps a pool per worker (from
//     pg_dist_placement and pg_dist_node), and runs a commit whose
//     conversations are all on one worker on a connection to it, writing
//     its shards' own tables with plain statements guarded like Citus's
//     own writes (commit.go, "Direct writes"): no coordinator hop, no
//     two-phase commit, no Citus planning. The group-commit writer forms
//     such commits (CommitGroup, commit.Grouper). A commit spanning workers
//     goes through the coordinator (correct, with two-phase commit, slow).
//     A commit that reaches a worker that no longer holds one of its shards
//     (moved or split) writes nothing there, runs through Citus's own path
//     on the same connection (Citus routes it) and makes the store reload
//     the placements. LoadHead reads the shard table the same way
//     (shardHeadSQL).
//   - Fencing without a cross-node read: fence.go ("Fencing on Citus") and Commit.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

// dist is the distributed mode's state: placements, worker pools and the
// lease cache.
type dist struct {
	base  *pgxpool.Config // the commit pool's config: worker pools copy it
	conns int32           // connections per worker commit pool
	reads int32           // connections per worker read pool

	mu       sync.RWMutex
	shards   []shardRange             // conv_head's shards, by minimum hash
	byWorker map[string]*workerTables // every shard of a worker, by host:port (direct writes)
	workers  map[string]*pgxpool.Pool // commits, by host:port
	readers  map[string]*pgxpool.Pool // single-shard reads, by host:port
	loaded   time.Time

	leaseMu     sync.Mutex
	leases      map[uint32]persist.Fence // partition_lease as last read
	leasesHeld  bool                     // some lease has an owner
	leasesAt    time.Time
	refreshedAt time.Time

	noLeaseCheck bool // Options.NoLeaseCheck: skip checkFences

	// ownsTables: the store's user owns conv_head (or is a superuser), as
	// lock_shard_metadata requires; without it commits take Citus's own
	// path (Commit).
	ownsTables bool

	wantReload atomic.Bool // a commit failed on a worker: reload the placements soon
	stop       context.CancelFunc
	stopped    chan struct{}

	statMu    sync.Mutex
	direct    int64 // commits sent to a worker
	viaCoord  int64 // commits sent through the coordinator (several shards)
	rerouted  int64 // direct commits that found their shard gone and went through Citus
	refreshes int64 // placement reloads
	manyReads int64 // ReadMany round trips to workers (pages.go)
	manyEach  int64 // ReadManys read one conversation at a time instead
}

// shardRange is one shard of conv_head, its co-located shard of im_message
// and the worker holding them.
type shardRange struct {
	id       int64
	min, max int32
	node     string // host:port
	group    int32  // the worker's pg_dist_node.groupid
	msgShard int64  // im_message's shard of the same range (0: none found)
	// read_position's and feed_outbox's shards of the same range (0: none
	// found: a schema older than migrations_citus/0008, or the outbox a
	// coordinator table not yet distributed).
	posShard, outShard int64
	// The shard tables on the worker (schema-qualified), which a commit
	// writes directly (commit.go, "Direct writes").
	headTable, msgTable, posTable, outTable pgx.Identifier
}

// extras reports whether the shard's read_position and feed_outbox shards
// are known, so that a direct commit can write the senders' read
// positions and the outbox rows in its own transaction.
func (sh *shardRange) extras() bool {
	return sh.posShard != 0 && sh.outShard != 0 && len(sh.posTable) > 0 && len(sh.outTable) > 0
}

// LeaseTTL is how long the lease cache is trusted before a commit re-reads
// it (a commit whose fences do not match the cache re-reads it at once).
const LeaseTTL = 200 * time.Millisecond

// detectCitus reports whether the database has the citus extension.
func detectCitus(ctx context.Context, p *pgxpool.Pool) (bool, error) {
	var ok bool
	err := p.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&ok)
	return ok, err
}

// Distributed reports whether the store runs on Citus, and then its
// workers and shards (0, 0 before the schema exists).
func (s *Store) Distributed() (distributed bool, workers, shards int) {
	s.dist.mu.RLock()
	defer s.dist.mu.RUnlock()
	nodes := map[string]bool{}
	for _, sh := range s.dist.shards {
		nodes[sh.node] = true
	}
	return true, len(nodes), len(s.dist.shards)
}

// DistStats are counters of the distributed mode (tests, bench). Rerouted
// counts the commits sent to a worker that no longer held their shard
// (moved or split): they were written through Citus's own path instead.
// ManyWorkerReads counts ReadMany's round trips to workers (one per worker
// a call's cursors are on), ManyEach the ReadManys read one conversation
// at a time instead (placements unknown or moved).
type DistStats struct {
	Direct, ViaCoordinator, PlacementReloads, Rerouted int64
	ManyWorkerReads, ManyEach                          int64
}

// DistStats returns the counters.
func (s *Store) DistStats() DistStats {
	s.dist.statMu.Lock()
	defer s.dist.statMu.Unlock()
	return DistStats{Direct: s.dist.direct, ViaCoordinator: s.dist.viaCoord, PlacementReloads: s.dist.refreshes, Rerouted: s.dist.rerouted,
		ManyWorkerReads: s.dist.manyReads, ManyEach: s.dist.manyEach}
}

// loadPlacements reads conv_head's shards and their workers from Citus's
// metadata, and opens a pool for each new worker.
func (s *Store) loadPlacements(ctx context.Context) error {
	d := s.dist
	// conv_head's shards, each with im_message's, read_position's and
	// feed_outbox's shards of the same hash range (co-located: same
	// worker) and the shard tables' qualified names (shard_name, split by
	// parse_ident). feed_outbox may be missing or not distributed (a
	// schema before migrations_citus/0008): its shards are then 0.
	rows, err := s.ControlPool().Query(ctx, `SELECT s.shardid, s.shardminvalue::int4, s.shardmaxvalue::int4, n.nodename, n.nodeport, n.groupid,
			coalesce(m.shardid, 0), coalesce(r.shardid, 0), coalesce(o.shardid, 0),
			parse_ident(shard_name('conv_head'::regclass, s.shardid, false)),
			CASE WHEN m.shardid IS NOT NULL THEN parse_ident(shard_name(m.logicalrelid, m.shardid, false)) END,
			CASE WHEN r.shardid IS NOT NULL THEN parse_ident(shard_name(r.logicalrelid, r.shardid, false)) END,
			CASE WHEN o.shardid IS NOT NULL THEN parse_ident(shard_name(o.logicalrelid, o.shardid, false)) END
		FROM pg_dist_shard s
		JOIN pg_dist_placement p ON p.shardid = s.shardid
		JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary'
		LEFT JOIN pg_dist_shard m ON m.logicalrelid = 'im_message'::regclass AND m.shardminvalue = s.shardminvalue
		LEFT JOIN pg_dist_shard r ON r.logicalrelid = to_regclass('read_position') AND r.shardminvalue = s.shardminvalue
		LEFT JOIN pg_dist_shard o ON o.logicalrelid = to_regclass('feed_outbox') AND o.shardminvalue = s.shardminvalue
		WHERE s.logicalrelid = 'conv_head'::regclass
		ORDER BY s.shardminvalue::int4`)
	if err != nil {
		return postgres.Unavailable("citus: read placements", err)
	}
	shards, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (shardRange, error) {
		var sh shardRange
		var host string
		var port int32
		var head, msgs, pos, out []string
		err := r.Scan(&sh.id, &sh.min, &sh.max, &host, &port, &sh.group, &sh.msgShard, &sh.posShard, &sh.outShard, &head, &msgs, &pos, &out)
		sh.node = host + ":" + strconv.Itoa(int(port))
		sh.headTable, sh.msgTable, sh.posTable, sh.outTable = head, msgs, pos, out
		return sh, err
	})
	if err != nil {
		return postgres.Unavailable("citus: read placements", err)
	}
	// lock_shard_metadata (commit.go, "Direct writes") wants the tables'
	// owner (or a superuser).
	var owns bool
	if err := s.ControlPool().QueryRow(ctx, `SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = 'conv_head'::regclass`).Scan(&owns); err != nil {
		return postgres.Unavailable("citus: read the tables' owner", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.workers == nil {
		d.workers = map[string]*pgxpool.Pool{}
		d.readers = map[string]*pgxpool.Pool{}
	}
	for _, sh := range shards {
		if d.workers[sh.node] != nil {
			continue
		}
		w, err := d.workerPool(ctx, sh.node, d.conns)
		if err != nil {
			return err
		}
		r, err := d.workerPool(ctx, sh.node, d.reads)
		if err != nil {
			w.Close()
			return err
		}
		d.workers[sh.node], d.readers[sh.node] = w, r
	}
	d.shards = shards
	d.byWorker = workerTablesOf(shards)
	d.ownsTables = owns
	d.loaded = time.Now()
	d.statMu.Lock()
	d.refreshes++
	d.statMu.Unlock()
	return nil
}

// workerPool opens a pool of size connections to the worker at node
// (host:port), with the store's DSN settings but that host.
func (d *dist) workerPool(ctx context.Context, node string, size int32) (*pgxpool.Pool, error) {
	host, port, _ := cutLast(node, ":")
	pc := d.base.Copy()
	pc.ConnConfig.Host = host
	p, _ := strconv.Atoi(port)
	pc.ConnConfig.Port = uint16(p)
	pc.ConnConfig.Fallbacks = nil
	// As on the store's own pools: no cancel requests (they would end a
	// synchronous-replication wait of a worker with a standby).
	pc.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		postgres.NoCancelRequests(&cc.Config)
		return nil
	}
	pc.MaxConns = size
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, postgres.Unavailable("citus: open worker pool "+node, err)
	}
	return pool, nil
}

// reader returns the pool for a single-shard read of conv: the worker
// holding its shard (Citus runs the query locally there), or the
// coordinator's read pool before the placements are known.
func (s *Store) reader(conv string) *pgxpool.Pool {
	d := s.dist
	d.mu.RLock()
	defer d.mu.RUnlock()
	if i := d.shardOf(conv); i >= 0 {
		if p := d.readers[d.shards[i].node]; p != nil {
			return p
		}
	}
	return s.Pool()
}

func cutLast(s, sep string) (string, string, bool) {
	for i := len(s) - len(sep); i >= 0; i-- {
		if s[i:i+len(sep)] == sep {
			return s[:i], s[i+len(sep):], true
		}
	}
	return s, "", false
}

// shardOf returns the shard holding conv (its index in d.shards), -1 when
// the placements are not loaded.
func (d *dist) shardOf(conv string) int {
	h := citusHash([]byte(conv))
	i := sort.Search(len(d.shards), func(i int) bool { return d.shards[i].max >= h })
	if i == len(d.shards) || d.shards[i].min > h {
		return -1
	}
	return i
}

// CommitGroup implements commit.Grouper: conversations whose commits can
// share a transaction have the same group. With direct writes (the
// store's user owns the tables) that is every conversation of one worker
// (the transaction writes each shard's tables on that worker: commit.go,
// "Direct writes"), so a transaction holds as many conversations as on one
// PostgreSQL whatever the shard count; through Citus's own path, the
// conversations of one shard. 0 before the placements are known: one
// group.
func (s *Store) CommitGroup(conv string) uint64 {
	d := s.dist
	d.mu.RLock()
	defer d.mu.RUnlock()
	i := d.shardOf(conv)
	switch {
	case i < 0:
		return 0
	case d.directWrites():
		return workerGroupBit | uint64(uint32(d.shards[i].group))
	default:
		return uint64(d.shards[i].id)
	}
}

// workerGroupBit marks a CommitGroup that names a worker (its groupid), not
// a shard.
const workerGroupBit = 1 << 63

// directWrites reports whether commits may write the shard tables directly
// (d.mu held).
func (d *dist) directWrites() bool { return d.ownsTables }

// ShardOf returns the id of the shard holding conv and the worker
// (host:port) holding it, as the store knows them; ok false when it does
// not know them (placements not loaded).
func (s *Store) ShardOf(conv string) (shard int64, worker string, ok bool) {
	s.dist.mu.RLock()
	defer s.dist.mu.RUnlock()
	i := s.dist.shardOf(conv)
	if i < 0 {
		return 0, "", false
	}
	return s.dist.shards[i].id, s.dist.shards[i].node, true
}

// route returns the pool to run a commit of batches on: the worker holding
// their shards when that is one worker, with the plan of its direct writes
// (nil when it must go through Citus: a single shard then), else the
// coordinator's commit pool.
func (s *Store) route(ctx context.Context, batches []persist.ConvBatch) (*pgxpool.Pool, string, *directPlan, error) {
	d := s.dist
	d.mu.RLock()
	empty := len(d.shards) == 0
	d.mu.RUnlock()
	if empty {
		if err := s.loadPlacements(ctx); err != nil {
			return nil, "", nil, err
		}
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	plan := &directPlan{of: make([]int, len(batches))}
	at := map[int]int{} // index in d.shards -> index in plan.shards
	node := ""
	for i := range batches {
		k := d.shardOf(batches[i].ConvID)
		if k < 0 || (node != "" && d.shards[k].node != node) {
			return s.CommitPool(), "", nil, nil
		}
		node = d.shards[k].node
		j, ok := at[k]
		if !ok {
			j = len(plan.shards)
			at[k] = j
			plan.shards = append(plan.shards, d.shards[k])
		}
		plan.of[i] = j
	}
	// A commit that raises read positions or records outbox rows writes
	// them in its transaction, in the co-located shards of read_position
	// and feed_outbox: directly only when those are known.
	extras := needsExtras(batches)
	direct := d.directWrites()
	for _, sh := range plan.shards {
		direct = direct && sh.msgShard != 0 && len(sh.headTable) > 0 && len(sh.msgTable) > 0 && (!extras || sh.extras())
	}
	switch {
	case direct:
		if len(plan.shards) > fewShards {
			plan.all = d.byWorker[node]
			if plan.all != nil && extras && plan.all.outbox == "" {
				plan.all = nil // a statement pair per shard instead
			}
		}
		return d.workers[node], node, plan, nil
	case len(plan.shards) == 1:
		return d.workers[node], node, nil, nil
	default:
		return s.CommitPool(), "", nil, nil
	}
}

// needsExtras reports whether a commit writes read positions (the
// own-send rule) or outbox rows besides its messages.
func needsExtras(batches []persist.ConvBatch) bool {
	for i := range batches {
		b := &batches[i]
		if len(b.Messages) > 0 && (b.MarkSendersRead || b.Outbox.On) {
			return true
		}
	}
	return false
}

// directPlan is a commit's direct writes: the shards it touches (all on one
// worker) and each batch's shard.
type directPlan struct {
	shards []shardRange
	of     []int // of[i]: the index in shards of batches[i]'s shard
	// all: the commit touches more than fewShards shards, and writes them
	// with the statements of the worker's every shard (nil: a statement
	// pair per shard).
	all *workerTables
}

// fewShards is the most shards a commit writes with a statement pair per
// shard (the hot conversation: one). A commit touching more (spread load:
// usually every shard of the worker) uses the worker's two statements that
// write all of its shards at once (workerTables), so its statement count
// does not grow with the shard count: with 32 shards on 2 workers, a pair
// per shard cost the workers twice the CPU per message of 2 shards.
const fewShards = 2

// workerTables are every shard of one worker, by shard id, and the
// statements that write all of their tables (casShardsSQL,
// insertShardsSQL, and the senders' read positions and outbox rows:
// senderMarksShardsSQL, outboxShardsSQL; "" when a shard's read_position
// or feed_outbox table is not known); a shard the commit does not touch
// gets empty arrays.
type workerTables struct {
	shards        []shardRange
	cas, insert   string
	marks, outbox string
}

// workerTablesOf builds the workerTables of every worker whose shards'
// tables are all known (d.mu held for writing).
func workerTablesOf(shards []shardRange) map[string]*workerTables {
	out := map[string]*workerTables{}
	bad := map[string]bool{}
	for _, sh := range shards {
		if sh.msgShard == 0 || len(sh.headTable) == 0 || len(sh.msgTable) == 0 {
			bad[sh.node] = true
			continue
		}
		if out[sh.node] == nil {
			out[sh.node] = &workerTables{}
		}
		out[sh.node].shards = append(out[sh.node].shards, sh)
	}
	for node, wt := range out {
		if bad[node] {
			delete(out, node)
			continue
		}
		slices.SortFunc(wt.shards, func(a, b shardRange) int { return cmp.Compare(a.id, b.id) })
		heads := make([]pgx.Identifier, len(wt.shards))
		msgs := make([]pgx.Identifier, len(wt.shards))
		pos := make([]pgx.Identifier, len(wt.shards))
		outs := make([]pgx.Identifier, len(wt.shards))
		extras := true
		for i, sh := range wt.shards {
			heads[i], msgs[i], pos[i], outs[i] = sh.headTable, sh.msgTable, sh.posTable, sh.outTable
			extras = extras && sh.extras()
		}
		wt.cas, wt.insert = casShardsSQL(heads), insertShardsSQL(msgs)
		if extras {
			wt.marks, wt.outbox = senderMarksShardsSQL(pos), outboxShardsSQL(outs)
		}
	}
	return out
}

// pieces splits batches (those route was given) by shard: per touched
// shard, or with p.all per shard of the worker (most of them empty when
// few are touched); piece k is written to pieceShards()[k].
func (p *directPlan) pieces(batches []persist.ConvBatch) []postgres.CommitPiece {
	shards := p.pieceShards()
	of := p.of
	if p.all != nil {
		at := make(map[int64]int, len(shards))
		for k, sh := range shards {
			at[sh.id] = k
		}
		of = make([]int, len(batches))
		for i := range batches {
			of[i] = at[p.shards[p.of[i]].id]
		}
	}
	out := make([]postgres.CommitPiece, len(shards))
	for i := range batches {
		out[of[i]].Batches = append(out[of[i]].Batches, batches[i])
	}
	for k := range out {
		out[k].MsgTable = shards[k].msgTable
		if p.all == nil {
			out[k].Insert = postgres.InsertInto(shards[k].msgTable.Sanitize())
		}
	}
	return out
}

// pieceShards are the shards of the commit's pieces, in order: the
// touched ones, or with p.all every shard of the worker.
func (p *directPlan) pieceShards() []shardRange {
	if p.all != nil {
		return p.all.shards
	}
	return p.shards
}

// lockIDs are the shards whose metadata lock the commit takes (conv_head's;
// a move locks the whole co-located group), ascending.
func (p *directPlan) lockIDs() []int64 {
	ids := make([]int64, len(p.shards))
	for i, sh := range p.shards {
		ids[i] = sh.id
	}
	slices.Sort(ids)
	return ids
}

// shardIDs are every shard the commit may write (conv_head's,
// im_message's, and read_position's and feed_outbox's when known).
func (p *directPlan) shardIDs() []int64 {
	ids := make([]int64, 0, 4*len(p.shards))
	for _, sh := range p.shards {
		ids = append(ids, sh.id, sh.msgShard)
		if sh.extras() {
			ids = append(ids, sh.posShard, sh.outShard)
		}
	}
	return ids
}

// distributeOutbox distributes feed_outbox when it is a plain coordinator
// table: a Citus database migrated before migrations_citus/0008 existed
// took migrations/0008 as it is. Such a table is empty (no commit on
// Citus wrote it then), so distributing it moves no rows. Under the
// migration lock, like a migration.
func (s *Store) distributeOutbox(ctx context.Context) error {
	return pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", postgres.MigrationLock); err != nil {
			return postgres.Classify("migrate: lock", err)
		}
		var plain bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('feed_outbox') IS NOT NULL
			AND NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('feed_outbox'))`).Scan(&plain); err != nil {
			return postgres.Classify("migrate: look for feed_outbox", err)
		}
		if !plain {
			return nil
		}
		if _, err := tx.Exec(ctx, `SELECT create_distributed_table('feed_outbox', 'conv_id', colocate_with => 'conv_head')`); err != nil {
			return fmt.Errorf("postgres: distribute feed_outbox: %w", err)
		}
		s.Logger().Info("citus: feed_outbox distributed by conv_id, co-located with conv_head")
		return nil
	})
}

// closeWorkers stops the refresher and closes the worker pools.
func (d *dist) closeWorkers() {
	if d.stop != nil {
		d.stop()
		<-d.stopped
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.workers {
		p.Close()
	}
	for _, p := range d.readers {
		p.Close()
	}
	d.workers, d.readers = nil, nil
}

// startDist loads the placements if the schema exists (a database not yet
// migrated has none; Migrate loads them) and starts the refresher.
func (s *Store) startDist(ctx context.Context) error {
	var exists bool
	if err := s.ControlPool().QueryRow(ctx, `SELECT to_regclass('conv_head') IS NOT NULL`).Scan(&exists); err != nil {
		return postgres.Unavailable("citus: look for the schema", err)
	}
	if exists {
		if err := s.loadPlacements(ctx); err != nil {
			return err
		}
	}
	rctx, cancel := context.WithCancel(context.Background())
	s.dist.stop = cancel
	s.dist.stopped = make(chan struct{})
	go s.refreshDist(rctx)
	return nil
}

func (s *Store) logDistributed() {
	_, workers, shards := s.Distributed()
	s.Logger().Info(fmt.Sprintf("distributed: %d workers, %d shards", workers, shards), "workers", workers, "shards", shards)
}

// placementTTL is how often the refresher re-reads the placements (a shard
// moved by the rebalancer is found within it; a commit to the old worker
// meanwhile is routed on by Citus).
const placementTTL = 2 * time.Second

// refreshDist keeps the lease cache and the placements fresh, off the
// commit path, until the store closes.
func (s *Store) refreshDist(ctx context.Context) {
	defer close(s.dist.stopped)
	lt := time.NewTicker(LeaseTTL / 2)
	defer lt.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-lt.C:
		}
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		_, _, _ = s.leaseView(qctx, true)
		if time.Since(last) >= placementTTL || s.dist.wantReload.Swap(false) {
			last = time.Now()
			if s.hasShards() {
				_ = s.loadPlacements(qctx)
			}
		}
		cancel()
	}
}

func (s *Store) hasShards() bool {
	s.dist.mu.RLock()
	defer s.dist.mu.RUnlock()
	return len(s.dist.shards) > 0
}

// Commit implements persist.Store: checkFences (no round trip when the
// cached leases agree), then ONE transaction on the worker holding the
// batches' shard (or through the coordinator when they span shards), with
// the same pipelined statements and error kinds as persist/postgres's
// (postgres.CommitOn), the head compare-and-set carrying the fence epochs.
// On the worker it writes the shards' tables directly (directPlan,
// "Direct writes"); when the worker no longer holds one of them (nothing
// was written), the same commit runs at once through Citus's own path on
// the same connection (Citus routes it to the shards' workers) and the
// placements are reloaded.
func (s *Store) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	if err := persist.CheckBatchesKeysPerConv(batches); err != nil {
		return err
	}
	if len(batches) == 0 {
		return nil
	}
	if err := s.checkFences(ctx, batches); err != nil {
		return err
	}
	pool, node, direct, err := s.route(ctx, batches)
	if err != nil {
		return err
	}
	var settleOn *pgxpool.Pool // nil: the coordinator
	d := s.dist
	d.statMu.Lock()
	if node != "" {
		d.direct++
		settleOn = pool
	} else {
		d.viaCoord++
	}
	d.statMu.Unlock()
	var plan postgres.CommitPlan = routedPlan{}
	if direct != nil {
		plan = direct
	}
	err = s.RunCommit(ctx, pool, settleOn, node, func(conn *pgxpool.Conn) error {
		err := s.CommitOn(ctx, conn, batches, plan)
		if errors.Is(err, errShardNotHere) {
			d.wantReload.Store(true)
			d.statMu.Lock()
			d.rerouted++
			d.statMu.Unlock()
			// Through Citus on the same connection: it routes the
			// statements to the shards' workers from here (two-phase
			// commit if they are now on several).
			err = s.CommitOn(ctx, conn, batches, routedPlan{})
		}
		return err
	}, batches)
	if err != nil && persist.OutcomeOf(err) != persist.NotLanded || errors.Is(err, sequencer.ErrStoreUnavailable) {
		d.wantReload.Store(true) // a worker gone or its shards moved, maybe
	}
	return err
}

// shardHeadSQL is LoadHead on Citus: the head from the shard's own table
// (%s) on the worker, and in the same statement (so the same snapshot)
// whether the shard's placement is active on this worker. When it is, the
// table holds every commit that committed before the snapshot (a move
// switches the placement only after blocking and draining the shard's
// writes), so the answer is what Citus's own router read would give there,
// without its planner and local executor (a third of the worker's CPU in
// the many-conversations profile). When it is not (the table may be an
// orphan of a move), LoadHead asks Citus.
const shardHeadSQL = `SELECT EXISTS (SELECT 1 FROM pg_dist_placement p
  WHERE p.shardid = $2 AND p.shardstate = 1 AND p.groupid = (SELECT groupid FROM pg_dist_local_group)),
  (SELECT head FROM %s WHERE conv_id = $1)`

// loadHeadDirect is LoadHead from the shard table (shardHeadSQL); done is
// false when the store should ask Citus instead.
func (s *Store) loadHeadDirect(ctx context.Context, convID string) (head uint64, done bool, err error) {
	d := s.dist
	d.mu.RLock()
	i := d.shardOf(convID)
	var sh shardRange
	var pool *pgxpool.Pool
	if i >= 0 {
		sh, pool = d.shards[i], d.readers[d.shards[i].node]
	}
	d.mu.RUnlock()
	if pool == nil || len(sh.headTable) == 0 {
		return 0, false, nil
	}
	var here bool
	var h *int64
	err = pool.QueryRow(ctx, fmt.Sprintf(shardHeadSQL, sh.headTable.Sanitize()), convID, sh.id).Scan(&here, &h)
	var pg *pgconn.PgError
	switch {
	case errors.As(err, &pg) && pg.Code == sqlUndefinedTable, err == nil && !here:
		d.wantReload.Store(true) // the shard left this worker
		return 0, false, nil
	case err != nil:
		return 0, true, postgres.Unavailable("load head", err)
	case h == nil:
		return 0, true, nil
	}
	return uint64(*h), true, nil
}

// ClientKeysPerConversation implements persist.ConvScopedKeys: true, the
// resend key is (conv_id, from_uid, client_msg_id) on Citus.
func (s *Store) ClientKeysPerConversation() bool { return true }

// FindByClientKeyIn implements persist.ConvScopedKeys: convID's message with
// this resend key (one shard's index on Citus), or ErrNotFound.
func (s *Store) FindByClientKeyIn(ctx context.Context, convID string, key sequencer.ClientKey) (sequencer.Message, error) {
	if key.FromUID > math.MaxInt64 {
		return sequencer.Message{}, postgres.NotFound("client key (%d, %q) in %q", key.FromUID, key.ClientMsgID, convID)
	}
	m, err := postgres.ScanMessage(s.reader(convID).QueryRow(ctx, `SELECT `+postgres.MessageColumns+` FROM im_message
		WHERE conv_id = $1 AND from_uid = $2 AND client_msg_id = $3`, convID, int64(key.FromUID), key.ClientMsgID))
	if errors.Is(err, pgx.ErrNoRows) {
		return sequencer.Message{}, postgres.NotFound("client key (%d, %q) in %q", key.FromUID, key.ClientMsgID, convID)
	}
	if err != nil {
		return sequencer.Message{}, postgres.Unavailable("find by client key", err)
	}
	return m, nil
}

// ShardsByWorker counts conv_head's shards per worker (host:port), as the
// store last loaded the placements.
func (s *Store) ShardsByWorker() map[string]int {
	held := map[string]int{}
	s.dist.mu.RLock()
	defer s.dist.mu.RUnlock()
	for _, sh := range s.dist.shards {
		held[sh.node]++
	}
	return held
}

// OnWorker runs f on a connection to the Citus worker at addr: one of the
// store's read pool for it when it has one, else a connection of its own
// (same DSN settings, that host), closed after.
func (s *Store) OnWorker(ctx context.Context, addr string, f func(*pgx.Conn) error) error {
	s.dist.mu.RLock()
	pool := s.dist.readers[addr]
	s.dist.mu.RUnlock()
	if pool != nil {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		return f(conn.Conn())
	}
	host, port, _ := cutLast(addr, ":")
	cc := s.dist.base.ConnConfig.Copy()
	cc.Host = host
	p, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("bad worker address %q", addr)
	}
	cc.Port = uint16(p)
	cc.Fallbacks = nil
	postgres.NoCancelRequests(&cc.Config)
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return f(conn)
}
