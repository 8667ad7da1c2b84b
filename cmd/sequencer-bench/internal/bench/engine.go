package bench

import (
	"context"
	"fmt"
	"slices"
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
	// set), on the same PostgreSQL server for every engine; for SQLite
	// engines it is sqlite:PATH of a fresh file.
	DSN string
	// Pool is the number of PostgreSQL connections the engine may use.
	Pool int
	// Redis is the run's Redis client; keys must start with RedisPrefix.
	Redis       *redis.Client
	RedisPrefix string
	// Target is the base URL of a running `sequencer serve` (the e
	// engines), or ServeBin the binary they start on DSN.
	Target   string
	ServeBin string
	// Protocol is the RPC protocol the SDK engines (e, e-batch) speak:
	// "grpc" or "connect".
	Protocol string
	// BatchesInFlight is e-batch's client.BatchPolicy.MaxInFlight (0: the
	// SDK's default).
	BatchesInFlight int
	// SubsProcess: the feed engines open their Subscribe streams in a
	// child process (--subs-process; subs_child.go).
	SubsProcess bool
	// SubsCPUProfile: the child's CPU profile file (--subs-cpuprofile).
	SubsCPUProfile string
	// ConvsPerStream: conversations per Subscribe stream (--convs-per-stream).
	ConvsPerStream int
	// CopyBatch and CopyWriters shape engine d.
	CopyBatch   int
	CopyWriters int
	// CommitWorkers, when > 0, replaces the server's default number of
	// group-commit workers (engine a and its variants; --commit-workers).
	CommitWorkers int
	// KeepReadPositions: the own-send rule off (--send-marks-read=false).
	KeepReadPositions bool
	// Passivate is how long an idle conversation actor lives (engine a).
	Passivate time.Duration
	// Logf reports engine events the user should see (e.g. a failed floor
	// save); it never fails the run.
	Logf func(format string, args ...any)
}

// EngineSpec names an engine and knows how to open it.
type EngineSpec struct {
	Key  string // a, b, c, d, e, e-json, ... (engineOrder)
	Name string // shown in tables and charts
	// About says in one line what the engine does per message.
	About string
	// NeedsSchema: the engine writes to Env.DSN (false: a remote server
	// writes to its own store).
	NeedsSchema bool
	// NeedsBaselineTables: the bench creates im_message (and its own side
	// tables) in the schema before Open. Engine a creates them itself.
	NeedsBaselineTables bool
	// Remote: the engine drives a 'sequencer serve' through the API: the
	// one at Env.Target, or one the bench starts per scenario (servedSpec).
	Remote bool
	// SQLite: the engine's store is a fresh SQLite file (Env.DSN
	// sqlite:PATH) instead of a PostgreSQL schema.
	SQLite bool
	// OptIn: not in the default engine list (the read-position engines,
	// which measure other RPCs than Send).
	OptIn bool
	// MySQL: the engine's store is a fresh MySQL database (Env.DSN a
	// mysql:// URL) on the server of --mysql.
	MySQL bool
	// Citus: the engine's store is a fresh schema of the --citus database
	// (a Citus coordinator's) instead of the run's PostgreSQL database.
	Citus bool
	Open  func(ctx context.Context, env Env) (Engine, error)
}

// engines lists every engine the bench knows, by key.
var engines = map[string]EngineSpec{}

func registerEngine(s EngineSpec) { engines[s.Key] = s }

// engineOrder is the order engines are listed in by default: this sequencer
// in process, the seed's baselines, the ceiling, the network variants, then
// the embedded store's.
var engineOrder = []string{"a", "b", "c", "d", "e", "e-json", "e-batch", "a-sqlite", "e-sqlite", "e-json-sqlite", "e-batch-sqlite",
	"a-mysql", "e-batch-mysql", "b-mysql", "c-mysql", "a-citus", "e-batch-citus"}

// engineKeys returns the known keys in order.
func engineKeys() []string {
	keys := make([]string, 0, len(engines))
	for _, k := range engineOrder {
		if _, ok := engines[k]; ok {
			keys = append(keys, k)
		}
	}
	var rest []string
	for k := range engines {
		if !slices.Contains(engineOrder, k) {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	return append(keys, rest...)
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
