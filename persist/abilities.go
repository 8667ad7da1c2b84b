package persist

import (
	"context"

	"github.com/sequencer-im/sequencer"
)

// The optional abilities of a store, each its own small interface (the
// hashicorp/raft way): persist/open returns a Store, and a caller that needs
// more asks for the ability by type assertion on one of these, never on a
// driver's type. Which store has which is pinned at compile time in each
// driver (var _ persist.Migrator = (*Store)(nil)).
//
//   - Migrator: every store open returns (schema versions);
//   - Backuper: the embedded store (an online copy to a file);
//   - PoolReporter: the server stores with connection pools (PostgreSQL,
//     MySQL, Citus);
//   - RetryCounter: MySQL (transactions redone after a deadlock);
//   - Sharded: Citus (its workers and shard groups);
//   - MessagesGetter: the server stores (PostgreSQL, MySQL, Citus), where
//     a read is a round trip;
//   - membership.Provider (package membership): the stores a cluster can
//     share.

// Migrator is a store with a versioned schema.
type Migrator interface {
	// Migrate applies every migration not yet applied.
	Migrate(ctx context.Context) error
	// AppliedMigrations reads the schema_version table.
	AppliedMigrations(ctx context.Context) ([]AppliedMigration, error)
	// AvailableMigrations are the migrations this binary holds for the
	// store, in version order.
	AvailableMigrations() ([]Migration, error)
}

// MessagesGetter is a store that reads many messages by msg_id in one
// round trip: the actors read the targets of many conversations' edits and
// recalls together (actor.targetReads) instead of one GetMessage each.
type MessagesGetter interface {
	// GetMessages returns the stored messages among ids, in any order; an
	// id that names no stored message is left out (as is a repeated one's
	// second copy).
	GetMessages(ctx context.Context, ids []uint64) ([]sequencer.Message, error)
}

// Backuper is a store that copies itself online into a new file.
type Backuper interface {
	BackupTo(ctx context.Context, path string) error
}

// PoolStat is one connection pool's state (the sequencer_store_pool_*
// gauges).
type PoolStat struct {
	Acquired, Idle, Total, Max int32
}

// PoolReporter is a store with connection pools.
type PoolReporter interface {
	// StorePools names the pools ("read", "commit", "control").
	StorePools() []string
	// StorePool reports one pool; the zero PoolStat for an unknown name.
	StorePool(name string) PoolStat
}

// RetryCounter is a store that redoes transactions that hit a deadlock or
// lock wait timeout before COMMIT (nothing was written): Retries counts
// them (sequencer_store_commit_retries_total).
type RetryCounter interface {
	Retries() uint64
}

// Sharded is a store that spreads conversations over workers (Citus's
// distributed mode: docs/CITUS.md).
type Sharded interface {
	// Distributed reports whether the store runs distributed, and then
	// its workers and shards as last loaded (0, 0 before the schema
	// exists).
	Distributed() (distributed bool, workers, shards int)
	// CitusShards reads every shard group and worker from the coordinator's
	// metadata, then each worker's shard sizes.
	CitusShards(ctx context.Context) ([]CitusShard, []CitusWorker, error)
	// CitusWorkerAddrs are the workers holding shards (host:port), as the
	// store loaded them.
	CitusWorkerAddrs() []string
	// CitusWorkers lists the workers and whether each answers.
	CitusWorkers(ctx context.Context) ([]CitusWorker, error)
}

// CitusShard is one shard group of a distributed store.
type CitusShard struct {
	// ID is conv_head's shard id (what `admin head` shows); MinHash and
	// MaxHash bound the hashtext(conv_id) values it holds.
	ID               int64
	MinHash, MaxHash int32
	// Worker is the worker (host:port) holding it.
	Worker string
	// Tables are the shard group's relations on the worker (conv_head_ID,
	// and the co-located ones).
	Tables []string
	// Read from the worker (zero when Known is false: it did not answer):
	// Bytes is the group's size with indexes; Conversations conv_head's
	// rows; Messages the sum of their heads (messages ever committed;
	// retention does not lower it).
	Known         bool
	Bytes         int64
	Conversations int64
	Messages      int64
}

// CitusWorker is one primary worker of a distributed store.
type CitusWorker struct {
	Addr   string // host:port, as in pg_dist_node
	Shards int    // conv_head shards it holds
	// Reachable: a connection from this process to the worker answered;
	// Err says why not (empty when reachable).
	Reachable bool
	Err       string
	// Bytes is the size of its shards (CitusShards only; 0 when not
	// reachable).
	Bytes int64
}
