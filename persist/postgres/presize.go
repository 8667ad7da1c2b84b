package postgres

import (
	"database/sql/driver"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sequencer-im/sequencer/persist"
)

// A commit's INSERT carries its rows as ten arrays (84 bytes a row
// encoded, plus its conversation id, client key and body). pgx encodes a
// statement's arguments into one buffer per connection that it cuts back
// to 256 bytes before every statement (ExtendedQueryBuilder.reset), so each
// commit regrew it by appending, element by element, a copy at each
// doubling: 95 rows of BenchmarkEncodeCommitArgs allocated 73,744 bytes
// for 13,474 bytes of arguments. pgx has no setting for that buffer, but a
// statement's first argument can grow it once to what all of them need:
// presized carries that size, and the encode plan that registerPresize adds
// to every connection's type map grows the buffer by it before encoding the
// value as pgx would (24,872 bytes: the buffer once, and pgx's boxing of
// each element).
//
// The same happens once more on the way out: the connection's write buffer,
// which holds the whole pipeline (BEGIN to COMMIT) until it is sent, is
// also cut back to 1 KiB after every send (pgproto3.Frontend.Flush) and
// regrew by a copy for each large argument it took. growWriteBuffer asks it,
// before the pipeline is queued, for room for the whole pipeline.
// BenchmarkCommitMany: 226 KB allocated per commit of 95 rows before, 108
// KB with both (docs/BENCHMARKS.md).

// presized is an argument whose encoding, with the statement's arguments
// after it, takes about n bytes.
type presized[T any] struct {
	v T
	n int
}

type presizer interface{ presize() (any, int) }

func (p presized[T]) presize() (any, int) { return p.v, p.n }

// Value makes a presized argument encode as its value, only without the
// early growth, on a connection whose type map lacks registerPresize's plan.
func (p presized[T]) Value() (driver.Value, error) { return p.v, nil }

// registerPresize puts the presizing plan first among m's wrapping plans
// (pgx asks them for a value no codec takes, such as presized).
func registerPresize(m *pgtype.Map) {
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{tryWrapPresized}, m.TryWrapEncodePlanFuncs...)
}

func tryWrapPresized(value any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	p, ok := value.(presizer)
	if !ok {
		return nil, nil, false
	}
	v, _ := p.presize()
	return &presizePlan{}, v, true
}

// presizePlan grows the buffer by the value's size, then encodes the value
// with the plan pgx chose for it. pgx keeps one plan per argument type and
// column type, so the size is read from each value.
type presizePlan struct{ next pgtype.EncodePlan }

func (p *presizePlan) SetNext(next pgtype.EncodePlan) { p.next = next }

func (p *presizePlan) Encode(value any, buf []byte) ([]byte, error) {
	v, n := value.(presizer).presize()
	return p.next.Encode(v, slices.Grow(buf, n))
}

// PostgreSQL's binary array format (one dimension): a header per array,
// and per element its length before its value.
const (
	arrayHeaderBytes = 20 // dimensions, null flag, element type, length, lower bound
	elemLenBytes     = 4
)

// textIntArraysSize is the bytes a text array and ints int8 arrays of the
// same length take in PostgreSQL's binary array format.
func textIntArraysSize(texts []string, ints int) int {
	size := (1+ints)*arrayHeaderBytes + len(texts)*(elemLenBytes+ints*(elemLenBytes+8))
	for _, t := range texts {
		size += len(t)
	}
	return size
}

// growWriteBuffer makes room for about n bytes in the write buffer of conn,
// which must be idle and held by the caller: it queues a message that
// encodes to nothing and grows the buffer (pgproto3.Frontend.Send appends
// a message's encoding to the buffer, which the next Flush sends).
func growWriteBuffer(conn *pgconn.PgConn, n int) {
	conn.Frontend().Send(growMessage(n))
}

// growMessage is a frontend message of no bytes that leaves room for its
// value's worth after it.
type growMessage int

func (growMessage) Frontend()                {}
func (growMessage) Decode(data []byte) error { return nil }
func (n growMessage) Encode(dst []byte) ([]byte, error) {
	return slices.Grow(dst, int(n)), nil
}

var _ pgproto3.FrontendMessage = growMessage(0)

// pipelineSize is about the bytes a commit's pipeline takes: the rows'
// arguments, per conversation its head's compare-and-set and its senders'
// read positions (an id and three integers each), and 1 KiB for the
// statements' names, BEGIN and COMMIT.
func pipelineSize(batches []persist.ConvBatch, pieces []CommitPiece) int {
	n := 1024
	for i := range pieces {
		n += pieces[i].Rows.encodedSize()
	}
	for i := range batches {
		n += 2*len(batches[i].ConvID) + 96
	}
	return n
}
