package mysql

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"strings"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

const messageColumns = `msg_id, conv_id, seq, from_uid, msg_type, body, client_msg_id, server_at,
	kind, target_msg_id, recalled, edit_count, edited_at`

// LoadHead returns conv's head from conv_head (0 if none).
func (s *Store) LoadHead(ctx context.Context, convID string) (uint64, error) {
	var head uint64
	err := s.read.QueryRowContext(ctx, `SELECT head FROM conv_head WHERE conv_id = ?`, convID).Scan(&head)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, unavailable("load head", err)
	}
	return head, nil
}

// FindByClientKey returns the message stored under key, or ErrNotFound.
func (s *Store) FindByClientKey(ctx context.Context, key sequencer.ClientKey) (sequencer.Message, error) {
	m, err := scanMessage(s.read.QueryRowContext(ctx, `SELECT `+messageColumns+` FROM im_message
		WHERE from_uid = ? AND client_msg_id = ?`, key.FromUID, key.ClientMsgID))
	if errors.Is(err, sql.ErrNoRows) {
		return sequencer.Message{}, notFound("client key (%d, %q)", key.FromUID, key.ClientMsgID)
	}
	if err != nil {
		return sequencer.Message{}, unavailable("find by client key", err)
	}
	return m, nil
}

// GetMessage returns the message with msgID, or ErrNotFound.
func (s *Store) GetMessage(ctx context.Context, msgID uint64) (sequencer.Message, error) {
	m, err := scanMessage(s.read.QueryRowContext(ctx, `SELECT `+messageColumns+` FROM im_message WHERE msg_id = ?`, msgID))
	if errors.Is(err, sql.ErrNoRows) {
		return sequencer.Message{}, notFound("msg_id %d", msgID)
	}
	if err != nil {
		return sequencer.Message{}, unavailable("get message", err)
	}
	return m, nil
}

// GetMessages returns the stored messages among ids, in any order, in one
// statement (persist.MessagesGetter).
func (s *Store) GetMessages(ctx context.Context, ids []uint64) ([]sequencer.Message, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var q strings.Builder
	args := make([]any, len(ids))
	q.WriteString(`SELECT ` + messageColumns + ` FROM im_message WHERE msg_id IN (`)
	for i, id := range ids {
		if i > 0 {
			q.WriteString(`,`)
		}
		q.WriteString(`?`)
		args[i] = id
	}
	q.WriteString(`)`)
	rows, err := s.read.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, unavailable("get messages", err)
	}
	defer rows.Close()
	out, err := persist.Collect(rows, func(r persist.Rows) (sequencer.Message, error) { return scanMessage(r) })
	if err != nil {
		return nil, unavailable("get messages", err)
	}
	return out, nil
}

// ReadRange returns up to limit messages of conv with seq > afterSeq, in
// seq order. A limit <= 0 returns none.
func (s *Store) ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error) {
	if limit <= 0 || afterSeq >= math.MaxInt64 {
		return nil, nil
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+messageColumns+` FROM im_message
		WHERE conv_id = ? AND seq > ? ORDER BY seq LIMIT ?`, convID, afterSeq, limit)
	if err != nil {
		return nil, unavailable("read range", err)
	}
	defer rows.Close()
	out, err := persist.Collect(rows, func(r persist.Rows) (sequencer.Message, error) { return scanMessage(r) })
	if err != nil {
		return nil, unavailable("read range", err)
	}
	return out, nil
}

// Trim deletes conv's messages with seq <= throughSeq. conv_head is kept.
func (s *Store) Trim(ctx context.Context, convID string, throughSeq uint64) error {
	if _, err := s.read.ExecContext(ctx, `DELETE FROM im_message WHERE conv_id = ? AND seq <= ?`, convID, throughSeq); err != nil {
		return unavailable("trim", err)
	}
	return nil
}

// TrimBefore implements persist.Store (retention): the next limit
// conversations of conv_head after `after` (binary order of conv_id), and for
// each the rows below the first seq whose server_at is at or after before.
// One transaction per step; conv_head is only read.
func (s *Store) TrimBefore(ctx context.Context, before time.Time, after string, limit int) (string, int, error) {
	if limit < 1 {
		return "", 0, errors.New("mysql: trim: limit must be >= 1")
	}
	rows, err := s.read.QueryContext(ctx, `SELECT conv_id, head FROM conv_head WHERE conv_id > ? ORDER BY conv_id LIMIT ?`, after, limit)
	if err != nil {
		return "", 0, unavailable("trim before", err)
	}
	convs, err := persist.Collect(rows, persist.ScanConvHead)
	rows.Close()
	if err != nil {
		return "", 0, unavailable("trim before", err)
	}
	next, deleted, err := persist.TrimStep(convs, limit, func(c persist.ConvHead) (int, error) {
		res, err := s.read.ExecContext(ctx, `DELETE FROM im_message WHERE conv_id = ? AND seq < COALESCE(
			(SELECT k FROM (SELECT MIN(seq) AS k FROM im_message WHERE conv_id = ? AND server_at >= ?) AS keep), ?)`,
			c.ConvID, c.ConvID, before.UTC(), c.Head+1)
		if err != nil {
			return 0, err
		}
		n, _ := res.RowsAffected()
		return int(n), nil
	})
	if err != nil {
		return "", deleted, unavailable("trim before", err)
	}
	return next, deleted, nil
}

type scanner interface{ Scan(dest ...any) error }

func scanMessage(row scanner) (sequencer.Message, error) {
	var m sequencer.Message
	var editedAt sql.NullTime
	if err := row.Scan(&m.MsgID, &m.ConvID, &m.Seq, &m.FromUID, &m.MsgType, &m.Body, &m.ClientMsgID, &m.ServerAt,
		&m.Kind, &m.TargetMsgID, &m.Recalled, &m.EditCount, &editedAt); err != nil {
		return sequencer.Message{}, err
	}
	m.ServerAt = m.ServerAt.UTC()
	if editedAt.Valid {
		m.EditedAt = editedAt.Time.UTC()
	}
	if m.Body == nil {
		m.Body = []byte{}
	}
	return m, nil
}
