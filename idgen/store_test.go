package idgen

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/persist/postgres"
	"github.com/sequencer-im/sequencer/persist/sqlite"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// realStores opens each real WorkerLeases implementation on fresh storage.
var realStores = []struct {
	name string
	open func(t *testing.T) persist.WorkerLeases
}{
	{"postgres", func(t *testing.T) persist.WorkerLeases {
		ctx := context.Background()
		s, err := postgres.Open(ctx, pgtest.NewDatabase(t), postgres.Options{MaxConns: 4})
		if err != nil {
			t.Fatalf("open postgres: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("migrate postgres: %v", err)
		}
		return s
	}},
	{"sqlite", func(t *testing.T) persist.WorkerLeases {
		ctx := context.Background()
		s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "sequencer.db"), sqlite.Options{})
		if err != nil {
			t.Fatalf("open sqlite: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("migrate sqlite: %v", err)
		}
		return s
	}},
}

// realStart is a fake-clock start near real time, on a millisecond (the
// stores keep lease ends with millisecond precision).
func realStart() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }

// issueReserved issues an id and checks it is within the reservation the
// store returned at the last renew.
func issueReserved(t *testing.T, l *Issuer) uint64 {
	t.Helper()
	id, err := l.Next()
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	held, ok := l.Held()
	ts, w, _ := Decode(id)
	if !ok || w != held.WorkerID || ts.UnixMilli() > held.LastMs {
		t.Fatalf("id %d (worker %d, ms %d) outside the stored lease %+v (held %v)", id, w, ts.UnixMilli(), held, ok)
	}
	return id
}

// TestLeaseRealStoresTwoHolders: two holders on one store lease different
// worker ids and never issue the same id, even issuing concurrently.
func TestLeaseRealStoresTwoHolders(t *testing.T) {
	for _, rs := range realStores {
		t.Run(rs.name, func(t *testing.T) {
			store := rs.open(t)
			clk := clock.NewFake(realStart())
			leases := []*Issuer{newFakeClockLease(t, store, "node-a", clk, nil), newFakeClockLease(t, store, "node-b", clk, nil)}
			for _, l := range leases {
				mustRenew(t, l)
				t.Cleanup(func() { l.Close(context.Background()) })
			}
			wa, _ := leases[0].WorkerID()
			wb, _ := leases[1].WorkerID()
			if wa == wb {
				t.Fatalf("both holders leased worker id %d", wa)
			}
			const each = 6000 // crosses milliseconds on the fake clock
			out := make([][]uint64, len(leases))
			var wg sync.WaitGroup
			for i, l := range leases {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						id, err := l.Next()
						if err != nil {
							t.Error(err)
							return
						}
						out[i] = append(out[i], id)
					}
				}()
			}
			wg.Wait()
			seen := map[uint64]bool{}
			for _, ids := range out {
				for _, id := range ids {
					if seen[id] {
						t.Fatalf("id %d issued twice", id)
					}
					seen[id] = true
				}
			}
			if len(seen) != 2*each {
				t.Fatalf("%d distinct ids, want %d", len(seen), 2*each)
			}
		})
	}
}

