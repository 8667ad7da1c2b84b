// Package citus is the Citus store: a persist.Store on a Citus
// coordinator's database (one with the citus extension), conversations
// distributed by conv_id over the workers. See docs/CITUS.md.
//
// It shares the PostgreSQL dialect of persist/postgres (SQL, error
// mapping, pools, failover) as database/sql's drivers share theirs: a Store
// is a *postgres.Store opened on a Citus database, plus what only Citus
// does: the shard and worker views (persist.Sharded, views.go), read
// positions as single-shard statements (readpos.go) and retention one
// conversation per DELETE (retention.go).
//
// Not yet moved here (docs/ARCHITECTURE.md, "Citus as its own package"):
// the distributed commit path (direct worker writes, commit groups per
// worker, the lease cache), the placements, migrations_citus/ and their
// tests still live in persist/postgres (citus.go), which turns them on when
// it finds the citus extension. So a postgres.Open on a Citus database is
// only half a store: open Citus with Open (or persist/open).
package citus

import (
	"context"
	"errors"

	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

// Store is a persist.Store on Citus. It is safe for concurrent use.
type Store struct {
	*postgres.Store
}

// The abilities a Citus store has beyond persist.Store (with those of
// *postgres.Store: persist.Migrator, persist.PoolReporter,
// persist.ConvSettler, membership.Provider).
var (
	_ persist.Store   = (*Store)(nil)
	_ persist.Sharded = (*Store)(nil)
)

// ErrNotDistributed: Open on a database without the citus extension.
var ErrNotDistributed = errors.New("citus: the store is not distributed (no citus extension in its database): use persist/postgres (docs/CITUS.md)")

// LeaseTTL is how long the store trusts its cached copy of the partition
// leases before a commit re-reads it (postgres.LeaseTTL).
const LeaseTTL = postgres.LeaseTTL

// Options are persist/postgres's: the same pools, timeouts and logger.
type Options = postgres.Options

// Open connects to the Citus coordinator's database at dsn and checks it
// answers and has the citus extension (else ErrNotDistributed). It does
// not migrate; call Migrate.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	ps, err := postgres.Open(ctx, dsn, opts)
	if err != nil {
		return nil, err
	}
	s, ok := Of(ps)
	if !ok {
		ps.Close()
		return nil, ErrNotDistributed
	}
	return s, nil
}

// Of is ps as a Citus store when ps was opened on a Citus database (the
// citus extension found); false on plain PostgreSQL.
func Of(ps *postgres.Store) (*Store, bool) {
	if dist, _, _ := ps.Distributed(); !dist {
		return nil, false
	}
	return &Store{Store: ps}, true
}
