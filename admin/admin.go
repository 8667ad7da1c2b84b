// Package admin is what `sequencer admin` does: operator commands that read
// and change the shared tables of a store directly (no RPC to a node), each a
// method returning data. Rendering (aligned tables or JSON) is in render.go;
// cmd/sequencer only parses flags and dispatches.
//
// The cluster commands (members, partitions, route, forget, drain) follow the
// rules of package membership and read the ring with package ring, exactly as
// the nodes do; they need a PostgreSQL store. head, trim and migrate status
// work on both stores; backup on the embedded store only (PostgreSQL has
// pg_dump, docs/OPERATIONS.md).
package admin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/open"
	"github.com/sequencer-im/sequencer/ring"
)

// ErrNoCluster: a cluster command on the embedded store, which runs one node.
var ErrNoCluster = errors.New("the embedded store runs a single node: cluster commands need a PostgreSQL or MySQL store (--store postgres://... or mysql://...)")

// Options configures Open.
type Options struct {
	// Partitions is the ring's partition count; it must be the nodes'
	// --partitions. 0 means ring.DefaultPartitions.
	Partitions int
}

// Admin is an open store for operator commands.
type Admin struct {
	spec    open.Spec
	store   persist.Store
	members membership.Store // nil on the embedded store
	ring    ring.Config
}

// Open opens the store of spec (the --store spelling of `sequencer serve`)
// without migrating it. An embedded store file that does not exist is an
// error, not a new empty store.
func Open(ctx context.Context, spec string, opts Options) (*Admin, error) {
	sp, err := open.Parse(spec)
	if err != nil {
		return nil, err
	}
	if sp.Kind == open.KindSQLite {
		if _, err := os.Stat(sp.Path); err != nil {
			return nil, fmt.Errorf("no embedded store at %s: %w", sp.Path, err)
		}
	}
	cfg := ring.Config{Partitions: opts.Partitions}
	if _, err := ring.New(nil, cfg); err != nil {
		return nil, err
	}
	// Admin works next to a running node: it does not take the embedded
	// store's exclusive lock (only a serving node does).
	st, err := open.Store(ctx, spec, open.Options{NoMigrate: true, Embedded: open.Embedded{Shared: true}})
	if err != nil {
		return nil, err
	}
	a := &Admin{spec: sp, store: st, ring: cfg}
	if p, ok := st.(membership.Provider); ok {
		a.members = p.Membership()
	}
	return a, nil
}

// Close closes the store.
func (a *Admin) Close() error { return a.store.Close() }

// Store is the open store.
func (a *Admin) Store() persist.Store { return a.store }

func (a *Admin) cluster() (membership.Store, error) {
	if a.members == nil {
		return nil, ErrNoCluster
	}
	return a.members, nil
}

func (a *Admin) newRing(v membership.View) (*ring.Ring, error) {
	r, err := ring.New(v.RingNodes(), a.ring)
	if err != nil {
		return nil, fmt.Errorf("ring of membership version %d: %w", v.Version, err)
	}
	return r, nil
}

// nodeOf names the node of a lease owner (an incarnation): the live member
// running it, else the node id the incarnation was named after.
func nodeOf(v membership.View, incarnation string) (node string, live bool) {
	if incarnation == "" {
		return "", false
	}
	for _, m := range v.Members {
		if m.Incarnation == incarnation {
			return m.NodeID, true
		}
	}
	if i := strings.LastIndexByte(incarnation, '/'); i > 0 {
		return incarnation[:i], false
	}
	return incarnation, false
}

// Member is one member row.
type Member struct {
	NodeID      string    `json:"node_id"`
	Incarnation string    `json:"incarnation"`
	State       string    `json:"state"` // live, leaving or expired
	ClusterAddr string    `json:"cluster_addr"`
	APIAddr     string    `json:"api_addr"`
	LeaseUntil  time.Time `json:"lease_until"`
	// LeaseLeftMs is LeaseUntil minus the database clock (negative: expired).
	LeaseLeftMs int64 `json:"lease_left_ms"`
	// Leases is how many partition leases its incarnation holds.
	Leases int `json:"leases"`
	// RingPartitions is how many partitions the ring of the current view
	// gives it (0 while leaving or expired).
	RingPartitions int `json:"ring_partitions"`
}

