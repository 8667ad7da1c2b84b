package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/ratelog"
)

// watch logs the node's health as an operator needs it at the default
// level: the store becoming unreachable and msg_ids becoming impossible to
// issue (the worker-id lease lost, or the clock stepped back behind the ids
// already issued) are logged at once (WARN / ERROR), again once per
// logEvery while they last (with how long), and their end at INFO. Sends
// failing meanwhile are answered unavailable and are not logged one by one.
//
// It probes every interval: one store ping (bounded by the interval) and a
// look at the issuer.
type watch struct {
	ping     func(context.Context) error
	issuable func() error // nil: msg_ids can be issued (idgen.Issuer.Issuable)
	kick     func()       // the store is reachable again (idgen.Issuer.Kick); nil: none
	draining func() bool
	interval time.Duration
	log      *slog.Logger
	limited  *ratelog.Logger

	storeDownSince time.Time // zero while reachable
	blockedSince   time.Time // zero while msg_ids can be issued
	blockedBy      string    // what blocks them: "lease" or "clock"
}

// watchInterval is how often the node probes its store and lease; logEvery
// is how often one lasting condition is logged again.
const (
	watchInterval = time.Second
	logEvery      = 10 * time.Second
)

func (s *Server) startWatch(interval time.Duration) (stop func()) {
	ping := keptPing(s.ping, func(err error) { s.lastPing.Store(&pingResult{err: err}) })
	w := newWatch(ping, s.lease.Issuable, s.draining.Load, interval, s.log)
	w.kick = s.lease.Kick
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

// keptPing returns ping, which also hands each answer to keep: a ping that
// timed out is kept (a store that does not answer is down), one that the
// watch's stop cut short is not.
func keptPing(ping func(context.Context) error, keep func(error)) func(context.Context) error {
	return func(ctx context.Context) error {
		err := ping(ctx)
		if !errors.Is(ctx.Err(), context.Canceled) {
			keep(err)
		}
		return err
	}
}

// sharedPing returns ping made one at a time: a call while one is in
// flight shares its answer (or ends with its own ctx) instead of starting
// another. PostgreSQL and MySQL ping on their control pool, beside the
// membership heartbeats and the worker-id lease: however often /readyz is
// probed while the store does not answer, the probes and the watch then
// hold at most one of its connections.
func sharedPing(ping func(context.Context) error) func(context.Context) error {
	var g singleflight.Group
	return func(ctx context.Context) error {
		ch := g.DoChan("", func() (any, error) { return nil, ping(ctx) })
		select {
		case r := <-ch:
			return r.Err
		case <-ctx.Done():
			return fmt.Errorf("ping: %w (%w)", sequencer.ErrStoreUnavailable, ctx.Err())
		}
	}
}

func newWatch(ping func(context.Context) error, issuable func() error, draining func() bool, interval time.Duration, log *slog.Logger) *watch {
	return &watch{ping: ping, issuable: issuable, draining: draining, interval: interval,
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
		if w.kick != nil {
			w.kick() // the issuer renews now, not at its next retry
		}
	}
	err = w.issuable()
	by := "lease"
	if errors.Is(err, sequencer.ErrClockMovedBackwards) {
		by = "clock"
	}
	switch {
	case err != nil && (w.blockedSince.IsZero() || by != w.blockedBy):
		w.endBlocked(now)
		w.blockedSince, w.blockedBy = now, by
		if by == "clock" {
			w.limited.Error("clock behind", "clock behind the msg_ids already issued: no msg_id can be issued until it catches up, sends fail with unavailable", "err", err)
		} else {
			w.limited.Error("lease lost", "worker-id lease not held: no msg_id can be issued, sends fail with unavailable", "err", err)
		}
	case err != nil && by == "clock":
		w.limited.Error("clock behind", "clock still behind the msg_ids already issued", "for", now.Sub(w.blockedSince).Round(time.Second), "err", err)
	case err != nil:
		w.limited.Error("lease lost", "worker-id lease still not held", "for", now.Sub(w.blockedSince).Round(time.Second), "err", err)
	default:
		w.endBlocked(now)
	}
}

// endBlocked logs the end of a stretch without msg_ids, if one was on.
func (w *watch) endBlocked(now time.Time) {
	if w.blockedSince.IsZero() {
		return
	}
	d := now.Sub(w.blockedSince).Round(time.Millisecond)
	if w.blockedBy == "clock" {
		w.log.Info("clock caught up: msg_ids can be issued again", "was_behind_for", d)
	} else {
		w.log.Info("worker-id lease held again", "was_lost_for", d)
	}
	w.blockedSince = time.Time{}
}
