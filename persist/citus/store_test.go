package citus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/membership/membershiptest"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/citustest"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/persist/postgres"
	"github.com/sequencer-im/sequencer/persist/storetest"
)

// newCitusStore opens a migrated store on a fresh Citus database.
func newCitusStore(t testing.TB) (*Store, *citustest.Database) {
	t.Helper()
	db := citustest.NewDatabase(t)
	s := openStore(t, db.DSN())
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s, db
}

// The Go hash is Citus's: for many conv_ids, the shard the store computes
// is the one get_shard_id_for_distribution_column names; and hashtext on
// plain PostgreSQL agrees with citusHash.
func TestCitusHash(t *testing.T) {
	ctx := context.Background()
	plain := pgtest.NewDatabase(t)
	conn, err := pgx.Connect(ctx, plain)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, v := range []string{"", "a", "abc", "hello world!", "g:conv:123456789012345", "日本語の会話", strings.Repeat("x", 64)} {
		var h int32
		if err := conn.QueryRow(ctx, `SELECT hashtext($1::varchar)`, v).Scan(&h); err != nil {
			t.Fatal(err)
		}
		if got := citusHash([]byte(v)); got != h {
			t.Fatalf("citusHash(%q) = %d, hashtext %d", v, got, h)
		}
	}
	s, _ := newCitusStore(t)
	var convs []string
	for i := range 500 {
		convs = append(convs, fmt.Sprintf("conv-%d-%x", i, i*7919))
	}
	groupWorker := map[uint64]string{}
	rows, err := s.Pool().Query(ctx, `SELECT c, get_shard_id_for_distribution_column('conv_head', c) FROM unnest($1::text[]) AS c`, convs)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var c string
		var id int64
		if err := rows.Scan(&c, &id); err != nil {
			t.Fatal(err)
		}
		got, worker, ok := s.ShardOf(c)
		if !ok || got != id {
			t.Fatalf("ShardOf(%q) = %d %v, Citus says %d", c, got, ok, id)
		}
		// With direct writes a commit group is a worker; through Citus's
		// own path, a shard.
		g := s.CommitGroup(c)
		if w, seen := groupWorker[g]; seen && w != worker {
			t.Fatalf("CommitGroup(%q) = %x, the group of %s and %s", c, g, w, worker)
		}
		groupWorker[g] = worker
		s.routeOnly(true)
		if g := s.CommitGroup(c); g != uint64(id) {
			t.Fatalf("CommitGroup(%q) through Citus = %d, want its shard %d", c, g, id)
		}
		s.routeOnly(false)
		n++
	}
	if err := rows.Err(); err != nil || n != len(convs) {
		t.Fatalf("%d rows, %v", n, err)
	}
	if len(groupWorker) != 2 {
		t.Fatalf("commit groups %v: want one per worker", groupWorker)
	}
}

// convsOfWorker returns n conversation ids in k shards of the worker
// holding "seed"'s shard (seed's shard first), taking the shards in turn
// (and that worker).
func convsOfWorker(t testing.TB, s *Store, seed string, n, k int) ([]string, string) {
	t.Helper()
	first, worker, ok := s.ShardOf(seed)
	if !ok {
		t.Fatal("no placements")
	}
	order := []int64{first}
	by := map[int64][]string{}
	for i := 0; ; i++ {
		c := fmt.Sprintf("%s/%d", seed, i)
		id, w, _ := s.ShardOf(c)
		if w != worker {
			continue
		}
		if _, seen := by[id]; !seen && id != first {
			if len(order) == k {
				continue
			}
			order = append(order, id)
		}
		by[id] = append(by[id], c)
		full := len(order) == k
		for _, id := range order {
			full = full && len(by[id]) >= n
		}
		if full {
			break
		}
	}
	var out []string
	for i := 0; len(out) < n; i++ {
		out = append(out, by[order[i%k]][i/k])
	}
	return out, worker
}

// convsOfShard returns n conversation ids of the shard of "seed" (and that
// shard's worker).
func convsOfShard(t testing.TB, s *Store, seed string, n int) ([]string, string) {
	t.Helper()
	shard, worker, ok := s.ShardOf(seed)
	if !ok {
		t.Fatal("no placements")
	}
	var out []string
	for i := 0; len(out) < n; i++ {
		c := fmt.Sprintf("%s/%d", seed, i)
		if id, _, _ := s.ShardOf(c); id == shard {
			out = append(out, c)
		}
	}
	return out, worker
}

