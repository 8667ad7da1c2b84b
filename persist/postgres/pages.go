package postgres

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// ReadBefore implements persist.PageReader: the newest limit rows below
// beforeSeq, read backwards and returned ascending.
func (s *Store) ReadBefore(ctx context.Context, convID string, afterSeq, beforeSeq uint64, limit int) ([]sequencer.Message, error) {
	if limit <= 0 || afterSeq >= math.MaxInt64 || beforeSeq <= afterSeq+1 {
		return nil, nil
	}
	rows, err := s.reader(convID).Query(ctx, `SELECT `+messageColumns+` FROM im_message
		WHERE conv_id = $1 AND seq > $2 AND seq < $3 ORDER BY seq DESC LIMIT $4`,
		convID, int64(afterSeq), int64(min(beforeSeq, math.MaxInt64)), limit)
	if err != nil {
		return nil, unavailable("read before", err)
	}
	defer rows.Close()
	out, err := persist.Collect(rows, func(r persist.Rows) (sequencer.Message, error) { return scanMessage(r) })
	if err != nil {
		return nil, unavailable("read before", err)
	}
	slices.Reverse(out)
	return out, nil
}

// readManyHeadsSQL and readManySQL are ReadMany's two statements, sent in
// one batch (one round trip): the cursors go in as arrays, unnest WITH
// ORDINALITY numbers them, and each cursor's range is a LATERAL index scan
// of uk_conv_seq.
const (
	readManyHeadsSQL = `SELECT c.ord, COALESCE(h.head, 0)
FROM unnest($1::text[]) WITH ORDINALITY AS c(conv_id, ord)
LEFT JOIN conv_head h ON h.conv_id = c.conv_id`
	readManySQL = `SELECT c.ord, m.msg_id, m.conv_id, m.seq, m.from_uid, m.msg_type, m.body, m.client_msg_id, m.server_at
FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS c(conv_id, after_seq, ord)
CROSS JOIN LATERAL (SELECT ` + messageColumns + ` FROM im_message
	WHERE conv_id = c.conv_id AND seq > c.after_seq ORDER BY seq LIMIT $3) m
ORDER BY c.ord, m.seq LIMIT $4`
)

// ReadMany implements persist.PageReader: two statements in one round trip.
// On Citus (distributed mode) a list joined with distributed tables cannot
// be pushed down, so there it reads one conversation at a time, each on
// its shard's worker.
func (s *Store) ReadMany(ctx context.Context, cursors []persist.Cursor, limit, total int) ([]persist.Page, error) {
	if s.dist != nil {
		return persist.ReadManyEach(ctx, s, cursors, limit, total)
	}
	pages := make([]persist.Page, len(cursors))
	convs := make([]string, len(cursors))
	afters := make([]int64, len(cursors))
	for i, c := range cursors {
		convs[i], afters[i] = c.ConvID, int64(min(c.AfterSeq, math.MaxInt64))
	}
	b := &pgx.Batch{}
	b.Queue(readManyHeadsSQL, convs)
	b.Queue(readManySQL, convs, afters, max(limit, 0), max(total, 0))
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return nil, unavailable("read many", err)
	}
	for rows.Next() {
		var ord, head int64
		if err := rows.Scan(&ord, &head); err != nil {
			rows.Close()
			return nil, unavailable("read many", err)
		}
		if ord < 1 || int(ord) > len(pages) {
			rows.Close()
			return nil, fmt.Errorf("postgres: read many: head for ordinal %d of %d", ord, len(pages))
		}
		pages[ord-1].Head = uint64(head)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, unavailable("read many", err)
	}
	rows, err = br.Query()
	if err != nil {
		return nil, unavailable("read many", err)
	}
	defer rows.Close()
	for rows.Next() {
		var m sequencer.Message
		var ord, msgID, seq, from int64
		if err := rows.Scan(&ord, &msgID, &m.ConvID, &seq, &from, &m.MsgType, &m.Body, &m.ClientMsgID, &m.ServerAt); err != nil {
			return nil, unavailable("read many", err)
		}
		if ord < 1 || int(ord) > len(pages) {
			return nil, fmt.Errorf("postgres: read many: row for ordinal %d of %d", ord, len(pages))
		}
		m.MsgID, m.Seq, m.FromUID, m.ServerAt = uint64(msgID), uint64(seq), uint64(from), m.ServerAt.UTC()
		if m.Body == nil {
			m.Body = []byte{}
		}
		pages[ord-1].Messages = append(pages[ord-1].Messages, m)
	}
	if err := rows.Err(); err != nil {
		return nil, unavailable("read many", err)
	}
	return pages, nil
}
