package actor

import "sync"

// floors remembers, for conversations whose actor stopped, the highest seq
// this node acked, so the next actor of the conversation can tell a store
// that went backwards (conv.Config.Floor). It is bounded: past max entries
// the oldest are forgotten (FIFO), which only weakens the check for those
// conversations; the store itself never depends on it.
type floors struct {
	mu    sync.Mutex
	max   int
	seq   map[string]uint64
	order []string // insertion order, for eviction
}

// newFloors remembers at most max (Config.MaxFloors, >= 1) conversations.
func newFloors(max int) floors {
	return floors{max: max}
}

func (f *floors) get(convID string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seq[convID]
}

func (f *floors) put(convID string, seq uint64) {
	if seq == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seq == nil {
		f.seq = make(map[string]uint64)
	}
	if _, ok := f.seq[convID]; !ok {
		f.order = append(f.order, convID)
	}
	f.seq[convID] = max(f.seq[convID], seq)
	for len(f.seq) > f.max && len(f.order) > 0 {
		delete(f.seq, f.order[0])
		f.order = f.order[1:]
	}
	if cap(f.order) > 4*f.max { // compact the eviction queue now and then
		f.order = append([]string(nil), f.order...)
	}
}
