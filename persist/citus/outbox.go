package citus

import (
	"context"
	"errors"
	"sync"

	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.Outbox = (*Store)(nil)

// The outbox on Citus: feed_outbox is distributed by conv_id, co-located
// with conv_head (migrations_citus/0008), and a commit inserts a
// conversation's missing row in its own transaction, after its head
// update, in the shard table next to the conversation's head (direct
// writes) or through Citus. OutboxPending is persist/postgres's query (the
// rows joined with their heads, co-located) through the coordinator: Citus
// runs it on every shard, each one index range of (part, conv_id), and
// merges the ordered, limited answers.

// OutboxAdvance implements persist.Outbox: persist/postgres's advance (lock
// the rows in key order, raise) once per shard of the moves'
// conversations, each a single-shard transaction that Citus routes to its
// worker (the statements name the conversations by conv_id), up to
// advanceShards of them at once. So a transaction holds row locks in one
// shard only and never waits in a cycle with a commit. A crash between two
// shards' transactions leaves some rows raised and some not: the next owner
// publishes the rest again, which JetStream drops by Nats-Msg-Id
// (docs/FEED.md).
func (s *Store) OutboxAdvance(ctx context.Context, moves []persist.OutboxMove) error {
	return perShard(s, moves, func(m persist.OutboxMove) string { return m.ConvID }, func(g []persist.OutboxMove) error {
		return s.Store.OutboxAdvance(ctx, g)
	})
}

// OutboxSweep implements persist.Outbox: persist/postgres's sweep (the
// heads read FOR SHARE SKIP LOCKED, the rows published in full deleted)
// once per shard, like OutboxAdvance: the head rows and the outbox rows of
// one shard are co-located, so each sweep is one single-shard transaction
// on the worker that holds them.
func (s *Store) OutboxSweep(ctx context.Context, keys []persist.OutboxKey) error {
	return perShard(s, keys, func(k persist.OutboxKey) string { return k.ConvID }, func(g []persist.OutboxKey) error {
		return s.Store.OutboxSweep(ctx, g)
	})
}

// advanceShards is how many shards' advances or sweeps run at once (each a
// connection of the store's pool for one transaction).
const advanceShards = 4

// perShard splits items by the shard of their conversation (one whose
// shard is not known yet goes alone, routed by its conv_id) and runs f on
// each group, up to advanceShards at once.
func perShard[T any](s *Store, items []T, conv func(T) string, f func([]T) error) error {
	at := map[int64]int{}
	var groups [][]T
	for _, it := range items {
		id, _, ok := s.ShardOf(conv(it))
		if !ok {
			groups = append(groups, []T{it})
			continue
		}
		k, seen := at[id]
		if !seen {
			k = len(groups)
			at[id] = k
			groups = append(groups, nil)
		}
		groups[k] = append(groups[k], it)
	}
	errs := make([]error, len(groups))
	sem := make(chan struct{}, advanceShards)
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = f(g)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