// Members is the member table.
type Members struct {
	Version uint64    `json:"membership_version"`
	Now     time.Time `json:"db_now"`
	Members []Member  `json:"members"`
}

// Members lists every member row, expired ones not yet removed included.
func (a *Admin) Members(ctx context.Context) (Members, error) {
	ms, err := a.cluster()
	if err != nil {
		return Members{}, err
	}
	v, err := ms.View(ctx)
	if err != nil {
		return Members{}, err
	}
	rows, now, err := ms.Rows(ctx)
	if err != nil {
		return Members{}, err
	}
	r, err := a.newRing(v)
	if err != nil {
		return Members{}, err
	}
	held := map[string]int{}
	for _, l := range v.Leases {
		if l.Owner != "" {
			held[l.Owner]++
		}
	}
	out := Members{Version: v.Version, Now: now, Members: []Member{}}
	for _, m := range rows {
		st := "live"
		switch {
		case m.LeaseUntil.Before(now):
			st = "expired"
		case m.Leaving:
			st = "leaving"
		}
		e := Member{NodeID: m.NodeID, Incarnation: m.Incarnation, State: st, ClusterAddr: m.ClusterAddr, APIAddr: m.APIAddr,
			LeaseUntil: m.LeaseUntil, LeaseLeftMs: m.LeaseUntil.Sub(now).Milliseconds(), Leases: held[m.Incarnation]}
		if st == "live" {
			e.RingPartitions = len(r.OwnedBy(m.NodeID))
		}
		out.Members = append(out.Members, e)
	}
	return out, nil
}

// Partition is one partition: who the ring says should own it and who holds
// its lease.
type Partition struct {
	Partition uint32 `json:"partition"`
	// RingOwner is the node the ring of the current view gives it ("" with
	// no members).
	RingOwner string `json:"ring_owner"`
	// Owner is the node whose incarnation holds the lease ("" when released
	// or never leased); OwnerLive whether that incarnation is a live member.
	Owner            string `json:"owner"`
	OwnerIncarnation string `json:"owner_incarnation"`
	OwnerLive        bool   `json:"owner_live"`
	Epoch            uint64 `json:"epoch"`
	// Moving: the ring's owner does not hold the lease (a handoff or a
	// takeover is under way, or has not started).
	Moving bool `json:"moving"`
	// CitusWorkers: on Citus, the workers (host:port) that hold shards of
	// the partition's conversations: all those holding shards, since
	// partitions and shards are not aligned (docs/ARCHITECTURE.md).
	CitusWorkers []string `json:"citus_workers,omitempty"`
}

// Partitions is every partition of the ring.
type Partitions struct {
	Version    uint64      `json:"membership_version"`
	Moving     int         `json:"moving"`
	Partitions []Partition `json:"partitions"`

	citusWorkers []string // the table's summary line
}

// Partitions lists every partition with its ring owner and lease.
func (a *Admin) Partitions(ctx context.Context) (Partitions, error) {
	ms, err := a.cluster()
	if err != nil {
		return Partitions{}, err
	}
	v, err := ms.View(ctx)
	if err != nil {
		return Partitions{}, err
	}
	r, err := a.newRing(v)
	if err != nil {
		return Partitions{}, err
	}
	_, workers, _ := a.distributed()
	out := Partitions{Version: v.Version, Partitions: make([]Partition, 0, r.Partitions()), citusWorkers: workers}
	for p := range uint32(r.Partitions()) {
		out.Partitions = append(out.Partitions, partitionOf(v, r, p))
		out.Partitions[p].CitusWorkers = workers
		if out.Partitions[p].Moving {
			out.Moving++
		}
	}
	return out, nil
}

func partitionOf(v membership.View, r *ring.Ring, p uint32) Partition {
	e := Partition{Partition: p}
	if o, ok := r.Owner(p); ok {
		e.RingOwner = o.NodeID
	}
	if l, ok := v.Lease(p); ok {
		e.Epoch, e.OwnerIncarnation = l.Epoch, l.Owner
		e.Owner, e.OwnerLive = nodeOf(v, l.Owner)
	}
	e.Moving = e.RingOwner != "" && (!e.OwnerLive || e.Owner != e.RingOwner)
	return e
}

