package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/idgen"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

func init() {
	registerEngine(EngineSpec{
		Key: "a", Name: "sequencer, in process",
		About: "this sequencer's engine (actor.Node): one actor per conversation assigns seqs, a group-commit writer stores " +
			"many conversations' batches per transaction; msg_ids from a leased worker id",
		NeedsSchema: true,
		Open:        openNode,
	})
}

// nodeEngine is engine (a): the same actor.Node that `sequencer serve` runs,
// on the persist/postgres store (its own migrations create im_message), with
// a worker-id lease in the store, and no network in between.
type nodeEngine struct {
	node  *actor.Node
	lease *idgen.Lease
	store *postgres.Store
	m     *metrics.Set
}

// nodeIDs adapts the lease's generator to actor.IDSource.
type nodeIDs struct{ l *idgen.Lease }

func (n nodeIDs) NextID() (uint64, error) { return n.l.Next() }

func openNode(ctx context.Context, env Env) (Engine, error) {
	store, err := postgres.Open(ctx, env.DSN, postgres.Options{MaxConns: int32(env.Pool)})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		store.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	m := metrics.New()
	lease, err := idgen.NewLease(store, idgen.LeaseConfig{Holder: "bench-" + randomID(), Metrics: m})
	if err != nil {
		store.Close()
		return nil, err
	}
	if err := lease.Start(ctx); err != nil {
		_ = lease.Close(context.WithoutCancel(ctx))
		store.Close()
		return nil, fmt.Errorf("worker-id lease: %w", err)
	}
	node, err := actor.NewNode(actor.Config{
		Store: store, IDs: nodeIDs{lease}, Metrics: m, PassivateAfter: env.Passivate,
	})
	if err != nil {
		_ = lease.Close(context.WithoutCancel(ctx))
		store.Close()
		return nil, err
	}
	return &nodeEngine{node: node, lease: lease, store: store, m: m}, nil
}

func (e *nodeEngine) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	return e.node.Send(ctx, req)
}

// Batches reads the writer's histograms: sequencer_commit_batch_messages
// (commits, messages) and sequencer_commit_seconds (time in commits).
func (e *nodeEngine) Batches(context.Context) (BatchStats, error) {
	mfs, err := e.m.Registry.Gather()
	if err != nil {
		return BatchStats{}, err
	}
	return batchStatsOf(mfs), nil
}

// batchStatsOf sums the commit histograms over all their label values.
func batchStatsOf(mfs []*dto.MetricFamily) BatchStats {
	var s BatchStats
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			switch mf.GetName() {
			case "sequencer_commit_batch_messages":
				s.Commits += h.GetSampleCount()
				s.Messages += uint64(h.GetSampleSum())
			case "sequencer_commit_seconds":
				s.CommitSeconds += h.GetSampleSum()
			}
		}
	}
	return s
}

// LiveConversations is the node's live conversation actors.
func (e *nodeEngine) LiveConversations(context.Context) (int, error) {
	return e.node.LiveConversations(), nil
}

// closeTimeout bounds the node's drain when the bench closes engine a.
const closeTimeout = time.Minute

func (e *nodeEngine) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	err := e.node.Close(ctx)
	err = errors.Join(err, e.lease.Close(ctx))
	return errors.Join(err, e.store.Close())
}
