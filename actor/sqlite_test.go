package actor

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/sqlite"
)

// openSQLite returns a migrated persist/sqlite store in a temporary file.
func openSQLite(tb testing.TB) persist.Store {
	tb.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(tb.TempDir(), "seq.db"), sqlite.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	return st
}

func TestProofSQLite(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			runProof(t, openSQLite(t), proofConfig{Seed: seed, Convs: 120, Senders: 32, PerSender: 30, Rates: proofRates})
		})
	}
}

func BenchmarkSendSQLite(b *testing.B) { benchStores(b, openSQLite) }