// Head is one conversation's head.
type Head struct {
	ConvID string `json:"conv_id"`
	// Head is the highest seq ever committed (0: none); the next send gets
	// Head+1.
	Head uint64 `json:"head"`
	// FirstStored is the lowest seq still stored (0: none; above 1 after
	// retention deleted older rows).
	FirstStored uint64 `json:"first_stored"`
	Partition   uint32 `json:"partition"`
	// Shard and Worker: on Citus, the shard holding the conversation and
	// the worker (host:port) holding that shard (docs/CITUS.md).
	Shard  int64  `json:"shard,omitempty"`
	Worker string `json:"worker,omitempty"`
}

// sharded is a distributed store's placement lookup (persist/citus).
type sharded interface {
	ShardOf(conv string) (shard int64, worker string, ok bool)
}

// Head reads conv's head and its oldest stored seq.
func (a *Admin) Head(ctx context.Context, conv string) (Head, error) {
	if conv == "" {
		return Head{}, errors.New("head: conversation id needed")
	}
	h, err := a.store.LoadHead(ctx, conv)
	if err != nil {
		return Head{}, err
	}
	out := Head{ConvID: conv, Head: h, Partition: ring.PartitionOf(conv, a.partitions())}
	if sh, ok := a.store.(sharded); ok {
		out.Shard, out.Worker, _ = sh.ShardOf(conv)
	}
	ms, err := a.store.ReadRange(ctx, conv, 0, 1)
	if err != nil {
		return Head{}, err
	}
	if len(ms) > 0 {
		out.FirstStored = ms[0].Seq
	}
	return out, nil
}

func (a *Admin) partitions() int {
	if a.ring.Partitions == 0 {
		return ring.DefaultPartitions
	}
	return a.ring.Partitions
}

// Placement is where a conversation goes, by the table: its partition, the
// ring's owner and the partition's lease (`sequencer admin route`).
type Placement struct {
	ConvID    string `json:"conv_id"`
	Partition uint32 `json:"partition"`
	Version   uint64 `json:"membership_version"`
	// Node is the ring's owner in the current view ("" with no members),
	// with its addresses.
	Node        string `json:"node"`
	APIAddr     string `json:"api_addr"`
	ClusterAddr string `json:"cluster_addr"`
	// The lease of the partition, as in Partitions.
	LeaseOwner string `json:"lease_owner"`
	OwnerLive  bool   `json:"lease_owner_live"`
	Epoch      uint64 `json:"epoch"`
	Moving     bool   `json:"moving"`
	// Shard and Worker: on Citus, the shard holding the conversation and
	// the worker (host:port) holding that shard.
	Shard  int64  `json:"shard,omitempty"`
	Worker string `json:"worker,omitempty"`
}

// Route computes conv's partition and owner with package ring over the
// current membership view, plus the partition's lease (and on Citus the
// conversation's shard and worker).
func (a *Admin) Route(ctx context.Context, conv string) (Placement, error) {
	if conv == "" {
		return Placement{}, errors.New("route: conversation id needed")
	}
	ms, err := a.cluster()
	if err != nil {
		return Placement{}, err
	}
	v, err := ms.View(ctx)
	if err != nil {
		return Placement{}, err
	}
	r, err := a.newRing(v)
	if err != nil {
		return Placement{}, err
	}
	p := r.Partition(conv)
	pt := partitionOf(v, r, p)
	out := Placement{ConvID: conv, Partition: p, Version: v.Version, Node: pt.RingOwner, LeaseOwner: pt.Owner,
		OwnerLive: pt.OwnerLive, Epoch: pt.Epoch, Moving: pt.Moving}
	if m, ok := v.Member(pt.RingOwner); ok {
		out.APIAddr, out.ClusterAddr = m.APIAddr, m.ClusterAddr
	}
	if sh, ok := a.store.(sharded); ok {
		out.Shard, out.Worker, _ = sh.ShardOf(conv)
	}
	return out, nil
}

// ErrLive: forget refused because the member's lease is live.
var ErrLive = errors.New("member is live")

// Forgot is what Forget removed.
type Forgot struct {
	NodeID      string `json:"node_id"`
	Incarnation string `json:"incarnation"`
	// WasLive: its lease had not expired (only with force).
	WasLive bool   `json:"was_live"`
	Version uint64 `json:"membership_version"`
}