func statements(t testing.TB, dsn, like string) int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query ILIKE $1`, like).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func execDSN(t testing.TB, dsn, sql string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// A commit whose conversations are on one worker (here in two of its
// shards) runs on that worker and nowhere else (and LoadHead reads the
// shard tables there): pg_stat_statements shows its statements on that worker only (not on
// the coordinator: no hop; not on the other worker), it writes the shards'
// own tables there (the metadata lock of the direct writes, no
// seq_cas_heads through Citus), and no two-phase commit happens anywhere
// (no PREPARE TRANSACTION, no pg_dist_transaction record on the
// coordinator).
func TestCitusCommitsGoStraightToTheShard(t *testing.T) {
	s, db := newCitusStore(t)
	ctx := context.Background()
	nodes := append([]citustest.Node{db.Coordinator}, db.Workers...)
	execDSN(t, db.DSN(), `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`) // Citus creates it on the workers
	for _, n := range nodes {
		execDSN(t, n.DSN(db.Name), `SELECT pg_stat_statements_reset()`)
	}
	convs, worker := convsOfWorker(t, s, "direct", 40, 2)
	before := s.DistStats()
	var dtx0 int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_dist_transaction`).Scan(&dtx0); err != nil {
		t.Fatal(err)
	}
	const rounds = 25
	for r := range rounds {
		var bs []persist.ConvBatch
		for _, c := range convs[:20+r%20] {
			h, err := s.LoadHead(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			bs = append(bs, persist.ConvBatch{ConvID: c, PrevHead: h, Messages: []sequencer.Message{msgAt(c, h+1)}})
		}
		if err := s.Commit(ctx, bs); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
	}
	if st := s.DistStats(); st.Direct-before.Direct != rounds || st.ViaCoordinator != before.ViaCoordinator {
		t.Fatalf("stats %+v (before %+v), want %d direct commits", st, before, rounds)
	}
	if st := s.DistStats(); st.Rerouted != 0 {
		t.Fatalf("stats %+v: commits rerouted with no shard moving", st)
	}
	for _, n := range nodes {
		direct := statements(t, n.DSN(db.Name), "%lock_shard_metadata%")
		cas := statements(t, n.DSN(db.Name), "%seq_cas_heads%")
		ins := statements(t, n.DSN(db.Name), "INSERT INTO %im_message%")
		prep := statements(t, n.DSN(db.Name), "PREPARE TRANSACTION%")
		if heads := statements(t, n.DSN(db.Name), "SELECT head FROM conv_head%"); heads != 0 {
			t.Fatalf("LoadHead went through Citus on %s %d times", n.Name, heads)
		}
		if heads := statements(t, n.DSN(db.Name), "%FROM pg_dist_placement%SELECT head FROM%"); (n.Addr() == worker) != (heads >= rounds*20) {
			t.Fatalf("LoadHead read the shard tables on %s %d times", n.Name, heads)
		}
		holds := n.Addr() == worker
		t.Logf("%s (%s): direct %d, seq_cas_heads %d, inserts %d, prepares %d", n.Name, n.Addr(), direct, cas, ins, prep)
		switch {
		case prep != 0:
			t.Fatalf("%s ran PREPARE TRANSACTION %d times: two-phase commit on the hot path", n.Name, prep)
		case holds && (direct < rounds || ins < 2*rounds):
			t.Fatalf("the shards' worker %s ran %d direct commits / %d inserts, want %d / %d (two shards)", n.Name, direct, ins, rounds, 2*rounds)
		case cas != 0:
			t.Fatalf("%s ran seq_cas_heads %d times: a commit went through Citus's planner", n.Name, cas)
		case !holds && (direct != 0 || ins != 0):
			t.Fatalf("%s, which does not hold the shard, ran %d direct commits / %d inserts", n.Name, direct, ins)
		}
	}
	var dtx int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_dist_transaction`).Scan(&dtx); err != nil {
		t.Fatal(err)
	}
	if dtx != dtx0 {
		t.Fatalf("%d distributed transactions recorded on the coordinator during the commits", dtx-dtx0)
	}
	for _, c := range convs[:20] {
		if h, _ := s.LoadHead(ctx, c); h != rounds {
			t.Fatalf("%s head %d, want %d", c, h, rounds)
		}
	}
}

// msgAt is conv's message at seq with fresh ids.
var citusMsgMu sync.Mutex
var citusNextID uint64 = 9_000_000_000_000

func msgAt(conv string, seq uint64) sequencer.Message {
	citusMsgMu.Lock()
	citusNextID++
	id := citusNextID
	citusMsgMu.Unlock()
	return sequencer.Message{MsgID: id, ConvID: conv, Seq: seq, FromUID: 7, MsgType: 1, Body: []byte("b"),
		ClientMsgID: fmt.Sprint("k", id), ServerAt: time.Now()}
}

// A commit spanning shards is still all-or-nothing (through the
// coordinator).
func TestCitusMultiShardCommit(t *testing.T) {
	s, _ := newCitusStore(t)
	ctx := context.Background()
	a, _ := convsOfShard(t, s, "ms-a", 1)
	var b string
	for i := 0; ; i++ {
		c := fmt.Sprint("ms-b-", i)
		if s.CommitGroup(c) != s.CommitGroup(a[0]) {
			b = c
			break
		}
	}
	if err := s.Commit(ctx, []persist.ConvBatch{{ConvID: a[0], Messages: []sequencer.Message{msgAt(a[0], 1)}},
		{ConvID: b, Messages: []sequencer.Message{msgAt(b, 1)}}}); err != nil {
		t.Fatal(err)
	}
	if s.DistStats().ViaCoordinator != 1 {
		t.Fatalf("stats %+v", s.DistStats())
	}
	// b's prev is wrong: nothing of a lands either.
	err := s.Commit(ctx, []persist.ConvBatch{{ConvID: a[0], PrevHead: 1, Messages: []sequencer.Message{msgAt(a[0], 2)}},
		{ConvID: b, PrevHead: 5, Messages: []sequencer.Message{msgAt(b, 6)}}})
	var hm *persist.HeadMismatchError
	if !errors.As(err, &hm) || len(hm.ConvIDs) != 1 || hm.ConvIDs[0] != b {
		t.Fatalf("got %v, want a head mismatch naming %s", err, b)
	}
	if h, _ := s.LoadHead(ctx, a[0]); h != 1 {
		t.Fatalf("head of a = %d after a refused commit", h)
	}
}

// The zombie case on Citus, with the zombie's lease cache out of the way
// (so only the head row's epoch fences it): a stale owner's commit before
// the new owner's first write lands (contiguous; the new owner's
// compare-and-set then fails with a head mismatch and it re-reads), and
// after the new owner wrote, the stale owner is refused with
// StaleFenceError even with the right head.
func TestCitusZombieFencedByHeadEpoch(t *testing.T) {
	s, db := newCitusStore(t)
	ctx := context.Background()
	zombie := openStoreWith(t, db.DSN(), Options{NoLeaseCheck: true})
	put := func(f persist.Fence) {
		if err := s.PutPartitionLeaseForTest(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	old := persist.Fence{Partition: 4, Owner: "node-a", Epoch: 3}
	put(old)
	conv := "zombie-conv"
	one := func(prev uint64, f persist.Fence) persist.ConvBatch {
		return persist.ConvBatch{ConvID: conv, PrevHead: prev, Fence: f, Messages: []sequencer.Message{msgAt(conv, prev+1)}}
	}
	if err := zombie.Commit(ctx, []persist.ConvBatch{one(0, old)}); err != nil {
		t.Fatal(err)
	}
	// node-b takes the partition and reads head 1.
	neu := persist.Fence{Partition: 4, Owner: "node-b", Epoch: 4}
	put(neu)
	h, _ := s.LoadHead(ctx, conv)
	// The zombie commits before node-b wrote: harmless, it lands.
	if err := zombie.Commit(ctx, []persist.ConvBatch{one(h, old)}); err != nil {
		t.Fatalf("zombie before the new owner's first write: %v", err)
	}
	// node-b's compare-and-set fails: it re-reads and goes on.
	err := s.Commit(ctx, []persist.ConvBatch{one(h, neu)})
	if !errors.Is(err, sequencer.ErrHeadMismatch) {
		t.Fatalf("new owner with the old head: %v, want head mismatch", err)
	}
	h, _ = s.LoadHead(ctx, conv)
	if h != 2 {
		t.Fatalf("head %d, want 2", h)
	}
	if err := s.Commit(ctx, []persist.ConvBatch{one(h, neu)}); err != nil {
		t.Fatal(err)
	}
	// Now the zombie, even with the right head, is refused for good.
	err = zombie.Commit(ctx, []persist.ConvBatch{one(3, old)})
	var sf *persist.StaleFenceError
	if !errors.As(err, &sf) || len(sf.Fences) != 1 || sf.Fences[0] != old {
		t.Fatalf("zombie after the new owner wrote: %v, want StaleFenceError naming %+v", err, old)
	}
	// With its cache, the zombie is refused before anything is sent.
	zombie.dist.noLeaseCheck = false
	if err := zombie.Commit(ctx, []persist.ConvBatch{one(3, old)}); !errors.As(err, &sf) {
		t.Fatalf("zombie with its lease cache: %v", err)
	}
	rows, err := s.ReadRange(ctx, conv, 0, 10)
	if err != nil || len(rows) != 3 {
		t.Fatalf("rows %d, %v", len(rows), err)
	}
	for i, m := range rows {
		if m.Seq != uint64(i+1) {
			t.Fatalf("seqs %v", rows)
		}
	}
}

// Traps of Citus 13.2.2 (issue 20) the store must never walk into:
// seq_cas_heads indexes no array (a plpgsql `SET col = arr[i]` crashes the
// node), and its UPDATE ... FROM unnest is pruned with conv_id = ANY.
func TestCitusTraps(t *testing.T) {
	b, err := os.ReadFile("migrations_citus/0003_commit_check.sql")
	if err != nil {
		t.Fatal(err)
	}
	var body []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			body = append(body, l)
		}
	}
	code := strings.Join(body, "\n")
	if m := regexp.MustCompile(`[A-Za-z_)]\s*\[[^\]]+\]`).FindString(code); m != "" {
		t.Fatalf("the Citus migration indexes an array (%q): Citus 13.2.2 crashes on `SET col = arr[i]` in plpgsql", m)
	}
	for _, stmt := range regexp.MustCompile(`(?s)UPDATE .*?;`).FindAllString(code, -1) {
		if strings.Contains(stmt, "unnest(") && !strings.Contains(stmt, "conv_id = ANY(") {
			t.Fatalf("an UPDATE ... FROM unnest without conv_id = ANY (runs on every shard with 2PC):\n%s", stmt)
		}
	}
}

// Shard count: the DSN's citus.shard_count at the first migrate decides it.
func TestCitusShardCountFromDSN(t *testing.T) {
	db := citustest.NewDatabase(t)
	s := openStore(t, db.DSN()+"&options=-c%20citus.shard_count%3D6")
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	dist, workers, shards := s.Distributed()
	if !dist || shards != 6 || workers != 2 {
		t.Fatalf("distributed %v, %d workers, %d shards; want 2 workers, 6 shards", dist, workers, shards)
	}
}

// No statement of the Citus migrations (applied one at a time:
// postgres.SplitSQL) splits a function body.
func TestCitusMigrationsSplitWhole(t *testing.T) {
	ms, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		for _, q := range postgres.SplitSQL(m.SQL) {
			if strings.Count(q, "$fn$")%2 != 0 {
				t.Fatalf("%s: a statement splits a function body: %q", m.Name, q)
			}
		}
	}
}

// A file of migrations_citus/ replaces the plain file of the same version:
// every Citus version has a plain one, so a new plain migration can never
// be shadowed on Citus by accident.
func TestCitusMigrationsReplacePlainOnes(t *testing.T) {
	over, err := persist.LoadMigrations(migrationFS, "migrations_citus")
	if err != nil {
		t.Fatal(err)
	}
	plain, err := postgres.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	names := map[int]string{}
	for _, m := range plain {
		names[m.Version] = m.Name
	}
	for _, m := range over {
		if p, ok := names[m.Version]; !ok || p != m.Name {
			t.Errorf("migrations_citus/%s.sql: the plain migrations/ file of version %d is %q, want the same name", m.Name, m.Version, p)
		}
	}
}

// Migration 0006 on a Citus database that holds messages: afterwards
// im_message has one resend-key index, UNIQUE (from_uid, client_msg_id,
// conv_id), and the key still refuses a resend in the same conversation
// and finds messages by (from_uid, client_msg_id).
func TestCitusResendKeyMigration(t *testing.T) {
	db := citustest.NewDatabase(t)
	s := openStore(t, db.DSN())
	ctx := context.Background()
	ms, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Version < 6 {
			if err := s.ApplyMigrations(ctx, []Migration{m}, true); err != nil {
				t.Fatalf("%s: %v", m.Name, err)
			}
		}
	}
	if err := s.loadPlacements(ctx); err != nil {
		t.Fatal(err)
	}
	// The row as a store of that version wrote it: today's Commit writes
	// columns later migrations add (kind, target_msg_id, ...).
	first := msgAt("mig", 1)
	if _, err := s.Pool().Exec(ctx, `INSERT INTO im_message (msg_id, conv_id, seq, from_uid, msg_type, body, client_msg_id, server_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, int64(first.MsgID), first.ConvID, int64(first.Seq), int64(first.FromUID),
		first.MsgType, first.Body, first.ClientMsgID, first.ServerAt); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, `INSERT INTO conv_head (conv_id, head) VALUES ($1, 1)`, first.ConvID); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate to 0006: %v", err)
	}
	rows, err := s.Pool().Query(ctx, `SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index
		WHERE indrelid = 'im_message'::regclass ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var name, def string
		err := r.Scan(&name, &def)
		_, cols, _ := strings.Cut(def, " USING btree ")
		return name + " " + cols, err
	})
	if err != nil {
		t.Fatal(err)
	}
	// (Migrate goes on past 0006: im_message_target is 0007's, for the
	// edit events of a recalled message.)
	want := []string{"im_message_msg_id (msg_id)", "im_message_pkey (conv_id, msg_id)", "im_message_target (conv_id, target_msg_id) WHERE (target_msg_id <> 0)",
		"uk_conv_seq (conv_id, seq)", "uk_from_client (from_uid, client_msg_id, conv_id)"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("im_message's indexes after 0006:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	again := msgAt("mig", 2)
	again.FromUID, again.ClientMsgID = first.FromUID, first.ClientMsgID
	ce, ok := persist.AsConflict(s.Commit(ctx, []persist.ConvBatch{{ConvID: "mig", PrevHead: 1, Messages: []sequencer.Message{again}}}))
	if !ok || len(ce.Conflicts) != 1 || ce.Conflicts[0].Key != persist.KeyClientMsgID {
		t.Fatalf("resend in the same conversation after 0006: %+v", ce)
	}
	if m, err := s.FindByClientKey(ctx, first.Key()); err != nil || m.MsgID != first.MsgID {
		t.Fatalf("FindByClientKey after 0006: %+v, %v", m, err)
	}
}

// A shard moves to the other worker (citus_move_shard_placement) while
// four writers commit to its conversations: every acknowledged message is
// stored, every conversation's seqs stay 1..head without a gap, and the
// store finds the new placement (its commits then go to the new worker).
func TestCitusShardMoveUnderLoad(t *testing.T) {
	s, db := newCitusStore(t)
	ctx := context.Background()
	convs, from := convsOfShard(t, s, "move", 16)
	shard, _, _ := s.ShardOf(convs[0])
	var to citustest.Node
	for _, w := range db.Workers {
		if w.Addr() != from {
			to = w
		}
	}
	var src citustest.Node
	for _, w := range db.Workers {
		if w.Addr() == from {
			src = w
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	acked := make([]int, len(convs))
	errs := make(chan error, 4)
	for wkr := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := convs[wkr*4 : wkr*4+4]
			heads := make([]uint64, len(mine))
			for {
				select {
				case <-stop:
					return
				default:
				}
				var bs []persist.ConvBatch
				for i, c := range mine {
					bs = append(bs, persist.ConvBatch{ConvID: c, PrevHead: heads[i], Messages: []sequencer.Message{msgAt(c, heads[i]+1)}})
				}
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := s.Commit(cctx, bs)
				cancel()
				if err == nil {
					for i := range mine {
						heads[i]++
						acked[wkr*4+i]++
					}
					continue
				}
				// Not landed, or unknown: settle and re-read the truth.
				if serr := s.Settle(ctx); serr != nil {
					continue
				}
				for i, c := range mine {
					h, lerr := s.LoadHead(ctx, c)
					if lerr != nil {
						break
					}
					if h < heads[i] {
						errs <- fmt.Errorf("%s: head went back from %d to %d", c, heads[i], h)
						return
					}
					acked[wkr*4+i] += int(h - heads[i]) // landed after all
					heads[i] = h
				}
			}
		}()
	}
	// Let the load run, then move the shard under it.
	deadline := time.Now().Add(30 * time.Second)
	for s.DistStats().Direct < 20 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := s.Pool().Exec(ctx, `SELECT citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')`,
		shard, src.Host, src.Port, to.Host, to.Port); err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("move shard %d from %s to %s: %v", shard, from, to.Addr(), err)
	}
	movedAt := s.DistStats().Direct
	for {
		if _, w, _ := s.ShardOf(convs[0]); w == to.Addr() {
			break
		}
		if time.Now().After(deadline.Add(30 * time.Second)) {
			close(stop)
			wg.Wait()
			t.Fatalf("the store never learned the new placement of shard %d", shard)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for s.DistStats().Direct < movedAt+20 && time.Now().Before(deadline.Add(60*time.Second)) {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	total := 0
	for i, c := range convs {
		h, err := s.LoadHead(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := s.ReadRange(ctx, c, 0, int(h)+10)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(rows)) != h || int(h) != acked[i] {
			t.Fatalf("%s: head %d, %d rows, %d acknowledged", c, h, len(rows), acked[i])
		}
		for j, m := range rows {
			if m.Seq != uint64(j+1) {
				t.Fatalf("%s: seq %d at %d", c, m.Seq, j)
			}
		}
		total += int(h)
	}
	t.Logf("%d messages over the move; stats %+v", total, s.DistStats())
}

// A direct write (the shards' own tables on the worker) never lands in a
// shard that moved away: with the store's placements frozen, one of the
// three shards of a commit (written with the statements for all of the
// worker's shards) moved to the other worker, and its tables on the old
// worker kept from the deferred drop (an open reader holds them), the next
// commit still goes to the old worker, finds the shard gone there
// (metadata lock, then the placement check), writes nothing into the
// orphan tables and lands through Citus (from the old worker, on both);
// once the placements are reloaded, commits of the moved shard go straight
// to the new worker.
func TestCitusDirectWriteNeverLandsInAMovedShard(t *testing.T) {
	s, db := newCitusStore(t)
	ctx := context.Background()
	convs, from := convsOfWorker(t, s, "orphan", 6, 3) // shards A, B, C, A, B, C: one statement pair for all the worker's shards
	shard, _, _ := s.ShardOf(convs[0])
	var src, dst citustest.Node
	for _, w := range db.Workers {
		if w.Addr() == from {
			src = w
		} else {
			dst = w
		}
	}
	commit := func(prev uint64, convs ...string) error {
		var bs []persist.ConvBatch
		for _, c := range convs {
			bs = append(bs, persist.ConvBatch{ConvID: c, PrevHead: prev, Messages: []sequencer.Message{msgAt(c, prev+1)}})
		}
		return s.Commit(ctx, bs)
	}
	if err := commit(0, convs...); err != nil {
		t.Fatal(err)
	}
	s.stopRefresher() // the placements stay as they are
	s.dist.mu.RLock()
	moved := s.dist.shards[s.dist.shardOf(convs[0])]
	s.dist.mu.RUnlock()

	// Keep the old worker's tables of the moved shard from the deferred drop.
	old, err := pgx.Connect(ctx, src.DSN(db.Name))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close(ctx)
	if _, err := old.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	countOld := func() (rows, head int64) {
		t.Helper()
		if err := old.QueryRow(ctx, "SELECT count(*) FROM "+moved.msgTable.Sanitize()).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if err := old.QueryRow(ctx, "SELECT coalesce(max(head), 0) FROM "+moved.headTable.Sanitize()).Scan(&head); err != nil {
			t.Fatal(err)
		}
		return rows, head
	}
	rows0, head0 := countOld()
	if rows0 != 2 || head0 != 1 {
		t.Fatalf("old worker's shard before the move: %d rows, head %d", rows0, head0)
	}
	if _, err := s.Pool().Exec(ctx, `SELECT citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')`,
		shard, src.Host, src.Port, dst.Host, dst.Port); err != nil {
		t.Fatalf("move shard %d: %v", shard, err)
	}
	if _, w, _ := s.ShardOf(convs[0]); w != src.Addr() {
		t.Fatalf("the store's placements moved (%s) though frozen", w)
	}
	before := s.DistStats()
	if err := commit(1, convs...); err != nil {
		t.Fatalf("commit after the move, to the old worker: %v", err)
	}
	if st := s.DistStats(); st.Rerouted != before.Rerouted+1 {
		t.Fatalf("stats %+v (before %+v): want one rerouted commit", st, before)
	}
	if rows, head := countOld(); rows != rows0 || head != head0 {
		t.Fatalf("the orphan shard on the old worker was written: %d rows (was %d), head %d (was %d)", rows, rows0, head, head0)
	}
	for _, c := range convs {
		rows, err := s.ReadRange(ctx, c, 0, 10)
		if err != nil || len(rows) != 2 || rows[1].Seq != 2 {
			t.Fatalf("%s after the move: %v, %v", c, rows, err)
		}
		// LoadHead, still sent to the old worker, does not answer from
		// the orphan (head 1 there).
		if h, err := s.LoadHead(ctx, c); err != nil || h != 2 {
			t.Fatalf("LoadHead(%s) after the move: %d, %v; want 2", c, h, err)
		}
	}
	// Reloaded, the store writes the moved shard straight on the new worker.
	if err := s.loadPlacements(ctx); err != nil {
		t.Fatal(err)
	}
	if _, w, _ := s.ShardOf(convs[0]); w != dst.Addr() {
		t.Fatalf("placements after reload: %s, want %s", w, dst.Addr())
	}
	before = s.DistStats()
	if err := commit(2, convs[0], convs[3]); err != nil {
		t.Fatal(err)
	}
	if st := s.DistStats(); st.Rerouted != before.Rerouted || st.Direct != before.Direct+1 {
		t.Fatalf("stats %+v (before %+v): want one direct commit, none rerouted", st, before)
	}
	if h, err := s.LoadHead(ctx, convs[0]); err != nil || h != 3 {
		t.Fatalf("head %d, %v; want 3", h, err)
	}
}

// citusRole creates a login role with read and write rights on the
// tables (Citus creates it and the grants on the workers), dropped when the
// test ends (conv_head given back to postgres first, on the coordinator
// alone, where a test may have given it to the role).
func citusRole(t *testing.T, db *citustest.Database) string {
	t.Helper()
	ctx := context.Background()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	role := "seq_user_" + hex.EncodeToString(rnd[:])
	execDSN(t, db.DSN(), `CREATE ROLE `+role+` LOGIN`)
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, db.DSN())
		if err == nil {
			for _, q := range []string{`SET citus.enable_ddl_propagation TO off`, `ALTER TABLE conv_head OWNER TO postgres`,
				`RESET citus.enable_ddl_propagation`, `DROP OWNED BY ` + role, `DROP ROLE ` + role} {
				_, _ = c.Exec(ctx, q)
			}
			c.Close(ctx)
		}
	})
	execDSN(t, db.DSN(), `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO `+role)
	return role
}

