package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sequencer-im/sequencer"
)

// Engine is one way of storing a message with a per-conversation seq. The
// bench's senders call Send concurrently; Send returns only when the message
// is as durable as that engine ever makes it.
type Engine interface {
	Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error)
	// Close stops the engine and releases its connections.
	Close() error
}

// BatchCounter is implemented by engines that count their store commits.
// Every count only grows; the bench reads them before and after a
// measurement and reports messages/commits as the mean batch size and
// CommitSeconds/commits as the mean commit time.
type BatchCounter interface {
	Batches(ctx context.Context) (BatchStats, error)
}

// BatchStats are an engine's cumulative commit counts.
type BatchStats struct {
	Commits       uint64  // store commits (transactions or autocommit statements)
	Messages      uint64  // messages they stored
	CommitSeconds float64 // time spent in them, summed
}

func (s BatchStats) sub(o BatchStats) BatchStats {
	return BatchStats{Commits: s.Commits - o.Commits, Messages: s.Messages - o.Messages, CommitSeconds: s.CommitSeconds - o.CommitSeconds}
}

// ConvCounter is implemented by engines that keep per-conversation state in
// memory (conversation actors). The memory scenario runs only on them.
type ConvCounter interface {
	LiveConversations(ctx context.Context) (int, error)
}

// RemoteMemory is implemented by engines that run in another process: the
// memory scenario reads that process's numbers instead of the bench's.
type RemoteMemory interface {
	// Memory returns the server's resident set size and Go heap in use, in
	// bytes, as the server reports them now.
	Memory(ctx context.Context) (rss, heap uint64, err error)
}

// Env is what an engine is opened with for one (engine, scenario) pair.
type Env struct {
	// DSN points at a fresh, empty schema of the run's database (search_path
	// set), on the same PostgreSQL server for every engine.
	DSN string
	// Pool is the number of PostgreSQL connections the engine may use.
	Pool int
	// Redis is the run's Redis client; keys must start with RedisPrefix.
	Redis       *redis.Client
	RedisPrefix string
	// Target is the base URL of a running `sequencer serve` (engine e), or
	// ServeBin the binary engine e starts on DSN.
	Target   string
	ServeBin string
	// Protocol is the RPC protocol engine e speaks: "grpc" or "connect".
	Protocol string
	// CopyBatch and CopyWriters shape engine d.
	CopyBatch   int
	CopyWriters int
	// Passivate is how long an idle conversation actor lives (engine a).
	Passivate time.Duration
	// Logf reports engine events the user should see (e.g. a failed floor
	// save); it never fails the run.
	Logf func(format string, args ...any)
}

// EngineSpec names an engine and knows how to open it.
type EngineSpec struct {
	Key  string // a, b, c, d, e
	Name string // shown in tables and charts
	// About says in one line what the engine does per message.
	About string
	// NeedsSchema: the engine writes to Env.DSN (false: a remote server
	// writes to its own store).
	NeedsSchema bool
	// NeedsBaselineTables: the bench creates im_message (and its own side
	// tables) in the schema before Open. Engine a creates them itself.
	NeedsBaselineTables bool
	Open                func(ctx context.Context, env Env) (Engine, error)
}

// engines lists every engine the bench knows, by key.
var engines = map[string]EngineSpec{}

func registerEngine(s EngineSpec) { engines[s.Key] = s }

// engineKeys returns the known keys in order.
func engineKeys() []string {
	keys := make([]string, 0, len(engines))
	for k := range engines {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// parseEngines turns "a,b,d" into specs, in the order given.
func parseEngines(list string) ([]EngineSpec, error) {
	var out []EngineSpec
	seen := map[string]bool{}
	for _, k := range strings.Split(list, ",") {
		k = strings.TrimSpace(k)
		if k == "" || seen[k] {
			continue
		}
		s, ok := engines[k]
		if !ok {
			return nil, fmt.Errorf("unknown engine %q (known: %s)", k, strings.Join(engineKeys(), ","))
		}
		seen[k] = true
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no engine selected")
	}
	return out, nil
}