// Forget removes the member row of node now, as the heartbeat's expiry
// removal does after the lease ran out (membership.Store.Remove: the version
// is bumped, the ring drops it, its partitions are taken over by the new
// owners at a higher epoch). A member whose lease is still live is refused
// with ErrLive unless force: a live node that is forgotten finds its row
// gone at its next heartbeat, steps down and rejoins as a new incarnation.
func (a *Admin) Forget(ctx context.Context, node string, force bool) (Forgot, error) {
	ms, err := a.cluster()
	if err != nil {
		return Forgot{}, err
	}
	rows, now, err := ms.Rows(ctx)
	if err != nil {
		return Forgot{}, err
	}
	for _, m := range rows {
		if m.NodeID != node {
			continue
		}
		live := !m.LeaseUntil.Before(now)
		if live && !force {
			return Forgot{}, fmt.Errorf("forget %s: %w (lease until %s, %v from now): drain it (sequencer admin drain %s), wait for its lease to expire, or pass --force if the process is gone",
				node, ErrLive, m.LeaseUntil.Format(time.RFC3339Nano), m.LeaseUntil.Sub(now).Round(time.Millisecond), node)
		}
		if err := ms.Remove(ctx, m.NodeID, m.Incarnation); err != nil {
			return Forgot{}, err
		}
		v, err := ms.View(ctx)
		if err != nil {
			return Forgot{}, err
		}
		return Forgot{NodeID: m.NodeID, Incarnation: m.Incarnation, WasLive: live, Version: v.Version}, nil
	}
	return Forgot{}, fmt.Errorf("forget %s: %w", node, membership.ErrNoSuchMember)
}

// Drained is the result of Drain.
type Drained struct {
	NodeID      string `json:"node_id"`
	Incarnation string `json:"incarnation"`
	Version     uint64 `json:"membership_version"`
	// Left: the drained incarnation finished leaving (its row is gone)
	// within the wait.
	Left bool `json:"left"`
	// Rejoined names a live incarnation of the same node id other than the
	// drained one (the process was restarted by a supervisor, or it was
	// rejoining when the drain was requested): that one is not drained.
	Rejoined string `json:"rejoined,omitempty"`
}