// A store whose user does not own the tables (so lock_shard_metadata is not
// allowed) commits through Citus's own path on the worker, one shard per
// transaction, and stays correct.
func TestCitusNotOwnerCommitsThroughCitus(t *testing.T) {
	owner, db := newCitusStore(t)
	ctx := context.Background()
	role := citusRole(t, db)
	s := openStore(t, strings.Replace(db.DSN(), "postgres://postgres@", "postgres://"+role+"@", 1))
	if err := s.loadPlacements(ctx); err != nil {
		t.Fatal(err)
	}
	convs, _ := convsOfWorker(t, s, "notowner", 4, 2)
	if g0, g1 := s.CommitGroup(convs[0]), s.CommitGroup(convs[1]); g0 == g1 {
		t.Fatalf("commit groups %x %x: want one per shard without direct writes", g0, g1)
	}
	for r := uint64(0); r < 3; r++ {
		for _, c := range convs[:2] { // one shard each
			if err := s.Commit(ctx, []persist.ConvBatch{{ConvID: c, PrevHead: r, Messages: []sequencer.Message{msgAt(c, r+1)}}}); err != nil {
				t.Fatalf("round %d, %s: %v", r, c, err)
			}
		}
	}
	if st := s.DistStats(); st.Direct != 6 || st.Rerouted != 0 {
		t.Fatalf("stats %+v: want 6 commits on the workers", st)
	}
	for _, c := range convs[:2] {
		if h, err := owner.LoadHead(ctx, c); err != nil || h != 3 {
			t.Fatalf("%s: head %d, %v", c, h, err)
		}
		if h, err := s.LoadHead(ctx, c); err != nil || h != 3 {
			t.Fatalf("%s read by %s: head %d, %v", c, role, h, err)
		}
	}
}