// TestLeaseRealStoresTakeover: a holder crashes; a successor takes its
// worker id only after the lease expired, inherits a LastMs at or above every
// id the crashed holder issued, and continues above them; the zombie stops.
// Then a restart with a clock a minute back refuses to issue.
func TestLeaseRealStoresTakeover(t *testing.T) {
	for _, rs := range realStores {
		t.Run(rs.name, func(t *testing.T) {
			ctx := context.Background()
			store := rs.open(t)
			start := realStart()
			clk := clock.NewFake(start)
			a := newFakeClockLease(t, store, "node-a", clk, nil)
			mustRenew(t, a)
			wa, _ := a.WorkerID()

			// Every other worker id is live for an hour, so a successor
			// can only get a's id.
			fillers := 0
			for {
				_, err := store.AcquireWorker(ctx, "filler", start, time.Hour)
				if errors.Is(err, sequencer.ErrWorkerLeaseLost) {
					break
				}
				if err != nil {
					t.Fatalf("filler acquire: %v", err)
				}
				if fillers++; fillers > MaxWorkerID {
					t.Fatal("the store leased more than 1024 ids at once")
				}
			}
			if fillers != MaxWorkerID {
				t.Fatalf("filled %d ids, want %d", fillers, MaxWorkerID)
			}

			var maxA uint64
			for i := 0; i < 12; i++ {
				if i%4 == 3 {
					mustRenew(t, a)
				}
				for j := 0; j < 50; j++ {
					maxA = max(maxA, issueReserved(t, a))
				}
				clk.Advance(500 * time.Millisecond)
			}
			heldA, _ := a.Held()
			tsA, _, _ := Decode(maxA)
			// a crashes here: no Close.

			b := newFakeClockLease(t, store, "node-b", clk, nil)
			if err := b.RenewOnce(ctx); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
				t.Fatalf("b acquired while a's lease is live: %v", err)
			}
			clk.Set(heldA.Expires.Add(time.Millisecond))
			mustRenew(t, b)
			if w, _ := b.WorkerID(); w != wa {
				t.Fatalf("b leased worker %d, want a's %d", w, wa)
			}
			if b.inherited < tsA.UnixMilli() || b.inherited < heldA.LastMs {
				t.Fatalf("b inherited LastMs %d; a issued up to ms %d and reserved %d", b.inherited, tsA.UnixMilli(), heldA.LastMs)
			}
			var lastB uint64
			for i := 0; i < 100; i++ {
				id := issueReserved(t, b)
				if id <= maxA || id <= lastB {
					t.Fatalf("b issued %d (a's max %d, b's previous %d)", id, maxA, lastB)
				}
				lastB = id
			}

			// a wakes up as a zombie: its renew fails and it stops.
			if err := a.RenewOnce(ctx); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
				t.Fatalf("zombie renew: %v", err)
			}
			wantLeaseLost(t, a)

			// b shuts down cleanly; c restarts with its clock a minute
			// back, gets the same id (the only free one) and refuses.
			if err := b.Close(ctx); err != nil {
				t.Fatalf("b close: %v", err)
			}
			tsB, _, _ := Decode(lastB)
			back := clock.NewFake(clk.Now().Add(-time.Minute))
			c := newFakeClockLease(t, store, "node-c", back, nil)
			mustRenew(t, c)
			if w, _ := c.WorkerID(); w != wa {
				t.Fatalf("c leased worker %d, want the released %d", w, wa)
			}
			if c.inherited < tsB.UnixMilli() {
				t.Fatalf("c inherited LastMs %d below b's last id ms %d", c.inherited, tsB.UnixMilli())
			}
			if id, err := c.Next(); !errors.Is(err, sequencer.ErrClockMovedBackwards) {
				t.Fatalf("restart a minute back: Next = %d, %v", id, err)
			}
			// Once c's clock passes what the store recorded, ids resume above b's.
			back.Set(time.UnixMilli(c.inherited + 1))
			mustRenew(t, c)
			if id := issueReserved(t, c); id <= lastB {
				t.Fatalf("c issued %d, not above b's %d", id, lastB)
			}
			if err := c.Close(ctx); err != nil {
				t.Fatalf("c close: %v", err)
			}
		})
	}
}

// TestLeaseClockBehindTheStore: a node whose clock is an hour behind the
// store's (PostgreSQL's clock_timestamp) gets a lease but refuses to issue
// ids (retryably, counted) and is not ready; a node whose clock matches the
// store's issues at once. On the embedded store (no clock of its own) a
// restart with a clock an hour behind this machine's earlier runs is caught
// by the history check instead.
func TestLeaseClockBehindTheStore(t *testing.T) {
	ctx := context.Background()
	t.Run("postgres clock", func(t *testing.T) {
		store := realStores[0].open(t)
		m := metrics.New()
		behind := clock.NewFake(time.Now().Add(-time.Hour))
		l, err := NewIssuer(store, IssuerConfig{Holder: "slow", Clock: behind, Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		mustRenew(t, l)
		if _, err := l.Next(); !errors.Is(err, sequencer.ErrClockMovedBackwards) || sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
			t.Fatalf("Next with a clock an hour behind the store: %v, want a retryable clock-moved-backwards", err)
		}
		if l.CanIssue() {
			t.Fatal("a node whose clock is an hour behind the store reports ready")
		}
		if n := counterValue(t, m.ClockRollbacks.WithLabelValues("refused")); n == 0 {
			t.Fatal("the refusal was not counted")
		}
		good, err := NewIssuer(store, IssuerConfig{Holder: "good"})
		if err != nil {
			t.Fatal(err)
		}
		mustRenew(t, good)
		if _, err := good.Next(); err != nil {
			t.Fatalf("a node on the store's time: %v", err)
		}
		_ = good.Close(ctx)
		_ = l.Close(ctx)
	})
	t.Run("sqlite history", func(t *testing.T) {
		store := realStores[1].open(t)
		clk := clock.NewFake(realStart())
		a := newFakeClockLease(t, store, "node-a", clk, nil)
		mustRenew(t, a)
		if _, err := a.Next(); err != nil {
			t.Fatal(err)
		}
		// a keeps its id (crashed: no release); a restart an hour back gets
		// another id, whose own history is empty, and still refuses.
		back := clock.NewFake(clk.Now().Add(-time.Hour))
		b := newFakeClockLease(t, store, "node-a-restarted", back, nil)
		mustRenew(t, b)
		wa, _ := a.WorkerID()
		if wb, _ := b.WorkerID(); wb == wa {
			t.Fatalf("the restart got the live id %d", wa)
		}
		if _, err := b.Next(); !errors.Is(err, sequencer.ErrClockMovedBackwards) {
			t.Fatalf("restart an hour back on another worker id: %v, want clock moved backwards", err)
		}
	})
}
