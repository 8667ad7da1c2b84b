package actor

import (
	"context"
	"fmt"
	"testing"

	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// openPostgres returns a migrated persist/postgres store on a fresh
// database (dropped when tb ends).
func openPostgres(tb testing.TB) persist.Store {
	tb.Helper()
	ctx := context.Background()
	st, err := postgres.Open(ctx, pgtest.NewDatabase(tb), postgres.Options{MaxConns: 12})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	return st
}

func TestProofPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("PostgreSQL proof skipped in -short")
	}
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			runProof(t, openPostgres(t), proofConfig{Seed: seed, Convs: 120, Senders: 32, PerSender: 30, Rates: proofRates})
		})
	}
}

func BenchmarkSendPostgres(b *testing.B) { benchStores(b, openPostgres) }
