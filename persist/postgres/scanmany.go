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

// ScanMessages reads a ReadManySQL answer (the ordinal, then
// MessageColumns) into pages[idx[ord-1]], whose heads ScanHeads set; a
// conversation's rows must come in ascending seq order, else it fails. limit
// is the read's per-conversation limit: a page's slice is made once, for
// min(limit, head-seq+1) messages.
//
// A ReadMany answers up to thousands of rows (PullMany: 1,000
// conversations x 10), so the rows are decoded from their binary form
// (RawValues) rather than through Scan, and the bytes they share are
// allocated in bulk: the bodies in blocks (bodyBlock), a conversation's id
// once per page. When a column does not come in the binary format this
// expects, every row goes through Scan instead.
func ScanMessages(br pgx.BatchResults, pages []persist.Page, idx []int, limit int) error {
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
			ord, m, err = scanManyRow(rows)
		}
		if err != nil {
			return err
		}
		if ord < 1 || int(ord) > len(idx) {
			return fmt.Errorf("postgres: read many: row for ordinal %d of %d", ord, len(idx))
		}
		p := &pages[idx[ord-1]]
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

// scanManyRow reads one ReadManySQL row through Scan.
func scanManyRow(rows pgx.Rows) (int64, sequencer.Message, error) {
	var ord int64
	m, err := scanAfter(rows, &ord)
	return ord, m, err
}

// manyColumns is the binary width of ReadManySQL's columns (0: any, the
// bytes themselves: text and bytea).
var manyColumns = [...]int{
	8, // ord
	8, // msg_id
	0, // conv_id
	8, // seq
	8, // from_uid
	2, // msg_type
	0, // body (bytea)
	0, // client_msg_id
	8, // server_at (timestamptz: microseconds since 2000-01-01 UTC)
	2, // kind
	8, // target_msg_id
	1, // recalled
	4, // edit_count
	8, // edited_at (NULL: never edited)
}

// rawDecodable reports whether the columns come as manyDecoder reads
// them: binary, except the text columns (whose text and binary forms are
// the same bytes).
func rawDecodable(fds []pgconn.FieldDescription) bool {
	if len(fds) != len(manyColumns) {
		return false
	}
	for i, fd := range fds {
		if i == 2 || i == 7 {
			continue // text
		}
		if fd.Format != pgx.BinaryFormatCode {
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
	conv   string // the last row's conv_id (rows come grouped by conversation)
	bodies []byte // the current block: bodies are cut from its free end
}

// pgEpoch is PostgreSQL's timestamp zero, in Unix seconds.
const pgEpoch = 946_684_800

func (d *manyDecoder) decode(v [][]byte, m *sequencer.Message) (int64, error) {
	if len(v) != len(manyColumns) {
		return 0, fmt.Errorf("postgres: read many: %d columns, want %d", len(v), len(manyColumns))
	}
	for i, w := range manyColumns {
		if i == len(manyColumns)-1 && v[i] == nil {
			continue // edited_at NULL
		}
		if v[i] == nil {
			return 0, fmt.Errorf("postgres: read many: column %d is NULL", i)
		}
		if w != 0 && len(v[i]) != w {
			return 0, fmt.Errorf("postgres: read many: column %d has %d bytes, want %d", i, len(v[i]), w)
		}
	}
	be := binary.BigEndian
	ord := int64(be.Uint64(v[0]))
	m.MsgID = be.Uint64(v[1])
	if string(v[2]) != d.conv {
		d.conv = string(v[2])
	}
	m.ConvID = d.conv
	m.Seq, m.FromUID = be.Uint64(v[3]), be.Uint64(v[4])
	m.MsgType = int16(be.Uint16(v[5]))
	m.Body = d.body(v[6])
	m.ClientMsgID = string(v[7])
	var err error
	if m.ServerAt, err = pgTime(v[8]); err != nil {
		return 0, err
	}
	m.Kind, m.TargetMsgID = sequencer.Kind(int16(be.Uint16(v[9]))), be.Uint64(v[10])
	m.Recalled, m.EditCount = v[11][0] != 0, be.Uint32(v[12])
	if v[13] != nil {
		if m.EditedAt, err = pgTime(v[13]); err != nil {
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
