package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/idgen"
	"github.com/sequencer-im/sequencer/metrics"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/open"
	"github.com/sequencer-im/sequencer/server"
)

func init() {
	registerEngine(EngineSpec{
		Key: "a", Name: "sequencer, in process",
		About: "this sequencer's conversations in process (actor.Conversations): one actor per conversation assigns seqs, a group-commit writer stores " +
			"many conversations' batches per transaction; msg_ids from a leased worker id",
		NeedsSchema: true,
		Open:        openNode,
	})
	registerEngine(EngineSpec{
		Key: "a-sqlite", Name: "sequencer, in process, SQLite",
		About: "engine a on the embedded store (persist/sqlite, the default of 'sequencer serve'): a fresh SQLite file per scenario, " +
			"opened with the store's defaults (WAL, synchronous=FULL)",
		SQLite: true,
		Open:   openNode,
	})
}

// nodeEngine is engine (a): the actor.Conversations that `sequencer serve` runs, built
// the way package server builds it (store opened and migrated by
// persist/open with its defaults, worker id leased in the store, the
// server's default node settings), with no network in between. Only
// PassivateAfter comes from the bench (--passivate).
type nodeEngine struct {
	node  *actor.Conversations
	lease *idgen.Issuer
	store persist.Store
	m     *metrics.Set
}

func openNode(ctx context.Context, env Env) (Engine, error) {
	store, err := open.Store(ctx, env.DSN, open.Options{Pools: open.Pools{Commit: env.CommitWorkers}})
	if err != nil {
		return nil, err
	}
	def := server.DefaultConfig() // the knobs 'sequencer serve' runs with
	m := metrics.New()
	lcfg := def.IDs
	lcfg.Holder, lcfg.Metrics = "bench-"+randomID(), m
	lease, err := idgen.NewIssuer(store, lcfg)
	if err != nil {
		store.Close()
		return nil, err
	}
	if err := lease.Start(ctx); err != nil {
		_ = lease.Close(context.WithoutCancel(ctx))
		store.Close()
		return nil, fmt.Errorf("worker-id lease: %w", err)
	}
	acfg := def.Actors
	acfg.Store, acfg.IDs, acfg.Metrics = store, lease, m
	if env.CommitWorkers > 0 {
		acfg.Commit.Workers = env.CommitWorkers
	}
	acfg.Commit.KeepReadPositions = env.KeepReadPositions
	if env.Passivate > 0 {
		acfg.PassivateAfter = env.Passivate
	}
	node, err := actor.NewConversations(acfg)
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

// CPUSeconds is this process's CPU time: engine a runs in the bench, so the
// figure includes the senders.
func (e *nodeEngine) CPUSeconds(context.Context) (float64, error) {
	return procCPUSeconds(os.Getpid())
}

func (e *nodeEngine) CPUScope() string { return cpuScopeBench }

// closeTimeout bounds the node's drain when the bench closes engine a.
const closeTimeout = time.Minute

func (e *nodeEngine) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	err := e.node.Close(ctx)
	err = errors.Join(err, e.lease.Close(ctx))
	return errors.Join(err, e.store.Close())
}
