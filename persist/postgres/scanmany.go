package postgres

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// ScanHeads reads a ReadManyHeadsSQL answer: ordinal k is pages[idx[k-1]].
func ScanHeads(br pgx.BatchResults, pages []persist.Page, idx []int) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var ord, head int64
		if err := rows.Scan(&ord, &head); err != nil {
			return err
		}
		if ord < 1 || int(ord) > len(idx) {
			return fmt.Errorf("postgres: read many: head for ordinal %d of %d", ord, len(idx))
		}
		pages[idx[ord-1]].Head = uint64(head)
	}
	return rows.Err()
}

// PageColumns are ReadManySQL's message columns: MessageColumns without
// conv_id (a row's conversation is its cursor's) and with the event and
// edit columns NULL where they hold their defaults, as they do for nearly
// every message. A NULL costs PostgreSQL a length word where a value costs
// a call of its output function: a PullMany of 1,000 conversations x 10
// messages read 13.0 ms with MessageColumns, 10.7 ms with these
// (docs/BENCHMARKS.md).
const PageColumns = `msg_id, seq, from_uid, msg_type, body, client_msg_id, server_at,
	NULLIF(kind, 0) AS kind, NULLIF(target_msg_id, 0) AS target_msg_id, NULLIF(recalled, false) AS recalled,
	NULLIF(edit_count, 0) AS edit_count, edited_at`

// ScanMessages reads a ReadManySQL answer (the ordinal, then PageColumns)
// into pages[idx[ord-1]], whose heads ScanHeads set and whose cursor is
// cursors[idx[ord-1]]; a conversation's rows must come in ascending seq
// order, else it fails. limit is the read's per-conversation limit: a
// page's slice is made once, for min(limit, head-seq+1) messages.
//
// A ReadMany answers up to thousands of rows (PullMany: 1,000
// conversations x 10), so the rows are decoded from their binary form
// (RawValues) rather than through Scan, and the bytes they share are
// allocated in bulk: the bodies in blocks (bodyBlock). When a column does
// not come in the binary format this expects, every row goes through Scan
// instead.
func ScanMessages(br pgx.BatchResults, cursors []persist.Cursor, pages []persist.Page, idx []int, limit int) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	var d manyDecoder
	raw, checked := false, false
	for rows.Next() {
		if !checked {
			raw, checked = rawDecodable(rows.FieldDescriptions()), true
		}
		var ord int64
		var m sequencer.Message
		if raw {
			ord, err = d.decode(rows.RawValues(), &m)
		} else {
			ord, m, err = scanPageRow(rows)
		}
		if err != nil {
			return err
		}
		if ord < 1 || int(ord) > len(idx) {
			return fmt.Errorf("postgres: read many: row for ordinal %d of %d", ord, len(idx))
		}
		i := idx[ord-1]
		p := &pages[i]
		m.ConvID = cursors[i].ConvID
		if n := len(p.Messages); n > 0 && p.Messages[n-1].Seq >= m.Seq {
			return fmt.Errorf("postgres: read many: conversation %q: seq %d came after seq %d (rows out of order)", m.ConvID, m.Seq, p.Messages[n-1].Seq)
		}
		if p.Messages == nil {
			n := uint64(1) // this message, and those up to the head
			if p.Head > m.Seq {
				n += p.Head - m.Seq
			}
			p.Messages = make([]sequencer.Message, 0, int(min(n, uint64(max(limit, 1)))))
		}
		p.Messages = append(p.Messages, m)
	}
	return rows.Err()
}

// scanPageRow reads one ReadManySQL row through Scan.
func scanPageRow(rows pgx.Rows) (int64, sequencer.Message, error) {
	var m sequencer.Message
	var ord, msgID, seq, from int64
	var target *int64
	var kind *int16
	var edits *int32
	var recalled *bool
	var editedAt *time.Time
	if err := rows.Scan(&ord, &msgID, &seq, &from, &m.MsgType, &m.Body, &m.ClientMsgID, &m.ServerAt,
		&kind, &target, &recalled, &edits, &editedAt); err != nil {
		return 0, sequencer.Message{}, err
	}
	m.MsgID, m.Seq, m.FromUID = uint64(msgID), uint64(seq), uint64(from)
	m.ServerAt = m.ServerAt.UTC()
	if kind != nil {
		m.Kind = sequencer.Kind(*kind)
	}
	if target != nil {
		m.TargetMsgID = uint64(*target)
	}
	m.Recalled = recalled != nil && *recalled
	if edits != nil {
		m.EditCount = uint32(*edits)
	}
	if editedAt != nil {
		m.EditedAt = editedAt.UTC()
	}
	if m.Body == nil {
		m.Body = []byte{}
	}
	return ord, m, nil
}

// pageColumn is how manyDecoder reads one of ReadManySQL's columns.
type pageColumn struct {
	width    int  // its binary width; 0: any (the bytes themselves: bytea and text)
	text     bool // text: its text and binary forms are the same bytes
	nullable bool // NULL: its default (PageColumns)
}