// Drain asks node to leave gracefully (a remote SIGTERM, through the table):
// its row is marked leaving (membership.Store.RequestDrain), so it leaves
// the ring at once; the node sees the mark at its next heartbeat, hands its
// partitions off, removes its row and exits 0. With wait > 0 Drain waits up
// to that long for the row to be gone.
func (a *Admin) Drain(ctx context.Context, node string, wait time.Duration) (Drained, error) {
	ms, err := a.cluster()
	if err != nil {
		return Drained{}, err
	}
	m, err := ms.RequestDrain(ctx, node)
	if err != nil {
		return Drained{}, err
	}
	out := Drained{NodeID: m.NodeID, Incarnation: m.Incarnation}
	deadline := time.Now().Add(wait)
	for {
		v, err := ms.View(ctx)
		if err != nil {
			return out, err
		}
		out.Version = v.Version
		if !v.Live(m.Incarnation) {
			out.Left = true
			if cur, ok := v.Member(node); ok && cur.Incarnation != m.Incarnation {
				out.Rejoined = cur.Incarnation
			}
			return out, nil
		}
		if wait <= 0 {
			return out, nil
		}
		if time.Now().After(deadline) {
			return out, fmt.Errorf("drain %s: still a member after %v (it may be handing off, or not running a version that knows drain requests)", node, wait)
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// MigrationRow is one schema migration.
type MigrationRow struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	// State: applied, pending (this binary has it, the store not yet) or
	// unknown (applied by a newer binary).
	State     string     `json:"state"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
}

// MigrationStatus compares the store's applied migrations with this
// binary's.
type MigrationStatus struct {
	Store      string         `json:"store"`
	Applied    int            `json:"applied_version"`
	Available  int            `json:"available_version"`
	UpToDate   bool           `json:"up_to_date"`
	Migrations []MigrationRow `json:"migrations"`
}

// MigrateStatus reads schema_version and lists applied vs available
// migrations. It applies nothing (`sequencer migrate` does).
func (a *Admin) MigrateStatus(ctx context.Context) (MigrationStatus, error) {
	m, ok := a.store.(persist.Migrator)
	if !ok {
		return MigrationStatus{}, fmt.Errorf("migrate status: the %s store has no schema versions", a.spec.Kind)
	}
	avail, err := m.AvailableMigrations()
	var applied []persist.AppliedMigration
	if err == nil {
		applied, err = m.AppliedMigrations(ctx)
	}
	if err != nil {
		return MigrationStatus{}, err
	}
	out := MigrationStatus{Store: string(a.spec.Kind), Migrations: []MigrationRow{}}
	done := map[int]persist.AppliedMigration{}
	for _, m := range applied {
		done[m.Version] = m
		out.Applied = max(out.Applied, m.Version)
	}
	known := map[int]bool{}
	for _, m := range avail {
		known[m.Version] = true
		out.Available = max(out.Available, m.Version)
		row := MigrationRow{Version: m.Version, Name: m.Name, State: "pending"}
		if am, ok := done[m.Version]; ok {
			at := am.AppliedAt
			row.State, row.AppliedAt = "applied", &at
		}
		out.Migrations = append(out.Migrations, row)
	}
	for _, m := range applied {
		if !known[m.Version] {
			at := m.AppliedAt
			out.Migrations = append(out.Migrations, MigrationRow{Version: m.Version, Name: m.Name, State: "unknown", AppliedAt: &at})
		}
	}
	out.UpToDate = true
	for _, r := range out.Migrations {
		if r.State == "pending" {
			out.UpToDate = false
		}
	}
	return out, nil
}

// Trimmed is the result of one retention pass.
type Trimmed struct {
	Before  time.Time `json:"before"`
	Deleted int       `json:"deleted"`
	TookMs  int64     `json:"took_ms"`
}

// Trim runs one retention pass (persist.TrimAll): every conversation loses
// its oldest messages with server_at before `before`; heads are kept.
func (a *Admin) Trim(ctx context.Context, before time.Time) (Trimmed, error) {
	if before.IsZero() {
		return Trimmed{}, errors.New("trim: a cutoff is needed (--before or --older-than)")
	}
	start := time.Now()
	n, err := persist.TrimAll(ctx, a.store, before, 0, nil)
	out := Trimmed{Before: before.UTC(), Deleted: n, TookMs: time.Since(start).Milliseconds()}
	return out, err
}

// BackedUp is the result of Backup.
type BackedUp struct {
	To    string `json:"to"`
	Bytes int64  `json:"bytes"`
}

// Backup copies the embedded store online into the new file to (VACUUM
// INTO). On PostgreSQL it refuses: use pg_dump or a base backup
// (docs/OPERATIONS.md).
func (a *Admin) Backup(ctx context.Context, to string) (BackedUp, error) {
	if a.spec.Kind == open.KindMySQL {
		return BackedUp{}, errors.New("backup: MySQL is backed up with mysqldump --single-transaction or mariabackup (docs/MYSQL.md)")
	}
	b, ok := a.store.(persist.Backuper)
	if !ok {
		return BackedUp{}, errors.New("backup: PostgreSQL is backed up with pg_dump or pg_basebackup + WAL archiving (docs/OPERATIONS.md)")
	}
	if to == "" {
		return BackedUp{}, errors.New("backup: --to FILE needed")
	}
	if _, err := os.Lstat(to); err == nil {
		return BackedUp{}, fmt.Errorf("backup: %s already exists", to)
	}
	// The copy holds every message body: it is written into a 0700
	// directory beside to, made 0600 (the store's own files' mode), then
	// linked to its name (which fails if to appeared meanwhile), so it is
	// never readable by others, whatever the umask.
	tmp, err := os.MkdirTemp(filepath.Dir(to), ".sequencer-backup-")
	if err != nil {
		return BackedUp{}, fmt.Errorf("backup: %w", err)
	}
	defer os.RemoveAll(tmp)
	part := filepath.Join(tmp, "backup.db")
	if err := b.BackupTo(ctx, part); err != nil {
		return BackedUp{}, err
	}
	if err := os.Chmod(part, 0o600); err != nil {
		return BackedUp{}, fmt.Errorf("backup: %w", err)
	}
	if err := os.Link(part, to); err != nil {
		return BackedUp{}, fmt.Errorf("backup: %w", err)
	}
	fi, err := os.Stat(to)
	if err != nil {
		return BackedUp{}, err
	}
	return BackedUp{To: to, Bytes: fi.Size()}, nil
}
