package persist

import (
	"context"

	"github.com/sequencer-im/sequencer"
)

// OutboxMark is sequencer.OutboxMark: a ConvBatch's order to record its
// conversation in the firehose's outbox.
type OutboxMark = sequencer.OutboxMark

// Outbox is an optional ability of a Store: the firehose's durable cursor
// (package firehose; docs/FEED.md). Every store persist/open returns has it.
//
// The outbox holds one small row per recently written conversation:
// (partition, conv_id, published); its head is the conversation's head
// (conv_head), read with it. A Commit of a batch whose Outbox.On is set
// makes sure the row exists in the same transaction as the messages, after
// the head moved: a missing row is created with published = PrevHead
// (everything before this batch was published, or predates the firehose),
// an existing row is left alone. So a commit on a conversation that has a
// row writes nothing to the outbox (a key lookup), and the rows are the
// conversations with a backlog plus the ones published in full but not yet
// swept, keyed and ordered by (partition, conv_id): finding what is
// unpublished costs in proportion to the backlog and to the conversations
// written in the last sweep period, never to the number of conversations.
//
// The publisher raises published after the broker's acks (OutboxAdvance)
// and deletes the rows published in full some seconds later
// (OutboxSweep). A sweep never deletes a row whose conversation's head is
// past its published seq, and skips a conversation whose commit is in
// progress (its head row is locked): the commit either finds the row gone
// and creates it at its PrevHead, or keeps it.
//
// The rules of the rows are here and in package firehose; a driver holds
// only the SQL.
type Outbox interface {
	// OutboxPending returns up to limit rows of partition part whose
	// conv_id sorts after `after` ("" starts), in conv_id order (the
	// store's byte order), with Head the conversation's head. Rows
	// published in full (Published >= Head) are returned too: the
	// publisher sweeps them.
	OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]OutboxRow, error)
	// OutboxAdvance moves each named row's published seq up to To (never
	// down: a row already at or past To is left alone), in one
	// transaction. A row that does not exist is not created; no row is
	// deleted. It is called only for seqs the broker acknowledged.
	OutboxAdvance(ctx context.Context, moves []OutboxMove) error
	// OutboxSweep deletes the named rows that are published in full
	// (OutboxSwept): a row whose published seq is below its
	// conversation's head stays, and so does a row whose conversation
	// has a commit in progress (it is skipped, not waited for).
	OutboxSweep(ctx context.Context, keys []OutboxKey) error
}

// OutboxRow is one conversation of the outbox: seqs Published+1..Head are
// not yet published (none when Published >= Head).
type OutboxRow struct {
	Partition uint32
	ConvID    string
	Published uint64
	Head      uint64
}

// OutboxKey names an outbox row.
type OutboxKey struct {
	Partition uint32
	ConvID    string
}

// OutboxMove raises a conversation's published seq to To.
type OutboxMove struct {
	Partition uint32
	ConvID    string
	To        uint64
}

// OutboxRowsOf returns the outbox rows of a commit's batches: the batches
// with Outbox.On and at least one message, as rows (Published = PrevHead,
// Head = LastSeq), in the order given. A driver inserts each row whose
// (partition, conv_id) is missing and leaves an existing one alone
// (OutboxUpsert), after the commit's head update (which locks the
// conversation's head row against a sweep).
func OutboxRowsOf(batches []ConvBatch) []OutboxRow {
	var rows []OutboxRow
	for i := range batches {
		b := &batches[i]
		if !b.Outbox.On || len(b.Messages) == 0 {
			continue
		}
		rows = append(rows, OutboxRow{Partition: b.Outbox.Partition, ConvID: b.ConvID, Published: b.PrevHead, Head: b.LastSeq()})
	}
	return rows
}

// OutboxUpsert applies a commit's row to a stored row (the in-memory
// store's version of the drivers' insert): a new row as given, an existing
// one unchanged.
func OutboxUpsert(stored *OutboxRow, row OutboxRow) OutboxRow {
	if stored == nil {
		return row
	}
	return *stored
}

// OutboxAdvanced applies a move to a stored row: the published seq only
// rises.
func OutboxAdvanced(stored OutboxRow, to uint64) OutboxRow {
	stored.Published = max(stored.Published, to)
	return stored
}

// OutboxSwept reports whether a sweep deletes a row whose conversation's
// head is head: only when everything up to the head was published.
func OutboxSwept(published, head uint64) bool { return published >= head }
