package server

import (
	"context"
	"time"

	"github.com/sequencer-im/sequencer/internal/ratelog"
)

// watch logs the node's health as an operator needs it at the default
// level: the store becoming unreachable and the worker-id lease being lost
// are logged at once (WARN / ERROR), again once per logEvery while they
// last (with how long), and their end at INFO. Sends failing meanwhile
// are answered unavailable and are not logged one by one.
//
// It probes every interval: one store ping (bounded by the interval) and a
// look at the lease.
type watch struct {
	s        *Server
	interval time.Duration
	log      *ratelog.Logger

	storeDownSince time.Time // zero while reachable
	leaseLostSince time.Time // zero while held
}

// watchInterval is how often the node probes its store and lease; logEvery
// is how often one lasting condition is logged again.
const (
	watchInterval = time.Second
	logEvery      = 10 * time.Second
)

func (s *Server) startWatch(interval time.Duration) (stop func()) {
	w := &watch{s: s, interval: interval, log: ratelog.New(s.log, logEvery)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				w.probe(ctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}

func (w *watch) probe(ctx context.Context) {
	if w.s.draining.Load() {
		return
	}
	now := time.Now()
	pctx, cancel := context.WithTimeout(ctx, w.interval)
	err := w.s.store.Ping(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	switch {
	case err != nil && w.storeDownSince.IsZero():
		w.storeDownSince = now
		w.log.Warn("store down", "store unreachable: sends fail with unavailable until it is back", "err", err)
	case err != nil:
		w.log.Warn("store down", "store still unreachable", "for", now.Sub(w.storeDownSince).Round(time.Second), "err", err)
	case !w.storeDownSince.IsZero():
		w.s.log.Info("store reachable again", "was_down_for", now.Sub(w.storeDownSince).Round(time.Millisecond))
		w.storeDownSince = time.Time{}
	}
	held := w.s.lease.Ready()
	switch {
	case !held && w.leaseLostSince.IsZero():
		w.leaseLostSince = now
		w.log.Error("lease lost", "worker-id lease not held: no msg_id can be issued, sends fail with unavailable")
	case !held:
		w.log.Error("lease lost", "worker-id lease still not held", "for", now.Sub(w.leaseLostSince).Round(time.Second))
	case !w.leaseLostSince.IsZero():
		wid, _ := w.s.lease.WorkerID()
		w.s.log.Info("worker-id lease held again", "worker_id", wid, "was_lost_for", now.Sub(w.leaseLostSince).Round(time.Millisecond))
		w.leaseLostSince = time.Time{}
	}
}
