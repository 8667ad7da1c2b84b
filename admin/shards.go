package admin

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/sequencer-im/sequencer/persist"
)

// ErrNotDistributed: `admin shards` on a store that is not on Citus.
var ErrNotDistributed = errors.New("shards: the store is not distributed: `admin shards` needs a Citus coordinator's database (docs/CITUS.md)")

// Shards is `sequencer admin shards`: where a Citus store's conversations
// are. The ring's partitions and Citus's shards are not aligned
// (docs/ARCHITECTURE.md): a partition's conversations hash over every
// shard, so each partition depends on every worker listed here; `admin head
// CONV` names one conversation's shard and worker.
type Shards struct {
	Workers []ShardWorker `json:"workers"`
	Shards  []Shard       `json:"shards"`
}

// ShardWorker is one primary worker of the Citus cluster.
type ShardWorker struct {
	Worker string `json:"worker"` // host:port, as in pg_dist_node
	Shards int    `json:"shards"`
	// Reachable: this command's connection to the worker answered; Error
	// says why not.
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	// Bytes is the size of its shards (null when not reachable).
	Bytes *int64 `json:"bytes"`
}

// Shard is one shard group: conv_head's shard and the co-located shards of
// im_message and read_position (same hash range, same worker).
type Shard struct {
	Shard int64 `json:"shard"` // conv_head's shard id, as `admin head` shows
	// MinHash..MaxHash is the range of hashtext(conv_id) it holds.
	MinHash int32    `json:"min_hash"`
	MaxHash int32    `json:"max_hash"`
	Worker  string   `json:"worker"`
	Tables  []string `json:"tables"`
	// Read from the worker; null when it did not answer. Messages is the
	// sum of the heads (messages ever committed; retention does not lower
	// it).
	Bytes         *int64 `json:"bytes"`
	Conversations *int64 `json:"conversations"`
	Messages      *int64 `json:"messages"`
}

// Shards reads the shard groups and workers from the coordinator, then each
// worker's shard sizes and conversation counts (postgres.Store.CitusShards).
func (a *Admin) Shards(ctx context.Context) (Shards, error) {
	if dist, _, _ := a.distributed(); !dist {
		return Shards{}, ErrNotDistributed
	}
	shards, workers, err := a.store.(persist.Sharded).CitusShards(ctx)
	if err != nil {
		return Shards{}, err
	}
	out := Shards{Workers: make([]ShardWorker, 0, len(workers)), Shards: make([]Shard, 0, len(shards))}
	for _, w := range workers {
		sw := ShardWorker{Worker: w.Addr, Shards: w.Shards, Reachable: w.Reachable, Error: w.Err}
		if w.Reachable {
			sw.Bytes = ptr(w.Bytes)
		}
		out.Workers = append(out.Workers, sw)
	}
	for _, s := range shards {
		sh := Shard{Shard: s.ID, MinHash: s.MinHash, MaxHash: s.MaxHash, Worker: s.Worker, Tables: s.Tables}
		if s.Known {
			sh.Bytes, sh.Conversations, sh.Messages = ptr(s.Bytes), ptr(s.Conversations), ptr(s.Messages)
		}
		out.Shards = append(out.Shards, sh)
	}
	return out, nil
}

// distributed reports whether the store is a Citus store, and its workers
// holding shards (host:port) as the store loaded them.
func (a *Admin) distributed() (bool, []string, error) {
	sh, ok := a.store.(persist.Sharded)
	if !ok {
		return false, nil, nil
	}
	if dist, _, _ := sh.Distributed(); !dist {
		return false, nil, nil
	}
	return true, sh.CitusWorkerAddrs(), nil
}

func ptr[T any](v T) *T { return &v }

func (s Shards) Table() Table {
	t := Table{Header: []string{"SHARD", "HASH RANGE", "WORKER", "BYTES", "CONVERSATIONS", "MESSAGES"}}
	t.Lines = append(t.Lines, fmt.Sprintf("citus: %d workers, %d shard groups (conv_head, im_message, read_position co-located); "+
		"every partition's conversations are spread over all of them (admin head CONV names one conversation's)", len(s.Workers), len(s.Shards)))
	for _, w := range s.Workers {
		state := "reachable"
		if !w.Reachable {
			state = "UNREACHABLE: " + w.Error
		}
		t.Lines = append(t.Lines, fmt.Sprintf("worker %s: %d shards, %s, %s", w.Worker, w.Shards, size(w.Bytes), state))
	}
	for _, e := range s.Shards {
		t.Rows = append(t.Rows, []string{strconv.FormatInt(e.Shard, 10), fmt.Sprintf("%d..%d", e.MinHash, e.MaxHash), e.Worker,
			size(e.Bytes), count(e.Conversations), count(e.Messages)})
	}
	return t
}

// size renders a byte count, "?" when unknown.
func size(b *int64) string {
	if b == nil {
		return "?"
	}
	v := float64(*b)
	for _, unit := range []string{"B", "kB", "MB", "GB", "TB"} {
		if v < 1024 || unit == "TB" {
			if unit == "B" {
				return fmt.Sprintf("%d B", *b)
			}
			return fmt.Sprintf("%.1f %s", v, unit)
		}
		v /= 1024
	}
	return ""
}

func count(n *int64) string {
	if n == nil {
		return "?"
	}
	return strconv.FormatInt(*n, 10)
}
