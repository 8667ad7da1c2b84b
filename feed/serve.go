package feed

import (
	"context"
	"fmt"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/internal/conf"
	"github.com/sequencer-im/sequencer/persist"
)

// Config bounds a node's feed. DefaultConfig holds every default; a zero
// field means its default.
type Config struct {
	// MaxQueue bounds one stream's buffer: live messages queued for it and
	// held back while its store reads catch up. A stream past it ends with
	// resource_exhausted (the subscriber resumes from its last seqs).
	MaxQueue int
	// MaxSubscriptions bounds the (stream, conversation) pairs of the node;
	// a Subscribe that would pass it is refused with resource_exhausted.
	MaxSubscriptions int
	// Heartbeat is how long a stream may stay silent before it gets a
	// Heartbeat event.
	Heartbeat time.Duration
	// ReadTimeout bounds one backlog read. A read past it ends the stream
	// with unavailable (the subscriber resumes, at any node): a store link
	// that stopped answering must not hold a stream open and silent, its
	// heartbeats too, for as long as the connection lives.
	ReadTimeout time.Duration
	// Clock times heartbeats; default the real clock.
	Clock clock.Clock
	// KeepReadPositions: the server runs with the own-send rule off
	// (--send-marks-read=false), so a message is no read tick of its
	// sender (readtick.go).
	KeepReadPositions bool

	// readPage is how many messages of one conversation a backlog read
	// asks for, readBudget how many one read returns at most (defaults
	// 256, 4096; tests set them small).
	readPage, readBudget int
}

// DefaultConfig returns every default.
func DefaultConfig() Config {
	return Config{MaxQueue: 4096, MaxSubscriptions: 1_000_000, Heartbeat: 15 * time.Second, ReadTimeout: 30 * time.Second}
}

// Validate reports every field that makes no sense, as given.
func (c Config) Validate() error {
	ch := conf.Checker{Pkg: "feed"}
	conf.Positive(&ch, "MaxQueue", c.MaxQueue)
	conf.Positive(&ch, "MaxSubscriptions", c.MaxSubscriptions)
	conf.PositiveDuration(&ch, "Heartbeat", c.Heartbeat)
	conf.PositiveDuration(&ch, "ReadTimeout", c.ReadTimeout)
	return ch.Err()
}

func (c *Config) fill() {
	d := DefaultConfig()
	if c.MaxQueue <= 0 {
		c.MaxQueue = d.MaxQueue
	}
	if c.MaxSubscriptions <= 0 {
		c.MaxSubscriptions = d.MaxSubscriptions
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = d.Heartbeat
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = d.ReadTimeout
	}
	if c.readPage <= 0 {
		c.readPage = 256
	}
	if c.readBudget <= 0 {
		c.readBudget = 4096
	}
	c.Clock = clock.Or(c.Clock)
}

// Store is what a stream reads its backlog from.
type Store interface {
	ReadMany(ctx context.Context, cursors []persist.Cursor, limit, total int) ([]persist.Page, error)
}

// maxReadCursors is the most conversations one backlog read names.
const maxReadCursors = 1000

// ErrBehind ends a stream whose subscriber fell behind its bounded buffer.
var ErrBehind = sequencer.Errorf(sequencer.CodeResourceExhausted,
	"this subscriber fell behind (its stream's buffer is full): subscribe again from the last seq received of each conversation")

// Subscription is one stream to serve.
type Subscription struct {
	Cursors []persist.Cursor // distinct conversations, validated
	Store   Store            // the backlog
	// Send writes one event to the subscriber; it may block (the
	// subscriber's flow control).
	Send func(Event) error
	// Cut, when set, is called (once, from a publisher's goroutine; it must
	// not block) when the stream falls behind: it must make a blocked Send
	// fail soon (a write deadline in the past).
	Cut func()
	// Flush, when set, is called after the events of one turn were sent
	// (what was pending at once: a backlog page, the live messages queued
	// meanwhile, a heartbeat): a transport can write them out together
	// instead of one flush per event.
	Flush func() error
	// ReadPositions: the stream also gets the live read-position changes
	// of its conversations (KindReadPosition events; readtick.go).
	ReadPositions bool
}

