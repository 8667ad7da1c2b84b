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
// The outbox holds one small row per conversation that has messages not yet
// published to the broker: (partition, conv_id, published, head). A Commit
// of a batch whose Outbox.On is set writes it in the same transaction as the
// messages: a missing row is created with published = PrevHead (everything
// before this batch was published, or predates the firehose), an existing
// row keeps its published seq and takes head = LastSeq. So the rows are
// exactly the conversations with a backlog, keyed and ordered by
// (partition, conv_id): finding what is unpublished costs in proportion to
// the backlog, never to the number of conversations.
//
// The rules of the rows are here and in package firehose; a driver holds
// only the SQL.
type Outbox interface {
	// OutboxPending returns up to limit rows of partition part whose
	// conv_id sorts after `after` ("" starts), in conv_id order (the
	// store's byte order).
	OutboxPending(ctx context.Context, part uint32, after string, limit int) ([]OutboxRow, error)
	// OutboxAdvance moves each named row's published seq up to To (never
	// down: a row already at or past To is left alone), then deletes the
	// rows among them whose published seq reached their head, all in one
	// transaction. A row that does not exist is not created. It is called
	// only for seqs the broker acknowledged.
	OutboxAdvance(ctx context.Context, moves []OutboxMove) error
}

// OutboxRow is one conversation with unpublished messages: seqs
// Published+1..Head.
type OutboxRow struct {
	Partition uint32
	ConvID    string
	Published uint64
	Head      uint64
}

// OutboxMove raises a conversation's published seq to To.
type OutboxMove struct {
	Partition uint32
	ConvID    string
	To        uint64
}

// OutboxRowsOf returns the outbox upserts of a commit's batches: the
// batches with Outbox.On and at least one message, as rows (Published =
// PrevHead, Head = LastSeq), in the order given. A driver inserts each row
// or, when its (partition, conv_id) exists, sets only its head.
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
// store's version of the drivers' upsert): a new row as given, an existing
// one keeps its published seq and takes the new head.
func OutboxUpsert(stored *OutboxRow, row OutboxRow) OutboxRow {
	if stored == nil {
		return row
	}
	r := *stored
	r.Head = row.Head
	return r
}

// OutboxAdvanced applies a move to a stored row: the published seq only
// rises; keep is false when the row is to be deleted (published >= head).
func OutboxAdvanced(stored OutboxRow, to uint64) (row OutboxRow, keep bool) {
	stored.Published = max(stored.Published, to)
	return stored, stored.Published < stored.Head
}
