package server

import (
	"context"
	"log/slog"
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
	ping      func(context.Context) error
	leaseHeld func() bool
	draining  func() bool
	interval  time.Duration
	log       *slog.Logger
	limited   *ratelog.Logger

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
	w := newWatch(s.store.Ping, s.lease.CanIssue, s.draining.Load, interval, s.log)
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

func newWatch(ping func(context.Context) error, leaseHeld, draining func() bool, interval time.Duration, log *slog.Logger) *watch {
	return &watch{ping: ping, leaseHeld: leaseHeld, draining: draining, interval: interval,
		log: log, limited: ratelog.New(log, logEvery)}
}

// probe checks the store and the lease once, at now.
func (w *watch) probe(ctx context.Context) { w.probeAt(ctx, time.Now()) }

func (w *watch) probeAt(ctx context.Context, now time.Time) {
	if w.draining() {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, w.interval)
	err := w.ping(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	switch {
	case err != nil && w.storeDownSince.IsZero():
		w.storeDownSince = now
		w.limited.Warn("store down", "store unreachable: sends fail with unavailable until it is back", "err", err)
	case err != nil:
		w.limited.Warn("store down", "store still unreachable", "for", now.Sub(w.storeDownSince).Round(time.Second), "err", err)
	case !w.storeDownSince.IsZero():
		w.log.Info("store reachable again", "was_down_for", now.Sub(w.storeDownSince).Round(time.Millisecond))
		w.storeDownSince = time.Time{}
	}
	held := w.leaseHeld()
	switch {
	case !held && w.leaseLostSince.IsZero():
		w.leaseLostSince = now
		w.limited.Error("lease lost", "worker-id lease not held: no msg_id can be issued, sends fail with unavailable")
	case !held:
		w.limited.Error("lease lost", "worker-id lease still not held", "for", now.Sub(w.leaseLostSince).Round(time.Second))
	case !w.leaseLostSince.IsZero():
		w.log.Info("worker-id lease held again", "was_lost_for", now.Sub(w.leaseLostSince).Round(time.Millisecond))
		w.leaseLostSince = time.Time{}
	}
}
