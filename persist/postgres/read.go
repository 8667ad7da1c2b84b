package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// MessageColumns are the columns of im_message a read scans (ScanMessage).
const MessageColumns = `msg_id, conv_id, seq, from_uid, msg_type, body, client_msg_id, server_at,
	kind, target_msg_id, recalled, edit_count, edited_at`

// LoadHead returns conv's head from conv_head (0 if none). It never derives
// the head from the rows: retention may have deleted them.
func (s *Store) LoadHead(ctx context.Context, convID string) (uint64, error) {
	return LoadHeadOn(ctx, s.pool, convID)
}

// LoadHeadOn is LoadHead on pool (persist/citus: a worker's).
func LoadHeadOn(ctx context.Context, pool *pgxpool.Pool, convID string) (uint64, error) {
	var head int64
	err := pool.QueryRow(ctx, `SELECT head FROM conv_head WHERE conv_id = $1`, convID).Scan(&head)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, unavailable("load head", err)
	}
	return uint64(head), nil
}

// FindByClientKey returns the message stored under key, or ErrNotFound.
func (s *Store) FindByClientKey(ctx context.Context, key sequencer.ClientKey) (sequencer.Message, error) {
	if key.FromUID > math.MaxInt64 {
		return sequencer.Message{}, NotFound("client key (%d, %q)", key.FromUID, key.ClientMsgID)
	}
	m, err := ScanMessage(s.pool.QueryRow(ctx, `SELECT `+MessageColumns+` FROM im_message
		WHERE from_uid = $1 AND client_msg_id = $2`, int64(key.FromUID), key.ClientMsgID))
	if errors.Is(err, pgx.ErrNoRows) {
		return sequencer.Message{}, NotFound("client key (%d, %q)", key.FromUID, key.ClientMsgID)
	}
	if err != nil {
		return sequencer.Message{}, unavailable("find by client key", err)
	}
	return m, nil
}

// GetMessage returns the message with msgID, or ErrNotFound.
func (s *Store) GetMessage(ctx context.Context, msgID uint64) (sequencer.Message, error) {
	if msgID > math.MaxInt64 {
		return sequencer.Message{}, NotFound("msg_id %d", msgID)
	}
	m, err := ScanMessage(s.pool.QueryRow(ctx, `SELECT `+MessageColumns+` FROM im_message WHERE msg_id = $1`, int64(msgID)))
	if errors.Is(err, pgx.ErrNoRows) {
		return sequencer.Message{}, NotFound("msg_id %d", msgID)
	}
	if err != nil {
		return sequencer.Message{}, unavailable("get message", err)
	}
	return m, nil
}

// GetMessages returns the stored messages among ids, in any order, in one
// statement (persist.MessagesGetter).
func (s *Store) GetMessages(ctx context.Context, ids []uint64) ([]sequencer.Message, error) {
	keys := make([]int64, 0, len(ids))
	for _, id := range ids {
		if id <= math.MaxInt64 {
			keys = append(keys, int64(id))
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT `+MessageColumns+` FROM im_message WHERE msg_id = ANY($1)`, keys)
	if err != nil {
		return nil, unavailable("get messages", err)
	}
	defer rows.Close()
	out, err := persist.Collect(rows, func(r persist.Rows) (sequencer.Message, error) { return ScanMessage(r) })
	if err != nil {
		return nil, unavailable("get messages", err)
	}
	return out, nil
}

// ReadRange returns up to limit messages of conv with seq > afterSeq, in
// seq order. A limit <= 0 returns none.
func (s *Store) ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error) {
	return ReadRangeOn(ctx, s.pool, convID, afterSeq, limit)
}

// ReadRangeOn is ReadRange on pool (persist/citus: a worker's).
func ReadRangeOn(ctx context.Context, pool *pgxpool.Pool, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error) {
	if limit <= 0 || afterSeq >= math.MaxInt64 {
		return nil, nil
	}
	rows, err := pool.Query(ctx, `SELECT `+MessageColumns+` FROM im_message
		WHERE conv_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`, convID, int64(afterSeq), limit)
	if err != nil {
		return nil, unavailable("read range", err)
	}
	defer rows.Close()
	out, err := persist.Collect(rows, func(r persist.Rows) (sequencer.Message, error) { return ScanMessage(r) })
	if err != nil {
		return nil, unavailable("read range", err)
	}
	return out, nil
}

// Trim deletes conv's messages with seq <= throughSeq. conv_head is kept.
func (s *Store) Trim(ctx context.Context, convID string, throughSeq uint64) error {
	if throughSeq > math.MaxInt64 {
		throughSeq = math.MaxInt64
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM im_message WHERE conv_id = $1 AND seq <= $2`, convID, int64(throughSeq)); err != nil {
		return unavailable("trim", err)
	}
	return nil
}

// ScanMessage reads a row of MessageColumns.
func ScanMessage(row pgx.Row) (sequencer.Message, error) { return scanAfter(row) }

// scanAfter scans dest's columns, then MessageColumns.
func scanAfter(row pgx.Row, dest ...any) (sequencer.Message, error) {
	var m sequencer.Message
	var msgID, seq, from, target int64
	var kind int16
	var edits int32
	var editedAt *time.Time
	if err := row.Scan(append(dest, &msgID, &m.ConvID, &seq, &from, &m.MsgType, &m.Body, &m.ClientMsgID, &m.ServerAt,
		&kind, &target, &m.Recalled, &edits, &editedAt)...); err != nil {
		return sequencer.Message{}, err
	}
	m.MsgID, m.Seq, m.FromUID = uint64(msgID), uint64(seq), uint64(from)
	m.ServerAt = m.ServerAt.UTC()
	m.Kind, m.TargetMsgID, m.EditCount = sequencer.Kind(kind), uint64(target), uint32(edits)
	if editedAt != nil {
		m.EditedAt = editedAt.UTC()
	}
	if m.Body == nil {
		m.Body = []byte{}
	}
	return m, nil
}

// NotFound is sequencer.ErrNotFound with what was not found.
func NotFound(format string, args ...any) error {
	return fmt.Errorf("postgres: %s: %w", fmt.Sprintf(format, args...), sequencer.ErrNotFound)
}
