package citus_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/sequencer-im/sequencer/persist/citus"
	"github.com/sequencer-im/sequencer/persist/citustest"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	citustest.Stop()
	pgtest.Stop()
	os.Exit(code)
}

// Open refuses a database without the citus extension.
func TestOpenPlainPostgres(t *testing.T) {
	_, err := citus.Open(context.Background(), pgtest.NewDatabase(t), citus.Options{})
	if !errors.Is(err, citus.ErrNotDistributed) {
		t.Fatalf("Open on plain PostgreSQL: %v, want ErrNotDistributed", err)
	}
}

// The shard and worker views (persist.Sharded) on a migrated Citus store:
// every shard on a worker of the cluster, every worker reachable.
func TestCitusViews(t *testing.T) {
	ctx := context.Background()
	s, db := newStore(t)
	want := map[string]bool{}
	for _, w := range db.Workers {
		want[w.Addr()] = true
	}
	addrs := s.CitusWorkerAddrs()
	if len(addrs) != len(want) {
		t.Fatalf("CitusWorkerAddrs = %v, want the %d workers", addrs, len(want))
	}
	for _, a := range addrs {
		if !want[a] {
			t.Fatalf("CitusWorkerAddrs names %s, not a worker", a)
		}
	}
	shards, workers, err := s.CitusShards(ctx)
	if err != nil {
		t.Fatalf("CitusShards: %v", err)
	}
	if len(shards) == 0 || len(workers) != len(want) {
		t.Fatalf("CitusShards: %d shards, %d workers", len(shards), len(workers))
	}
	for _, sh := range shards {
		if !want[sh.Worker] || !sh.Known || len(sh.Tables) != 3 {
			t.Fatalf("shard %+v", sh)
		}
	}
	ws, err := s.CitusWorkers(ctx)
	if err != nil {
		t.Fatalf("CitusWorkers: %v", err)
	}
	for _, w := range ws {
		if !w.Reachable || w.Shards == 0 {
			t.Fatalf("worker %+v", w)
		}
	}
}
