package console

import (
	"context"
	"sort"
	"sync"

	"github.com/sequencer-im/sequencer"
)

// Sender is what a node's API sends through (api.Sender).
type Sender interface {
	Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error)
	SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome)
}

// SendCounter counts the sends a node's API receives per conversation, for
// the console's hot conversations and partitions. Wrap the API's Sender
// with it; the console reads and resets it at every sample. It counts at
// the node a client sent to (before any forward), so the cluster's counts
// add up across nodes without counting a forwarded send twice.
//
// Memory is bounded: past maxTracked conversations in one interval, new
// conversations are counted only in the total.
type SendCounter struct {
	mu    sync.Mutex
	convs map[string]uint32
	other uint64
}

// maxTracked bounds the conversations counted in one sample interval.
const maxTracked = 10000

// NewSendCounter returns an empty counter.
func NewSendCounter() *SendCounter { return &SendCounter{convs: map[string]uint32{}} }

// Wrap returns next, counting its sends.
func (c *SendCounter) Wrap(next Sender) Sender { return countingSender{c: c, next: next} }

func (c *SendCounter) note(convs ...string) {
	c.mu.Lock()
	for _, conv := range convs {
		if n, ok := c.convs[conv]; ok || len(c.convs) < maxTracked {
			c.convs[conv] = n + 1
		} else {
			c.other++
		}
	}
	c.mu.Unlock()
}

// take returns the counts since the last take and starts over.
func (c *SendCounter) take() map[string]uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.convs
	c.convs, c.other = make(map[string]uint32, len(out)), 0
	return out
}

type countingSender struct {
	c    *SendCounter
	next Sender
}

func (s countingSender) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	s.c.note(req.ConvID)
	return s.next.Send(ctx, req)
}

func (s countingSender) SendBatch(ctx context.Context, reqs []sequencer.SendRequest, out []sequencer.SendOutcome) {
	convs := make([]string, len(reqs))
	for i, r := range reqs {
		convs[i] = r.ConvID
	}
	s.c.note(convs...)
	s.next.SendBatch(ctx, reqs, out)
}

// HotConv is one conversation's send rate over the hot window.
type HotConv struct {
	ConvID      string  `json:"convId"`
	Partition   *uint32 `json:"partition,omitempty"` // nil on a single node
	SendsPerSec float64 `json:"sendsPerSec"`
}

// HotPartition is one partition's send rate over the hot window.
type HotPartition struct {
	Partition   uint32  `json:"partition"`
	SendsPerSec float64 `json:"sendsPerSec"`
}

// hotWindow is how many samples the hot tables cover (60 at 1s).
const hotWindow = 60

// hotTop is how many conversations and partitions the tables list.
const hotTop = 10

// hot keeps the per-sample counts of the last hotWindow samples.
type hot struct {
	window []map[string]uint32
}

func (h *hot) add(m map[string]uint32) {
	h.window = append(h.window, m)
	if len(h.window) > hotWindow {
		h.window = h.window[len(h.window)-hotWindow:]
	}
}

// sums adds up the window: counts per conversation.
func (h *hot) sums() map[string]uint64 {
	out := map[string]uint64{}
	for _, m := range h.window {
		for k, v := range m {
			out[k] += uint64(v)
		}
	}
	return out
}

// topConvs ranks conversations by their counts over secs seconds.
func topConvs(sums map[string]uint64, secs float64, partOf func(string) (uint32, bool)) []HotConv {
	out := make([]HotConv, 0, len(sums))
	for k, v := range sums {
		out = append(out, HotConv{ConvID: k, SendsPerSec: float64(v) / secs})
	}
	out = rank(out, func(a, b HotConv) bool {
		return a.SendsPerSec > b.SendsPerSec || a.SendsPerSec == b.SendsPerSec && a.ConvID < b.ConvID
	})
	if partOf != nil {
		for i := range out {
			if p, ok := partOf(out[i].ConvID); ok {
				out[i].Partition = &p
			}
		}
	}
	return out
}

// topPartitions ranks partitions by their counts over secs seconds.
func topPartitions(counts map[uint32]uint64, secs float64) []HotPartition {
	out := make([]HotPartition, 0, len(counts))
	for p, v := range counts {
		out = append(out, HotPartition{Partition: p, SendsPerSec: float64(v) / secs})
	}
	return rank(out, func(a, b HotPartition) bool {
		return a.SendsPerSec > b.SendsPerSec || a.SendsPerSec == b.SendsPerSec && a.Partition < b.Partition
	})
}

// rank sorts s by less and keeps the first hotTop.
func rank[T any](s []T, less func(a, b T) bool) []T {
	sort.Slice(s, func(i, j int) bool { return less(s[i], s[j]) })
	return s[:min(len(s), hotTop)]
}
