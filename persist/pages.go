package persist

import (
	"context"

	"github.com/sequencer-im/sequencer"
)

// Cursor is one conversation of a multi-conversation read (ReadMany) and
// the highest seq the caller already holds in it.
type Cursor struct {
	ConvID   string
	AfterSeq uint64
}

// Page is ReadMany's answer for one Cursor: the conversation's head and its
// messages with seq > AfterSeq, ascending.
type Page struct {
	Head     uint64
	Messages []sequencer.Message
}

// PageReader is the part of Reader that serves newest-first pages and
// catch-up over many conversations (Pull's before_seq, PullMany, the change
// feed's backlog). Every store implements it; storetest checks it.
type PageReader interface {
	// ReadBefore returns the newest limit messages of conv with
	// afterSeq < seq < beforeSeq, in ascending seq order. A limit <= 0
	// returns none.
	ReadBefore(ctx context.Context, convID string, afterSeq, beforeSeq uint64, limit int) ([]sequencer.Message, error)
	// ReadMany answers every cursor in one round trip to the store where
	// the store can (pages[i] answers cursors[i]): its conversation's head
	// (0 if never written) and up to limit messages with seq > AfterSeq,
	// ascending. At most total messages are returned overall, filling the
	// cursors in the order given (a later page may be cut short or empty).
	// The cursors name distinct conversations. A commit that lands during
	// the read may leave a page's messages past its head: the caller
	// raises the head to the last seq.
	ReadMany(ctx context.Context, cursors []Cursor, limit, total int) ([]Page, error)
}

// ReadManyEach is ReadMany for a store that reads one conversation at a
// time (the embedded store, where a round trip costs nothing; Citus, whose
// planner cannot push a list join down): a head and a ReadRange per cursor.
func ReadManyEach(ctx context.Context, r interface {
	LoadHead(ctx context.Context, convID string) (uint64, error)
	ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error)
}, cursors []Cursor, limit, total int) ([]Page, error) {
	pages := make([]Page, len(cursors))
	for i, c := range cursors {
		head, err := r.LoadHead(ctx, c.ConvID)
		if err != nil {
			return nil, err
		}
		pages[i].Head = head
		if n := min(limit, total); n > 0 && c.AfterSeq < head {
			ms, err := r.ReadRange(ctx, c.ConvID, c.AfterSeq, n)
			if err != nil {
				return nil, err
			}
			pages[i].Messages = ms
			total -= len(ms)
		}
	}
	return pages, nil
}
