// Package citus is the Citus store: a persist.Store on a Citus
// coordinator's database (one with the citus extension), conversations
// distributed by conv_id over the workers. See docs/CITUS.md.
//
// It shares the PostgreSQL dialect of persist/postgres as database/sql's
// drivers share theirs: a Store is a *postgres.Store (its pools, failover,
// error mapping, membership tables, outbox SQL) opened on a Citus database,
// composed with persist/postgres's building blocks (postgres.CommitOn and
// its CommitPlan, the head compare-and-set and insert SQL, the read and
// read-many statements on a pool of its choice, ApplyMigrations) and what
// only Citus does:
//
//   - the distributed schema (migrations_citus/, migrate.go);
//   - commits straight to the worker holding their shards, into the shard
//     tables (store.go, commit.go: "Direct writes"), the fences checked
//     against a cached copy of partition_lease and carried by the head rows'
//     epochs (fence.go: "Fencing on Citus");
//   - single-shard reads on the worker (LoadHead, ReadRange, ReadBefore,
//     ReadMany: pages.go);
//   - the shard and worker views (persist.Sharded, views.go), read
//     positions as single-shard statements (readpos.go), retention one
//     conversation per DELETE (retention.go), the outbox per shard
//     (outbox.go).
//
// It never decides ownership and never assigns seqs, as persist/postgres.
package citus

import (
	"context"
	"errors"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

// Store is a persist.Store on Citus. It is safe for concurrent use.
type Store struct {
	*postgres.Store
	dist *dist // placements, worker pools, the lease cache (store.go)
}

// The abilities a Citus store has beyond persist.Store (with those of
// *postgres.Store: persist.Migrator, persist.PoolReporter,
// persist.ConvSettler, membership.Provider).
var (
	_ persist.Store          = (*Store)(nil)
	_ persist.Sharded        = (*Store)(nil)
	_ persist.ConvScopedKeys = (*Store)(nil)
	_ persist.PageReader     = (*Store)(nil)
	_ persist.Migrator       = (*Store)(nil)
	_ persist.ConvSettler    = (*Store)(nil)
	_ persist.MessagesGetter = (*Store)(nil)
)

// ErrNotDistributed: Open on a database without the citus extension.
var ErrNotDistributed = errors.New("citus: the store is not distributed (no citus extension in its database): use persist/postgres (docs/CITUS.md)")

// Options configure a Citus store: persist/postgres's (the coordinator's
// pools, timeouts, logger; each worker gets a commit pool of CommitConns
// and a read pool of MaxConns connections) and Citus's own.
type Options struct {
	postgres.Options
	// NoLeaseCheck skips the lease-cache check before a commit
	// (checkFences), so a stale owner's commits reach the workers and only
	// the head row's epoch fences them: for tests of that fence (the e2e
	// zombie test sets it through persist/open). Never set it in
	// production: the check refuses a stale owner without a round trip to
	// a worker.
	NoLeaseCheck bool
}

// Open connects to the Citus coordinator's database at dsn and checks it
// answers and has the citus extension (else ErrNotDistributed). It does
// not migrate; call Migrate.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	ps, err := postgres.Open(ctx, dsn, opts.Options)
	if err != nil {
		return nil, err
	}
	s, ok, err := Of(ctx, ps, opts)
	if err != nil {
		ps.Close()
		return nil, err
	}
	if !ok {
		ps.Close()
		return nil, ErrNotDistributed
	}
	return s, nil
}

// Of is ps as a Citus store when its database has the citus extension
// (false on plain PostgreSQL: ps is then left as it is). ps was opened
// with opts.Options; Of takes the rest of opts. The Store owns ps: its
// Close closes ps. It loads the placements if the schema exists (Migrate
// loads them otherwise) and starts the refresher of the placements and
// the lease cache.
func Of(ctx context.Context, ps *postgres.Store, opts Options) (*Store, bool, error) {
	var citus bool
	if err := ps.ControlPool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return nil, false, postgres.Unavailable("detect citus", err)
	}
	if !citus {
		return nil, false, nil
	}
	s := &Store{Store: ps, dist: &dist{base: ps.DSNConfig(), conns: ps.CommitPool().Config().MaxConns,
		reads: ps.Pool().Config().MaxConns, noLeaseCheck: opts.NoLeaseCheck}}
	if opts.NoLeaseCheck {
		s.Logger().Warn("citus: NoLeaseCheck is set: commits skip the lease check (tests only)")
	}
	if err := s.startDist(ctx); err != nil {
		s.dist.closeWorkers()
		return nil, false, err
	}
	return s, true, nil
}

// Close stops the refresher and closes every connection (the workers' and
// the coordinator's).
func (s *Store) Close() error {
	s.dist.closeWorkers()
	return s.Store.Close()
}

// LoadHead implements persist.Store: from the shard's own table on its
// worker (shardHeadSQL), else through Citus on the worker (or the
// coordinator before the placements are known).
func (s *Store) LoadHead(ctx context.Context, convID string) (uint64, error) {
	if h, done, err := s.loadHeadDirect(ctx, convID); done {
		return h, err
	}
	return postgres.LoadHeadOn(ctx, s.reader(convID), convID)
}

// ReadRange implements persist.Store: a single-shard read on the worker
// holding conv's shard.
func (s *Store) ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error) {
	return postgres.ReadRangeOn(ctx, s.reader(convID), convID, afterSeq, limit)
}

// ReadBefore implements persist.PageReader: a single-shard read on the
// worker holding conv's shard.
func (s *Store) ReadBefore(ctx context.Context, convID string, afterSeq, beforeSeq uint64, limit int) ([]sequencer.Message, error) {
	return postgres.ReadBeforeOn(ctx, s.reader(convID), convID, afterSeq, beforeSeq, limit)
}

// Settle implements persist.Store: persist/postgres's, and once a backend
// of the coordinator is gone, recover_prepared_transactions (a commit
// through the coordinator may have prepared transactions on workers: they
// end now, committed or aborted as the coordinator decided, rather than at
// Citus's next recovery round).
func (s *Store) Settle(ctx context.Context) error {
	return s.SettleThen(ctx, nil, s.recoverPrepared)
}

// SettleConvs implements persist.ConvSettler, as Settle for the unknown
// commits that may hold rows of convIDs only: a commit touches only the
// workers of its conversations, so a conversation whose worker answers is
// not held up by an unknown commit on a worker that is down.
func (s *Store) SettleConvs(ctx context.Context, convIDs []string) error {
	if len(convIDs) == 0 {
		return nil
	}
	return s.SettleThen(ctx, convIDs, s.recoverPrepared)
}

func (s *Store) recoverPrepared(ctx context.Context) error {
	if _, err := s.ControlPool().Exec(ctx, `SELECT recover_prepared_transactions()`); err != nil {
		return postgres.Unavailable("settle: recover prepared transactions", err)
	}
	return nil
}
