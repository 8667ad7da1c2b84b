package citus_test

import (
	"context"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/citus"
	"github.com/sequencer-im/sequencer/persist/citustest"
	"github.com/sequencer-im/sequencer/persist/storetest"
)

// newStore opens a migrated Citus store on a fresh Citus database.
func newStore(t testing.TB) (*citus.Store, *citustest.Database) {
	t.Helper()
	ctx := context.Background()
	db := citustest.NewDatabase(t)
	s, err := citus.Open(ctx, db.DSN(), citus.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s, db
}

// hooked is a Citus store with the conformance suite's test hooks.
type hooked struct{ *citus.Store }

var _ storetest.Hooks = hooked{}

// PutPartitionLeaseForTest writes the lease on the coordinator, then waits
// out the store's lease cache (citus.LeaseTTL), so that the next commit
// sees the lease as written.
func (h hooked) PutPartitionLeaseForTest(ctx context.Context, f persist.Fence) error {
	_, err := h.Pool().Exec(ctx, `INSERT INTO partition_lease (partition, owner, epoch) VALUES ($1, $2, $3)
		ON CONFLICT (partition) DO UPDATE SET owner = EXCLUDED.owner, epoch = EXCLUDED.epoch`,
		int64(f.Partition), f.Owner, int64(f.Epoch))
	time.Sleep(citus.LeaseTTL + 20*time.Millisecond)
	return err
}

func (h hooked) SetHeadForTest(ctx context.Context, convID string, head uint64) error {
	_, err := h.Pool().Exec(ctx, `INSERT INTO conv_head (conv_id, head) VALUES ($1, $2)
		ON CONFLICT (conv_id) DO UPDATE SET head = EXCLUDED.head`, convID, int64(head))
	return err
}

func TestCitusConformance(t *testing.T) {
	citustest.Require(t)
	storetest.Run(t, func(t *testing.T) persist.Store {
		s, _ := newStore(t)
		return hooked{s}
	})
}
