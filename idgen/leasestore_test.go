package idgen

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// leaseStore is a memstore (the worker-lease rules of the real stores,
// which are exercised in store_test.go) with failure injection and a record
// of the calls, for the fast tests.
type leaseStore struct {
	*memstore.Store

	mu    sync.Mutex
	down  bool // every lease call fails with ErrStoreUnavailable
	hang  bool // every lease call waits for its context (a blackholed link)
	calls map[string]int
	// released lists the lastMs of every ReleaseWorker call.
	released []int64
}

var _ persist.WorkerLeases = (*leaseStore)(nil)

func newLeaseStore() *leaseStore {
	return &leaseStore{Store: memstore.New(), calls: map[string]int{}}
}

func (m *leaseStore) setDown(down bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down = down
}

func (m *leaseStore) count(call string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[call]
}

func (m *leaseStore) setHang(hang bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hang = hang
}

func (m *leaseStore) enter(ctx context.Context, call string) error {
	m.mu.Lock()
	m.calls[call]++
	down, hang := m.down, m.hang
	m.mu.Unlock()
	if hang {
		<-ctx.Done()
		return fmt.Errorf("leaseStore %s: %w (%w)", call, sequencer.ErrStoreUnavailable, ctx.Err())
	}
	if down {
		return fmt.Errorf("leaseStore %s: %w", call, sequencer.ErrStoreUnavailable)
	}
	return nil
}

func (m *leaseStore) AcquireWorker(ctx context.Context, holder string, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	if err := m.enter(ctx, "acquire"); err != nil {
		return persist.WorkerLease{}, err
	}
	return m.Store.AcquireWorker(ctx, holder, now, ttl)
}

func (m *leaseStore) RenewWorker(ctx context.Context, l persist.WorkerLease, lastMs int64, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	if err := m.enter(ctx, "renew"); err != nil {
		return persist.WorkerLease{}, err
	}
	return m.Store.RenewWorker(ctx, l, lastMs, now, ttl)
}

func (m *leaseStore) ReleaseWorker(ctx context.Context, l persist.WorkerLease, lastMs int64) error {
	if err := m.enter(ctx, "release"); err != nil {
		return err
	}
	m.mu.Lock()
	m.released = append(m.released, lastMs)
	m.mu.Unlock()
	return m.Store.ReleaseWorker(ctx, l, lastMs)
}

// steal gives worker id to another holder, as if our lease had expired and
// been taken over (the next renew fails with ErrWorkerLeaseLost).
func (m *leaseStore) steal(id int, now time.Time, ttl time.Duration) {
	w := m.Worker(id)
	w.Holder, w.Expires = "thief", now.Add(ttl)
	m.PutWorkerLeaseForTest(w)
}

// seed stores a free row for id with lastMs, as a previous holder left it.
func (m *leaseStore) seed(id int, lastMs int64) {
	m.PutWorkerLeaseForTest(persist.WorkerLease{WorkerID: id, Holder: "previous", LastMs: lastMs})
}

// onlyIDs leaves ids 0..n-1 to the test: every higher id is leased
// elsewhere for good.
func (m *leaseStore) onlyIDs(n int) {
	for id := n; id <= MaxWorkerID; id++ {
		m.PutWorkerLeaseForTest(persist.WorkerLease{WorkerID: id, Holder: "elsewhere", Expires: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)})
	}
}
