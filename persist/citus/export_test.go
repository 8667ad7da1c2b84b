package citus

import (
	"context"
	"testing"

	"github.com/sequencer-im/sequencer/persist"
)

// Test hooks: used only by this package's tests.

// openStore opens a store on the Citus database at dsn (not migrated),
// closed when the test ends.
func openStore(t testing.TB, dsn string) *Store {
	t.Helper()
	return openStoreWith(t, dsn, Options{})
}

func openStoreWith(t testing.TB, dsn string, opts Options) *Store {
	t.Helper()
	s, err := Open(context.Background(), dsn, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// PutPartitionLeaseForTest writes a lease on the coordinator and drops the
// store's lease cache, so that its next commit reads the lease as written.
func (s *Store) PutPartitionLeaseForTest(ctx context.Context, f persist.Fence) error {
	_, err := s.Pool().Exec(ctx, `INSERT INTO partition_lease (partition, owner, epoch) VALUES ($1, $2, $3)
		ON CONFLICT (partition) DO UPDATE SET owner = EXCLUDED.owner, epoch = EXCLUDED.epoch`,
		int64(f.Partition), f.Owner, int64(f.Epoch))
	s.forgetLeases()
	return err
}

// stopRefresher stops the background refresher: the placements stay as
// loaded (until loadPlacements), the lease cache is re-read only by
// commits.
func (s *Store) stopRefresher() {
	if s.dist.stop != nil {
		s.dist.stop()
		<-s.dist.stopped
		s.dist.stop = nil
	}
}

// routeOnly makes commits take Citus's own path (as when the store's user
// does not own the tables) or, off, direct writes again; it stops the
// refresher, whose reloads would set the ownership back.
func (s *Store) routeOnly(on bool) {
	s.stopRefresher()
	s.dist.mu.Lock()
	s.dist.ownsTables = !on
	s.dist.mu.Unlock()
}
