package citus

import (
	"context"
	"embed"
	"fmt"
	"sort"

	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

// A file of migrations_citus/ replaces the file of persist/postgres's
// migrations/ with the same version and name (the distributed schema); the
// other versions are applied as they are. schema_version records the same
// (version, name) pairs either way, so a database migrated when these files
// lived in persist/postgres is up to date here.
//
//go:embed migrations_citus/*.sql
var migrationFS embed.FS

// Migration is one embedded schema change.
type Migration = persist.Migration

// Migrations returns the migrations applied on a Citus database, in
// version order.
func Migrations() ([]Migration, error) {
	ms, err := postgres.Migrations()
	if err != nil {
		return nil, err
	}
	over, err := persist.LoadMigrations(migrationFS, "migrations_citus")
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	byVersion := map[int]Migration{}
	for _, m := range ms {
		byVersion[m.Version] = m
	}
	for _, m := range over {
		byVersion[m.Version] = m
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// AvailableMigrations are the migrations Migrate applies (Migrations), in
// version order (persist.Migrator).
func (s *Store) AvailableMigrations() ([]Migration, error) { return Migrations() }

// Migrate applies Migrations as persist/postgres's Migrate does, one
// statement at a time, distributes feed_outbox if an older schema left it
// a coordinator table, then loads the shard placements and logs
// "distributed: N workers, M shards".
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := Migrations()
	if err != nil {
		return err
	}
	if err := s.ApplyMigrations(ctx, ms, true); err != nil {
		return err
	}
	if err := s.distributeOutbox(ctx); err != nil {
		return err
	}
	if err := s.loadPlacements(ctx); err != nil {
		return err
	}
	s.logDistributed()
	return nil
}
