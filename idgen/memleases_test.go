package idgen

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// memLeases is an in-memory persist.WorkerLeases with the interface's rules,
// plus failure injection, for the fast tests. The real stores are exercised
// in store_test.go.
type memLeases struct {
	mu    sync.Mutex
	ids   int // how many worker ids exist (1024 unless a test shrinks it)
	rows  map[int]*memLease
	token uint64
	down  bool // every call fails with ErrStoreUnavailable
	calls map[string]int
	// released lists the lastMs of every ReleaseWorker call.
	released []int64
}

type memLease struct {
	holder  string
	token   uint64
	expires time.Time // zero: free
	lastMs  int64
}

var _ persist.WorkerLeases = (*memLeases)(nil)

func newMemLeases() *memLeases {
	return &memLeases{ids: MaxWorkerID + 1, rows: map[int]*memLease{}, calls: map[string]int{}}
}

func (m *memLeases) setDown(down bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down = down
}

func (m *memLeases) count(call string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[call]
}

// row returns a copy of worker id's row.
func (m *memLeases) row(id int) memLease {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.rows[id]; r != nil {
		return *r
	}
	return memLease{}
}

func (m *memLeases) enter(call string) error {
	m.calls[call]++
	if m.down {
		return fmt.Errorf("memleases %s: %w", call, sequencer.ErrStoreUnavailable)
	}
	return nil
}

func (m *memLeases) AcquireWorker(ctx context.Context, holder string, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("acquire"); err != nil {
		return persist.WorkerLease{}, err
	}
	// Like the real stores: the free id with the lowest lastMs, then the
	// lowest id.
	best := -1
	for id := 0; id < m.ids; id++ {
		r := m.rows[id]
		if r == nil {
			r = &memLease{}
			m.rows[id] = r
		}
		if !r.expires.IsZero() && !r.expires.Before(now) {
			continue // live
		}
		if best < 0 || r.lastMs < m.rows[best].lastMs {
			best = id
		}
	}
	if best >= 0 {
		r := m.rows[best]
		m.token++
		r.holder, r.token, r.expires = holder, m.token, now.Add(ttl)
		return persist.WorkerLease{WorkerID: best, Holder: holder, Token: r.token, Expires: r.expires, LastMs: r.lastMs}, nil
	}
	return persist.WorkerLease{}, fmt.Errorf("memleases: all %d worker ids are leased: %w", m.ids, sequencer.ErrWorkerLeaseLost)
}

func (m *memLeases) RenewWorker(ctx context.Context, l persist.WorkerLease, lastMs int64, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("renew"); err != nil {
		return persist.WorkerLease{}, err
	}
	r := m.rows[l.WorkerID]
	if r == nil || r.token != l.Token || r.expires.IsZero() || r.expires.Before(now) {
		return persist.WorkerLease{}, fmt.Errorf("memleases: worker %d token %d: %w", l.WorkerID, l.Token, sequencer.ErrWorkerLeaseLost)
	}
	r.expires = now.Add(ttl)
	r.lastMs = max(r.lastMs, lastMs)
	l.Expires, l.LastMs = r.expires, r.lastMs
	return l, nil
}

func (m *memLeases) ReleaseWorker(ctx context.Context, l persist.WorkerLease, lastMs int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("release"); err != nil {
		return err
	}
	m.released = append(m.released, lastMs)
	r := m.rows[l.WorkerID]
	if r == nil {
		return nil
	}
	// Like the real stores: if still ours, free it and set lastMs (the
	// unused reservation is given back); a stale release only raises it.
	if r.token == l.Token && !r.expires.IsZero() {
		r.lastMs, r.expires = lastMs, time.Time{}
	} else {
		r.lastMs = max(r.lastMs, lastMs)
	}
	return nil
}

// steal gives worker id to another holder, as if our lease had expired and
// been taken over (the next renew fails with ErrWorkerLeaseLost).
func (m *memLeases) steal(id int, now time.Time, ttl time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.rows[id]
	if r == nil {
		r = &memLease{}
		m.rows[id] = r
	}
	m.token++
	r.holder, r.token, r.expires = "thief", m.token, now.Add(ttl)
}

// seed stores a free row for id with lastMs, as a previous holder left it.
func (m *memLeases) seed(id int, lastMs int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rows[id] = &memLease{holder: "previous", lastMs: lastMs}
}
