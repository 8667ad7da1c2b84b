package citus_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/citus"
)

var atomicID atomic.Uint64

// sent is conv's batch after prev: one message of uid, the own-send rule
// and the outbox (partition 3) on.
func sent(conv string, prev, uid uint64) persist.ConvBatch {
	id := atomicID.Add(1)
	m := sequencer.Message{MsgID: id, ConvID: conv, Seq: prev + 1, FromUID: uid, MsgType: 1, Body: []byte("b"),
		ClientMsgID: fmt.Sprint("atomic-", id), ServerAt: time.Now()}
	return persist.ConvBatch{ConvID: conv, PrevHead: prev, Messages: []sequencer.Message{m},
		MarkSendersRead: true, Outbox: persist.OutboxMark{On: true, Partition: 3}}
}

// convOn returns a conversation whose shard is on worker (seeded by name),
// or on any other worker when other.
func convOn(t *testing.T, s *citus.Store, name, worker string, other bool) string {
	t.Helper()
	for i := 0; ; i++ {
		c := fmt.Sprintf("%s/%d", name, i)
		_, w, ok := s.ShardOf(c)
		if !ok {
			t.Fatal("no placements")
		}
		if (w == worker) != other {
			return c
		}
	}
}

// failOn makes every write of table's shard holding conv fail, on the
// worker holding it (a trigger on the shard table: direct writes and
// Citus's own path both end there), until the returned func is called.
func failOn(t *testing.T, s *citus.Store, table, conv string) (drop func()) {
	t.Helper()
	ctx := context.Background()
	var shard string
	if err := s.Pool().QueryRow(ctx, `SELECT shard_name($1::regclass, get_shard_id_for_distribution_column($1::regclass, $2::text))`,
		table, conv).Scan(&shard); err != nil {
		t.Fatal(err)
	}
	_, worker, _ := s.ShardOf(conv)
	// DDL on a worker's shard table, without Citus's propagation (it
	// refuses DDL on a worker otherwise).
	exec := func(qs ...string) {
		t.Helper()
		if err := s.OnWorker(ctx, worker, func(c *pgx.Conn) error {
			return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				for _, q := range append([]string{"SET LOCAL citus.enable_ddl_propagation TO off",
					"SET LOCAL citus.enable_manual_changes_to_shards TO on"}, qs...) {
					if _, err := tx.Exec(ctx, q); err != nil {
						return fmt.Errorf("%s: %w", q, err)
					}
				}
				return nil
			})
		}); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE OR REPLACE FUNCTION seq_test_fail() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'injected failure on %', TG_TABLE_NAME; END $$`,
		`CREATE TRIGGER seq_test_fail BEFORE INSERT OR UPDATE ON `+shard+` FOR EACH ROW EXECUTE FUNCTION seq_test_fail()`)
	return func() { exec(`DROP TRIGGER seq_test_fail ON ` + shard) }
}

func shardOf(t *testing.T, s *citus.Store, conv string) int64 {
	t.Helper()
	id, _, ok := s.ShardOf(conv)
	if !ok {
		t.Fatal("no placements")
	}
	return id
}

// The senders' read positions and the outbox rows are written in the
// commit's transaction on Citus, both on a worker directly (one worker's
// conversations) and through the coordinator (conversations of two
// workers): a failure of either write, injected after the messages and
// the heads were written in the same transaction, leaves nothing of the
// commit; without it, the commit leaves all of it.
func TestCitusMarksAndOutboxInTheCommit(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	seed := "atomic"
	_, w1, ok := s.ShardOf(seed)
	if !ok {
		t.Fatal("no placements")
	}
	nothing := func(conv string) {
		t.Helper()
		if h, err := s.LoadHead(ctx, conv); err != nil || h != 0 {
			t.Fatalf("head of %s after a failed commit: %d, %v; want 0", conv, h, err)
		}
		if ms, err := s.ReadRange(ctx, conv, 0, 10); err != nil || len(ms) != 0 {
			t.Fatalf("messages of %s after a failed commit: %v, %v; want none", conv, ms, err)
		}
		if ps, _, err := s.ReadPositionsPage(ctx, conv, 0, 10); err != nil || len(ps) != 0 {
			t.Fatalf("read positions of %s after a failed commit: %v, %v; want none", conv, ps, err)
		}
		rows, err := s.OutboxPending(ctx, 3, "", 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.ConvID == conv {
				t.Fatalf("outbox row of %s after a failed commit: %+v", conv, r)
			}
		}
	}
	all := func(conv string, head uint64) {
		t.Helper()
		if h, err := s.LoadHead(ctx, conv); err != nil || h != head {
			t.Fatalf("head of %s: %d, %v; want %d", conv, h, err, head)
		}
		st, err := s.ReadStates(ctx, 9, []string{conv})
		if err != nil || st[0].ReadSeq != head {
			t.Fatalf("sender's position in %s: %+v, %v; want %d", conv, st, err, head)
		}
		rows, err := s.OutboxPending(ctx, 3, "", 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.ConvID == conv {
				if r.Head != head || r.Published != 0 {
					t.Fatalf("outbox row of %s: %+v; want published 0, head %d", conv, r, head)
				}
				return
			}
		}
		t.Fatalf("no outbox row of %s (%+v)", conv, rows)
	}
	for _, table := range []string{"read_position", "feed_outbox"} {
		t.Run(table, func(t *testing.T) {
			// Direct: two conversations of worker 1.
			a, b := convOn(t, s, seed+"/"+table+"/a", w1, false), convOn(t, s, seed+"/"+table+"/b", w1, false)
			drop := failOn(t, s, table, b)
			before := s.DistStats()
			err := s.Commit(ctx, []persist.ConvBatch{sent(a, 0, 9), sent(b, 0, 9)})
			if err == nil || errors.Is(err, sequencer.ErrUnknownOutcome) {
				t.Fatalf("direct commit with a failing %s: %v, want a failure that landed nothing", table, err)
			}
			if got := s.DistStats(); got.Direct != before.Direct+1 || got.ViaCoordinator != before.ViaCoordinator {
				t.Fatalf("the commit did not go to the worker directly: %+v, before %+v", got, before)
			}
			nothing(a)
			nothing(b)
			// Through the coordinator: a conversation of each worker.
			c := convOn(t, s, seed+"/"+table+"/c", w1, true)
			before = s.DistStats()
			err = s.Commit(ctx, []persist.ConvBatch{sent(c, 0, 9), sent(b, 0, 9)})
			if err == nil || errors.Is(err, sequencer.ErrUnknownOutcome) {
				t.Fatalf("coordinator commit with a failing %s: %v, want a failure that landed nothing", table, err)
			}
			if got := s.DistStats(); got.ViaCoordinator != before.ViaCoordinator+1 {
				t.Fatalf("the commit did not go through the coordinator: %+v, before %+v", got, before)
			}
			nothing(b)
			nothing(c)
			// Direct, in more than two shards of worker 1 (one statement
			// for all of the worker's shards), b's shard failing.
			many := []string{b}
			seen := map[int64]bool{}
			for i := 0; len(many) < 4; i++ {
				d := convOn(t, s, fmt.Sprintf("%s/%s/many%d", seed, table, i), w1, false)
				if id, _, _ := s.ShardOf(d); !seen[id] && id != shardOf(t, s, b) {
					seen[id] = true
					many = append(many, d)
				}
			}
			var bs []persist.ConvBatch
			for _, d := range many {
				bs = append(bs, sent(d, 0, 9))
			}
			before = s.DistStats()
			if err := s.Commit(ctx, bs); err == nil || errors.Is(err, sequencer.ErrUnknownOutcome) {
				t.Fatalf("direct commit in %d shards with a failing %s: %v, want a failure that landed nothing", len(many), table, err)
			}
			if got := s.DistStats(); got.Direct != before.Direct+1 {
				t.Fatalf("the commit did not go to the worker directly: %+v, before %+v", got, before)
			}
			for _, d := range many {
				nothing(d)
			}
			drop()
			if err := s.Commit(ctx, bs[1:]); err != nil {
				t.Fatal(err)
			}
			for _, d := range many[1:] {
				all(d, 1)
			}
			if err := s.Commit(ctx, []persist.ConvBatch{sent(a, 0, 9), sent(b, 0, 9)}); err != nil {
				t.Fatal(err)
			}
			if err := s.Commit(ctx, []persist.ConvBatch{sent(c, 0, 9), sent(b, 1, 9)}); err != nil {
				t.Fatal(err)
			}
			all(a, 1)
			all(b, 2)
			all(c, 1)
		})
	}
}

// A Citus database migrated before migrations_citus/0008 has feed_outbox
// as a coordinator table (migrations/0008 as it is): Migrate distributes
// it, and commits then write their outbox rows on the workers directly.
func TestCitusMigrateDistributesTheOutbox(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	distributed := func() bool {
		t.Helper()
		var ok bool
		if err := s.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'feed_outbox'::regclass)`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !distributed() {
		t.Fatal("feed_outbox is not distributed after Migrate")
	}
	if _, err := s.Pool().Exec(ctx, `SELECT undistribute_table('feed_outbox')`); err != nil {
		t.Fatal(err)
	}
	if distributed() {
		t.Fatal("undistribute_table left feed_outbox distributed: the test sets nothing up")
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if !distributed() {
		t.Fatal("Migrate left feed_outbox a coordinator table")
	}
	c := "upgraded"
	before := s.DistStats()
	if err := s.Commit(ctx, []persist.ConvBatch{sent(c, 0, 9)}); err != nil {
		t.Fatal(err)
	}
	if got := s.DistStats(); got.Direct != before.Direct+1 {
		t.Fatalf("the commit did not go to the worker directly: %+v, before %+v", got, before)
	}
	rows, err := s.OutboxPending(ctx, 3, "", 10)
	if err != nil || len(rows) != 1 || rows[0].ConvID != c || rows[0].Head != 1 {
		t.Fatalf("outbox after the commit: %+v, %v", rows, err)
	}
}