// A worker that refuses the direct write's metadata lock (here: the
// coordinator shows the store's user as the tables' owner, the workers do
// not) costs the commit nothing but the attempt: it goes through Citus on
// the same connection and lands.
func TestCitusDirectWriteRefusedGoesThroughCitus(t *testing.T) {
	owner, db := newCitusStore(t)
	ctx := context.Background()
	role := citusRole(t, db)
	c, err := pgx.Connect(ctx, db.DSN())
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`SET citus.enable_ddl_propagation TO off`, `ALTER TABLE conv_head OWNER TO ` + role} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	c.Close(ctx)
	s := openStore(t, strings.Replace(db.DSN(), "postgres://postgres@", "postgres://"+role+"@", 1))
	if err := s.loadPlacements(ctx); err != nil {
		t.Fatal(err)
	}
	convs, _ := convsOfWorker(t, s, "refused", 2, 1)
	if !s.dist.directWrites() {
		t.Fatal("the store does not try direct writes: the test sets nothing up")
	}
	for r := uint64(0); r < 2; r++ {
		var bs []persist.ConvBatch
		for _, c := range convs {
			bs = append(bs, persist.ConvBatch{ConvID: c, PrevHead: r, Messages: []sequencer.Message{msgAt(c, r+1)}})
		}
		if err := s.Commit(ctx, bs); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
	}
	if st := s.DistStats(); st.Rerouted != 2 {
		t.Fatalf("stats %+v: want both commits refused on the worker and rerouted", st)
	}
	for _, c := range convs {
		if h, err := owner.LoadHead(ctx, c); err != nil || h != 2 {
			t.Fatalf("%s: head %d, %v", c, h, err)
		}
	}
}

