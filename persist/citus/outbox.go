package citus

import (
	"context"
	"errors"
	"sync"

	"github.com/sequencer-im/sequencer/persist"
)

var _ persist.Outbox = (*Store)(nil)

// The outbox on Citus: feed_outbox is distributed by conv_id, co-located
// with conv_head (migrations_citus/0008), and a commit upserts a
// conversation's row in its own transaction, in the shard table next to
// the conversation's head (direct writes) or through Citus. OutboxPending
// is persist/postgres's query through the coordinator: Citus runs it on
// every shard, each one index range of (part, conv_id), and merges the
// ordered, limited answers.

// OutboxAdvance implements persist.Outbox: persist/postgres's advance (lock
// the rows in key order, raise, delete the published ones) once per shard
// of the moves' conversations, each a single-shard transaction that Citus
// routes to its worker (the statements name the conversations by conv_id),
// up to advanceShards of them at once. So a transaction holds row locks in
// one shard only, in the key order of a commit's upsert there, and never
// waits in a cycle with a commit. A crash between two shards' transactions leaves some
// rows raised and some not: the next owner publishes the rest again, which
// JetStream drops by Nats-Msg-Id (docs/FEED.md).
func (s *Store) OutboxAdvance(ctx context.Context, moves []persist.OutboxMove) error {
	groups := s.byShard(moves)
	errs := make([]error, len(groups))
	sem := make(chan struct{}, advanceShards)
	var wg sync.WaitGroup
	for i, group := range groups {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = s.Store.OutboxAdvance(ctx, group)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// advanceShards is how many shards' advances run at once (each a
// connection of the store's pool for one transaction).
const advanceShards = 4

// byShard splits moves by the shard of their conversation (a conversation whose shard is not known yet goes alone, routed by its
// conv_id).
func (s *Store) byShard(moves []persist.OutboxMove) [][]persist.OutboxMove {
	at := map[int64]int{}
	var out [][]persist.OutboxMove
	for _, m := range moves {
		id, _, ok := s.ShardOf(m.ConvID)
		if !ok {
			out = append(out, []persist.OutboxMove{m})
			continue
		}
		k, seen := at[id]
		if !seen {
			k = len(out)
			at[id] = k
			out = append(out, nil)
		}
		out[k] = append(out[k], m)
	}
	return out
}
