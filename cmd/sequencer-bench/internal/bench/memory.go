package bench

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MemoryResult is what the memory scenario measured: how much a live
// conversation actor costs and whether passivation gives the memory back.
type MemoryResult struct {
	Conversations int `json:"conversations"`      // distinct conversations touched once
	LiveBefore    int `json:"live_actors_before"` // live actors before the first send (a remote server's earlier ones)
	PeakLive      int `json:"peak_live_actors"`   // most live actors seen while sending
	LiveAtEnd     int `json:"live_actors_at_end"` // live actors right after the last send
	// HeapBefore and HeapAtEnd are the Go heap in use (after a forced GC when
	// in process) before the first send and right after the last one.
	HeapBefore    uint64  `json:"heap_before_bytes"`
	HeapAtEnd     uint64  `json:"heap_at_end_bytes"`
	BytesPerActor float64 `json:"bytes_per_live_actor"`
	PeakRSS       uint64  `json:"peak_rss_bytes"`
	// After idling: live actors and heap once passivation ran (or the wait
	// ended).
	IdleSeconds   float64 `json:"idle_seconds"`
	LiveAfterIdle int     `json:"live_actors_after_idle"`
	HeapAfterIdle uint64  `json:"heap_after_idle_bytes"`
	Remote        bool    `json:"remote,omitempty"`
	// StoppedAtRSS: the scenario was stopped early because the RSS passed
	// --max-rss (Conversations is then more than were touched).
	StoppedAtRSS bool   `json:"stopped_at_rss,omitempty"`
	Note         string `json:"note,omitempty"`
}

// memoryProbe samples live actors and RSS while the memory scenario runs.
type memoryProbe struct {
	conv   ConvCounter
	remote RemoteMemory // nil: the engine runs in this process
	// maxRSS > 0 calls onLimit once when the sampled RSS passes it.
	maxRSS  uint64
	onLimit func()
	limited bool

	mu       sync.Mutex
	peakLive int
	peakRSS  uint64
	stopc    chan struct{}
	wg       sync.WaitGroup
}

const memorySampleEvery = 200 * time.Millisecond

// heapNow returns the Go heap in use: this process's after a forced GC, or
// the remote server's as it reports it.
func (p *memoryProbe) heapNow(ctx context.Context) uint64 {
	if p.remote != nil {
		_, heap, err := p.remote.Memory(ctx)
		if err != nil {
			return 0
		}
		return heap
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func (p *memoryProbe) rssNow(ctx context.Context) uint64 {
	if p.remote != nil {
		rss, _, err := p.remote.Memory(ctx)
		if err != nil {
			return 0
		}
		return rss
	}
	return procStatusBytes("VmRSS:")
}

func (p *memoryProbe) sample(ctx context.Context) {
	live, err := p.conv.LiveConversations(ctx)
	rss := p.rssNow(ctx)
	p.mu.Lock()
	if err == nil && live > p.peakLive {
		p.peakLive = live
	}
	if rss > p.peakRSS {
		p.peakRSS = rss
	}
	fire := p.maxRSS > 0 && rss > p.maxRSS && !p.limited && p.onLimit != nil
	if fire {
		p.limited = true
	}
	p.mu.Unlock()
	if fire {
		p.onLimit()
	}
}

func (p *memoryProbe) start(ctx context.Context) {
	if p.remote == nil {
		resetPeakRSS()
	}
	p.stopc = make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(memorySampleEvery)
		defer t.Stop()
		for {
			select {
			case <-p.stopc:
				return
			case <-t.C:
				p.sample(ctx)
			}
		}
	}()
}

func (p *memoryProbe) finish(ctx context.Context) (peakLive int, peakRSS uint64) {
	close(p.stopc)
	p.wg.Wait()
	p.sample(ctx)
	if p.remote == nil {
		if hwm := procStatusBytes("VmHWM:"); hwm > p.peakRSS {
			p.peakRSS = hwm
		}
	}
	return p.peakLive, p.peakRSS
}

// waitIdle polls live actors until passivation stopped all of them, or until
// deadline. It returns the last count.
func (p *memoryProbe) waitIdle(ctx context.Context, deadline time.Duration) (int, time.Duration) {
	t0 := time.Now()
	for {
		live, err := p.conv.LiveConversations(ctx)
		if err == nil && live == 0 {
			return live, time.Since(t0)
		}
		if time.Since(t0) >= deadline || ctx.Err() != nil {
			return live, time.Since(t0)
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// resetPeakRSS resets this process's VmHWM (Linux: clear_refs 5), so the
// memory scenario's peak is its own, not an earlier scenario's.
func resetPeakRSS() {
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// procStatusBytes reads a "kB" field of /proc/self/status (0 if absent).
func procStatusBytes(field string) uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, field) {
			continue
		}
		fields := strings.Fields(strings.TrimPrefix(line, field))
		if len(fields) == 0 {
			return 0
		}
		kb, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return 0
		}
		return kb * 1024
	}
	return 0
}
