package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"math"
	"slices"
	"strings"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// ReadBefore implements persist.PageReader: the newest limit rows below
// beforeSeq, read backwards and returned ascending.
func (s *Store) ReadBefore(ctx context.Context, convID string, afterSeq, beforeSeq uint64, limit int) ([]sequencer.Message, error) {
	if limit <= 0 || afterSeq >= math.MaxInt64 || beforeSeq <= afterSeq+1 {
		return nil, nil
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+messageColumns+` FROM im_message
		WHERE conv_id = ? AND seq > ? AND seq < ? ORDER BY seq DESC LIMIT ?`, convID, afterSeq, beforeSeq, limit)
	if err != nil {
		return nil, unavailable("read before", err)
	}
	out, err := scanMessages(rows)
	if err != nil {
		return nil, unavailable("read before", err)
	}
	slices.Reverse(out)
	return out, nil
}

// ReadMany implements persist.PageReader in one statement: the heads, then
// one parenthesized range per cursor, UNION ALL (each uses uk_conv_seq).
// Column 1 tells a head row (0) from a message row (1); column 2 is the
// cursor's index.
func (s *Store) ReadMany(ctx context.Context, cursors []persist.Cursor, limit, total int) ([]persist.Page, error) {
	pages := make([]persist.Page, len(cursors))
	if len(cursors) == 0 {
		return pages, nil
	}
	var q strings.Builder
	args := make([]any, 0, 4*len(cursors))
	q.WriteString(`SELECT 0, ord, head, 0, '', 0, 0, 0, NULL, '', NULL, 0, 0, false, 0, NULL FROM (`)
	for i, c := range cursors {
		if i > 0 {
			q.WriteString(` UNION ALL `)
		}
		q.WriteString(`SELECT ? AS ord, ? AS conv_id`)
		args = append(args, i, c.ConvID)
	}
	q.WriteString(`) AS c JOIN conv_head h ON h.conv_id = c.conv_id`)
	if limit > 0 && total > 0 {
		for i, c := range cursors {
			if c.AfterSeq >= math.MaxInt64 {
				continue
			}
			q.WriteString(` UNION ALL (SELECT 1, ?, 0, ` + messageColumns + ` FROM im_message WHERE conv_id = ? AND seq > ? ORDER BY seq LIMIT ?)`)
			args = append(args, i, c.ConvID, c.AfterSeq, limit)
		}
	}
	rows, err := s.read.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, unavailable("read many", err)
	}
	defer rows.Close()
	for rows.Next() {
		var kind, ord int
		var head uint64
		var m sequencer.Message
		var at, editedAt sql.NullTime
		var body []byte
		if err := rows.Scan(&kind, &ord, &head, &m.MsgID, &m.ConvID, &m.Seq, &m.FromUID, &m.MsgType, &body, &m.ClientMsgID, &at,
			&m.Kind, &m.TargetMsgID, &m.Recalled, &m.EditCount, &editedAt); err != nil {
			return nil, unavailable("read many", err)
		}
		if ord < 0 || ord >= len(pages) {
			continue
		}
		if kind == 0 {
			pages[ord].Head = head
			continue
		}
		m.Body, m.ServerAt = body, at.Time.UTC()
		if editedAt.Valid {
			m.EditedAt = editedAt.Time.UTC()
		}
		if m.Body == nil {
			m.Body = []byte{}
		}
		pages[ord].Messages = append(pages[ord].Messages, m)
	}
	if err := rows.Err(); err != nil {
		return nil, unavailable("read many", err)
	}
	// UNION ALL promises no order: sort each page, then keep total
	// messages in cursor order.
	for i := range pages {
		slices.SortFunc(pages[i].Messages, func(a, b sequencer.Message) int { return cmp.Compare(a.Seq, b.Seq) })
		n := min(len(pages[i].Messages), total)
		pages[i].Messages = pages[i].Messages[:n:n]
		total -= n
	}
	return pages, nil
}

func scanMessages(rows *sql.Rows) ([]sequencer.Message, error) {
	defer rows.Close()
	var out []sequencer.Message
	for rows.Next() {
		m, err := scanMessage(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}
