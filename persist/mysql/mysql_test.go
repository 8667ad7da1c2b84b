package mysql

import (
	"context"
	"testing"

	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/membership/membershiptest"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/mysqltest"
	"github.com/sequencer-im/sequencer/persist/storetest"
)

func TestMain(m *testing.M) { mysqltest.Main(m) }

// Test-only hooks for the conformance suite.
var _ storetest.Hooks = (*Store)(nil)

func (s *Store) PutPartitionLeaseForTest(ctx context.Context, f persist.Fence) error {
	_, err := s.read.ExecContext(ctx, "INSERT INTO partition_lease (`partition`, owner, epoch) VALUES (?, ?, ?) "+
		"ON DUPLICATE KEY UPDATE owner = VALUES(owner), epoch = VALUES(epoch)", f.Partition, f.Owner, f.Epoch)
	return err
}

func (s *Store) SetHeadForTest(ctx context.Context, convID string, head uint64) error {
	_, err := s.read.ExecContext(ctx, `INSERT INTO conv_head (conv_id, head) VALUES (?, ?)
		ON DUPLICATE KEY UPDATE head = VALUES(head)`, convID, head)
	return err
}

func openStore(t testing.TB, url string, opts Options) *Store {
	t.Helper()
	s, err := Open(context.Background(), url, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newStore returns a migrated store on a fresh database.
func newStore(t testing.TB) (*Store, string) {
	t.Helper()
	url := mysqltest.NewDatabase(t)
	s := openStore(t, url, Options{})
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s, url
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) persist.Store {
		s, _ := newStore(t)
		return s
	})
}

func TestClusterConformance(t *testing.T) {
	membershiptest.Run(t, func(t *testing.T, clk *clock.Fake) membership.Store {
		s, _ := newStore(t)
		return s.Cluster().WithClock(clk)
	})
}