// Large commits (COPY into the shard tables) of conversations in two
// shards of one worker go straight to it, conflicts included.
func TestCitusLargeCommitDirect(t *testing.T) {
	s, _ := newCitusStore(t)
	convs, _ := convsOfWorker(t, s, "big", 3, 3)
	storetest.LargeCommits(t, s, convs, 500) // 1,500 rows: COPY
	if st := s.DistStats(); st.Direct != 3 || st.ViaCoordinator != 0 || st.Rerouted != 0 {
		t.Fatalf("stats %+v: want 3 direct commits", st)
	}
}

// The membership conformance suite on Citus: the control tables are plain
// coordinator tables.
func TestCitusClusterConformance(t *testing.T) {
	citustest.Require(t)
	membershiptest.Run(t, func(t *testing.T, clk *clock.Fake) membership.Store {
		s, _ := newCitusStore(t)
		return s.Cluster().WithClock(clk)
	})
}

// A worker down: only the conversations of its shards fail (unavailable,
// nothing written), the other worker's keep committing; the worker comes
// back after a crash restart (pg_ctl -m immediate) and its conversations
// commit again, every acknowledged message there, no gap.
func TestCitusWorkerDownAndImmediateRestart(t *testing.T) {
	s, db := newCitusStore(t)
	ctx := context.Background()
	citustest.RequireStoppable(t, db)
	down := db.Workers[0]
	var onDown, onUp string
	for i := 0; onDown == "" || onUp == ""; i++ {
		c := fmt.Sprint("wd-", i)
		_, w, _ := s.ShardOf(c)
		if w == down.Addr() && onDown == "" {
			onDown = c
		} else if w != down.Addr() && onUp == "" {
			onUp = c
		}
	}
	heads := map[string]uint64{}
	commit := func(c string) error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := s.Commit(cctx, []persist.ConvBatch{{ConvID: c, PrevHead: heads[c], Messages: []sequencer.Message{msgAt(c, heads[c]+1)}}})
		if err == nil {
			heads[c]++
		}
		return err
	}
	for _, c := range []string{onDown, onUp} {
		if err := commit(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := citustest.PgCtl(down, "stop", "-m", "immediate"); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = citustest.PgCtl(down, "start")
		}
	}()
	for range 5 {
		if err := commit(onUp); err != nil {
			t.Fatalf("a conversation of the live worker: %v", err)
		}
	}
	// A pooled connection to the dead worker may take the batch and lose
	// the answer: unknown outcome, and Settle cannot tell while the worker
	// is down. The next commit finds no connection: unavailable.
	err := commit(onDown)
	if err == nil {
		t.Fatal("a commit to the stopped worker succeeded")
	}
	if persist.OutcomeOf(err) == persist.Unknown {
		if serr := s.Settle(ctx); serr == nil {
			t.Fatalf("Settle returned nil while the worker of the unknown commit (%v) is down", err)
		}
		err = commit(onDown)
	}
	if persist.OutcomeOf(err) != persist.NotLanded || !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("a conversation of the stopped worker: %v, want unavailable (not landed)", err)
	}
	if err := citustest.PgCtl(down, "start"); err != nil {
		t.Fatal(err)
	}
	restarted = true
	deadline := time.Now().Add(60 * time.Second)
	for {
		// The truth after the unknown commit: settle, then re-read.
		if err := s.Settle(ctx); err == nil {
			if h, err := s.LoadHead(ctx, onDown); err == nil {
				heads[onDown] = h
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the restarted worker never answered")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		err := commit(onDown)
		if err == nil {
			break
		}
		if persist.OutcomeOf(err) != persist.NotLanded {
			if serr := s.Settle(ctx); serr == nil {
				if h, lerr := s.LoadHead(ctx, onDown); lerr == nil {
					heads[onDown] = h
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted worker's conversation never committed again: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for c, h := range heads {
		stored, err := s.LoadHead(ctx, c)
		if err != nil || stored != h {
			t.Fatalf("%s: stored head %d (%v), acknowledged %d", c, stored, err, h)
		}
		rows, err := s.ReadRange(ctx, c, 0, 100)
		if err != nil || uint64(len(rows)) != h {
			t.Fatalf("%s: %d rows (%v), head %d", c, len(rows), err, h)
		}
	}
}

// The coordinator restarts (-m immediate) under a node with fenced commits:
// commits and single-shard reads keep going on the workers meanwhile (the
// lease cache and the placements are kept; nothing of a commit reads the
// coordinator), and the lease cache is refreshed once it is back.
func TestCitusCoordinatorRestart(t *testing.T) {
	s, db := newCitusStore(t)
	ctx := context.Background()
	citustest.RequireStoppable(t, db)
	f := persist.Fence{Partition: 2, Owner: "node-a", Epoch: 1}
	if err := s.PutPartitionLeaseForTest(ctx, f); err != nil {
		t.Fatal(err)
	}
	convs, _ := convsOfShard(t, s, "coord", 3)
	heads := map[string]uint64{}
	commit := func() error {
		var bs []persist.ConvBatch
		for _, c := range convs {
			bs = append(bs, persist.ConvBatch{ConvID: c, PrevHead: heads[c], Fence: f, Messages: []sequencer.Message{msgAt(c, heads[c]+1)}})
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := s.Commit(cctx, bs)
		if err == nil {
			for _, c := range convs {
				heads[c]++
			}
		}
		return err
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	if err := citustest.PgCtl(db.Coordinator, "stop", "-m", "immediate"); err != nil {
		t.Fatal(err)
	}
	up := false
	defer func() {
		if !up {
			_ = citustest.PgCtl(db.Coordinator, "start")
		}
	}()
	// A refresh of the lease cache fails now; the cached copy is kept.
	if l, _, err := s.leaseView(ctx, true); err != nil || l[2] != f {
		t.Fatalf("lease cache with the coordinator down: %v, %v", l, err)
	}
	for i := range 10 {
		if err := commit(); err != nil {
			t.Fatalf("commit %d with the coordinator down: %v", i, err)
		}
	}
	if h, err := s.LoadHead(ctx, convs[0]); err != nil || h != heads[convs[0]] {
		t.Fatalf("LoadHead with the coordinator down: %d, %v", h, err)
	}
	if err := citustest.PgCtl(db.Coordinator, "start"); err != nil {
		t.Fatal(err)
	}
	up = true
	// A lease change after the restart is seen (the cache refreshes).
	if err := s.PutPartitionLeaseForTestRetry(ctx, persist.Fence{Partition: 2, Owner: "node-b", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	if err := commit(); !errors.Is(err, sequencer.ErrStaleEpoch) {
		t.Fatalf("commit with the old fence after the coordinator came back: %v, want stale", err)
	}
	for _, c := range convs {
		rows, err := s.ReadRange(ctx, c, 0, 100)
		if err != nil || uint64(len(rows)) != heads[c] {
			t.Fatalf("%s: %d rows (%v), head %d", c, len(rows), err, heads[c])
		}
	}
}

// PutPartitionLeaseForTestRetry is PutPartitionLeaseForTest, retried while
// the server comes back (at most 30 s).
func (s *Store) PutPartitionLeaseForTestRetry(ctx context.Context, f persist.Fence) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.PutPartitionLeaseForTest(ctx, f)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The lease cache is kept when a refresh fails on a connection the
// coordinator closed (a restart, a crash): the statement is a cached
// prepared one, so the failure shows in the rows' error, not in Query's
// (TestCitusCoordinatorRestart failed that way about once in seven runs).
// The background refresher is stopped and the control pool has one
// connection, so the refresh below runs on the broken one.
func TestCitusLeaseCacheKeptOnABrokenConnection(t *testing.T) {
	_, db := newCitusStore(t)
	ctx := context.Background()
	s := openStoreWith(t, db.DSN(), Options{Options: postgres.Options{ControlConns: 1}})
	s.stopRefresher()
	f := persist.Fence{Partition: 3, Owner: "node-a", Epoch: 1}
	if err := s.PutPartitionLeaseForTest(ctx, f); err != nil {
		t.Fatal(err)
	}
	if l, _, err := s.leaseView(ctx, true); err != nil || l[3] != f {
		t.Fatalf("lease view: %v, %v", l, err)
	}
	var pid uint32
	if err := s.ControlPool().AcquireFunc(ctx, func(c *pgxpool.Conn) error { pid = c.Conn().PgConn().PID(); return nil }); err != nil {
		t.Fatal(err)
	}
	execDSN(t, db.DSN(), fmt.Sprintf(`SELECT pg_terminate_backend(%d, 5000)`, pid))
	if l, _, err := s.leaseView(ctx, true); err != nil || l[3] != f {
		t.Fatalf("lease view after the coordinator closed the control connection: %v, %v; want the cached copy", l, err)
	}
	if l, _, err := s.leaseView(ctx, true); err != nil || l[3] != f {
		t.Fatalf("lease view on a new connection: %v, %v", l, err)
	}
}