// Serve runs one stream until ctx ends, Send fails, or it must end:
// ErrBehind, the node's subscription bound (resource_exhausted), a failed
// store read (its error, retryable). It attaches to the hub first, then
// reads the backlog, so nothing committed in between is missed; Send gets
// every event in order.
func (h *Hub) Serve(ctx context.Context, sub Subscription) (err error) {
	defer func() {
		if err == ErrBehind {
			h.n.cut.Add(1)
		}
	}()
	cursors, store := sub.Cursors, sub.Store
	s, err := h.attach(cursors, sub.Cut)
	if err != nil {
		return err
	}
	send := func(e Event) error {
		if err := sub.Send(e); err != nil {
			if s.isBehind() {
				return ErrBehind
			}
			return err
		}
		if e.Kind == KindMessage {
			h.n.delivered.Add(1)
		} else if e.Kind == KindHeartbeat {
			h.n.heartbeats.Add(1)
		}
		return nil
	}
	flush := func() error {
		if sub.Flush == nil {
			return nil
		}
		if err := sub.Flush(); err != nil {
			if s.isBehind() {
				return ErrBehind
			}
			return err
		}
		return nil
	}
	defer h.detach(s, cursors)
	if sub.ReadPositions {
		defer h.watchReads(s)()
	}
	t := NewTail(cursors, h.cfg.MaxQueue)
	clk, hb := h.cfg.Clock, h.cfg.Heartbeat
	lastSent := clk.Now()
	timer, fired := clock.After(clk, hb)
	defer func() { timer.Stop() }()
	for {
		if err := s.take(t); err != nil {
			return err
		}
		if t.Overflow() {
			return ErrBehind
		}
		if reads := t.Reads(maxReadCursors); len(reads) > 0 {
			rctx, cancel := context.WithTimeout(ctx, h.cfg.ReadTimeout)
			pages, err := store.ReadMany(rctx, reads, h.cfg.readPage, h.cfg.readBudget)
			timedOut := rctx.Err() == context.DeadlineExceeded
			cancel()
			if err == nil && len(pages) != len(reads) {
				err = fmt.Errorf("feed: the store answered %d pages for %d cursors", len(pages), len(reads))
			}
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if timedOut {
					return sequencer.Errorf(sequencer.CodeUnavailable,
						"the store did not answer this stream's backlog read within %v: subscribe again from the last seq received of each conversation (at any node)", h.cfg.ReadTimeout)
				}
				return fmt.Errorf("feed: read the backlog: %w", err)
			}
			n := 0
			for _, p := range pages {
				n += len(p.Messages)
			}
			h.n.reads.Add(1)
			h.n.readMsgs.Add(uint64(n))
			for i, p := range pages {
				t.Backlog(reads[i].ConvID, p, n >= h.cfg.readBudget)
			}
		}
		evs := t.Take()
		for _, tk := range s.takeTicks() {
			evs = append(evs, Event{Kind: KindReadPosition, ConvID: tk.ConvID, UID: tk.UID, ReadSeq: tk.ReadSeq})
		}
		for _, ev := range evs {
			if err := send(ev); err != nil {
				return err
			}
		}
		if len(evs) > 0 {
			if err := flush(); err != nil {
				return err
			}
			lastSent = clk.Now()
		}
		t.Reuse(evs)
		if t.ReadDue() {
			continue
		}
		select {
		case <-s.wake:
		case <-fired:
			// Silent for hb since the last event: a heartbeat. Else wait
			// for the rest of hb after it.
			wait := hb - clk.Now().Sub(lastSent)
			if wait <= 0 {
				if err := send(Event{Kind: KindHeartbeat}); err != nil {
					return err
				}
				if err := flush(); err != nil {
					return err
				}
				lastSent, wait = clk.Now(), hb
			}
			timer, fired = clock.After(clk, wait)
		case <-ctx.Done():
			if s.isBehind() {
				return ErrBehind
			}
			return ctx.Err()
		}
	}
}