var pageColumns = [...]pageColumn{
	{width: 8},                 // ord
	{width: 8},                 // msg_id
	{width: 8},                 // seq
	{width: 8},                 // from_uid
	{width: 2},                 // msg_type
	{},                         // body (bytea)
	{text: true},               // client_msg_id
	{width: 8},                 // server_at (timestamptz: microseconds since 2000-01-01 UTC)
	{width: 2, nullable: true}, // kind
	{width: 8, nullable: true}, // target_msg_id
	{width: 1, nullable: true}, // recalled
	{width: 4, nullable: true}, // edit_count
	{width: 8, nullable: true}, // edited_at (NULL: never edited)
}

// rawDecodable reports whether the columns come as manyDecoder reads
// them: binary, except the text columns.
func rawDecodable(fds []pgconn.FieldDescription) bool {
	if len(fds) != len(pageColumns) {
		return false
	}
	for i, fd := range fds {
		if !pageColumns[i].text && fd.Format != pgx.BinaryFormatCode {
			return false
		}
	}
	return true
}

// Bodies are copied into blocks: the first of a read holds firstBlock
// bytes, each next one twice the last, up to bodyBlock. A message keeps
// its whole block alive, so a read of a few messages must not allocate
// a large block: a Subscribe stream that holds the one message of its
// backlog read held 64 KiB, and 10,000 streams 625 MB (issue 33).
const (
	firstBlock = 1 << 10
	bodyBlock  = 64 << 10
)

// manyDecoder decodes ReadManySQL rows from their binary form.
type manyDecoder struct {
	bodies []byte // the current block: bodies are cut from its free end
}

// pgEpoch is PostgreSQL's timestamp zero, in Unix seconds.
const pgEpoch = 946_684_800

// decode decodes one row into m (all but its ConvID) and returns its
// ordinal.
func (d *manyDecoder) decode(v [][]byte, m *sequencer.Message) (int64, error) {
	if len(v) != len(pageColumns) {
		return 0, fmt.Errorf("postgres: read many: %d columns, want %d", len(v), len(pageColumns))
	}
	for i, c := range pageColumns {
		switch {
		case v[i] == nil && !c.nullable:
			return 0, fmt.Errorf("postgres: read many: column %d is NULL", i)
		case v[i] != nil && c.width != 0 && len(v[i]) != c.width:
			return 0, fmt.Errorf("postgres: read many: column %d has %d bytes, want %d", i, len(v[i]), c.width)
		}
	}
	be := binary.BigEndian
	ord := int64(be.Uint64(v[0]))
	m.MsgID, m.Seq, m.FromUID = be.Uint64(v[1]), be.Uint64(v[2]), be.Uint64(v[3])
	m.MsgType = int16(be.Uint16(v[4]))
	m.Body = d.body(v[5])
	m.ClientMsgID = string(v[6])
	var err error
	if m.ServerAt, err = pgTime(v[7]); err != nil {
		return 0, err
	}
	// The nullable columns: NULL is the default, zero.
	if v[8] != nil {
		m.Kind = sequencer.Kind(int16(be.Uint16(v[8])))
	}
	if v[9] != nil {
		m.TargetMsgID = be.Uint64(v[9])
	}
	m.Recalled = v[10] != nil && v[10][0] != 0
	if v[11] != nil {
		m.EditCount = be.Uint32(v[11])
	}
	if v[12] != nil {
		if m.EditedAt, err = pgTime(v[12]); err != nil {
			return 0, err
		}
	}
	return ord, nil
}

// body copies b into the current block (a new one when it is full, see
// firstBlock; a body larger than a quarter of the largest block gets its
// own allocation). The result's capacity is its length: an append to it
// never reaches a neighbour.
func (d *manyDecoder) body(b []byte) []byte {
	if len(b) == 0 {
		return []byte{}
	}
	if len(b) > bodyBlock/4 {
		return append(make([]byte, 0, len(b)), b...)
	}
	if cap(d.bodies)-len(d.bodies) < len(b) {
		size := firstBlock
		if d.bodies != nil {
			size = min(2*cap(d.bodies), bodyBlock)
		}
		d.bodies = make([]byte, 0, max(size, len(b)))
	}
	n := len(d.bodies)
	d.bodies = append(d.bodies, b...)
	return d.bodies[n:len(d.bodies):len(d.bodies)]
}

// pgTime decodes a binary timestamptz (microseconds since 2000-01-01 UTC).
func pgTime(b []byte) (time.Time, error) {
	us := int64(binary.BigEndian.Uint64(b))
	sec, rem := us/1_000_000, us%1_000_000
	if rem < 0 {
		sec, rem = sec-1, rem+1_000_000
	}
	const infinity = 1<<63 - 1
	if us == infinity || us == -infinity-1 {
		return time.Time{}, fmt.Errorf("postgres: read many: infinite timestamp")
	}
	return time.Unix(pgEpoch+sec, rem*1000).UTC(), nil
}
