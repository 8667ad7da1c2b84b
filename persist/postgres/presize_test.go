package postgres

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// insertDesc describes the INSERT's parameters as PostgreSQL does
// (UnnestRowsSQL's array types).
var insertDesc = &pgconn.StatementDescription{ParamOIDs: []uint32{
	pgtype.Int8ArrayOID, pgtype.TextArrayOID, pgtype.Int8ArrayOID, pgtype.Int8ArrayOID, pgtype.Int2ArrayOID,
	pgtype.ByteaArrayOID, pgtype.TextArrayOID, pgtype.TimestamptzArrayOID, pgtype.Int2ArrayOID, pgtype.Int8ArrayOID,
}}

func presizeRows(n int) *RowArrays {
	at := time.Date(2026, 12, 7, 0, 1, 2, 345_000_000, time.UTC)
	var b persist.ConvBatch
	for i := range n {
		m := sequencer.Message{
			MsgID: uint64(1<<40 + i), ConvID: fmt.Sprintf("conv-%d-é", i%7), Seq: uint64(i + 1), FromUID: uint64(i % 5),
			ClientMsgID: fmt.Sprintf("c-%d", i), Body: []byte(strings.Repeat("x", i%300)), ServerAt: at, MsgType: int16(i % 3),
		}
		if i%11 == 0 {
			m.Body = nil // stored as an empty body
		}
		if i%13 == 0 {
			m.Kind, m.TargetMsgID = sequencer.KindRecall, uint64(1<<40)
		}
		b.Messages = append(b.Messages, m)
	}
	return buildRows([]persist.ConvBatch{b})
}

func encodeArgs(t testing.TB, m *pgtype.Map, args []any) [][]byte {
	t.Helper()
	return encodeWith(t, m, insertDesc, args)
}

func encodeWith(t testing.TB, m *pgtype.Map, desc *pgconn.StatementDescription, args []any) [][]byte {
	t.Helper()
	var eqb pgx.ExtendedQueryBuilder
	if err := eqb.Build(m, desc, args); err != nil {
		t.Fatal(err)
	}
	return eqb.ParamValues
}

// A commit's arguments encode to the same bytes whether or not the
// connection presizes (registerPresize), and encodedSize is their size.
func TestPresizedArgumentsEncodeAsBefore(t *testing.T) {
	for _, n := range []int{1, 2, 95, 1000} {
		r := presizeRows(n)
		plain := r.Args()
		plain[0] = r.msgID // what Args gave before presizing
		want := encodeArgs(t, pgtype.NewMap(), plain)

		hooked := pgtype.NewMap()
		registerPresize(hooked)
		got := encodeArgs(t, hooked, r.Args())
		fallback := encodeArgs(t, pgtype.NewMap(), r.Args()) // a connection without the hook
		size := 0
		for i := range want {
			if !bytes.Equal(got[i], want[i]) || !bytes.Equal(fallback[i], want[i]) {
				t.Fatalf("%d rows: argument %d (%s) encodes differently when presized", n, i, InsertColumns[i])
			}
			size += len(want[i])
		}
		if r.encodedSize() != size {
			t.Fatalf("%d rows: encodedSize %d, the arguments take %d bytes", n, r.encodedSize(), size)
		}
	}
}

// The head checks' and the senders' read positions' arguments too: the
// same bytes, and textIntArraysSize is their size.
func TestPresizedHeadsAndMarksEncodeAsBefore(t *testing.T) {
	r := presizeRows(95)
	var b persist.ConvBatch
	b.ConvID = "conv-é"
	p := CommitPiece{Batches: []persist.ConvBatch{b, {ConvID: "c2"}, {ConvID: "conv-3"}}}
	p.prepare()
	marks := make([]persist.Mark, 0, r.Len())
	for i := range r.Len() {
		marks = append(marks, persist.Mark{ConvID: r.convID[i], UID: uint64(r.fromUID[i]), Seq: uint64(r.seq[i])})
	}
	ints := func(n int) []uint32 {
		oids := []uint32{pgtype.TextArrayOID}
		for range n {
			oids = append(oids, pgtype.Int8ArrayOID)
		}
		return oids
	}
	hooked := pgtype.NewMap()
	registerPresize(hooked)
	for _, c := range []struct {
		name string
		args []any
		ints int
	}{{"head check", p.Heads.Args(false), 2}, {"head compare-and-set", p.Heads.Args(true), 3}, {"read positions", SenderMarksArrays(marks), 2}} {
		desc := &pgconn.StatementDescription{ParamOIDs: ints(c.ints)}
		plain := append([]any{c.args[0].(presized[[]string]).v}, c.args[1:]...)
		want := encodeWith(t, pgtype.NewMap(), desc, plain)
		got := encodeWith(t, hooked, desc, c.args)
		size := 0
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("%s: argument %d encodes differently when presized", c.name, i)
			}
			size += len(want[i])
		}
		if n := c.args[0].(presized[[]string]).n; n != size {
			t.Fatalf("%s: presized for %d bytes, the arguments take %d", c.name, n, size)
		}
	}
}

// growMessage sends nothing: a commit's pipeline after it goes out byte for
// byte as without it, and the buffer it grew took the pipeline without
// regrowing (bytes allocated, counted, not timed).
func TestGrowMessageSendsNothing(t *testing.T) {
	r := presizeRows(95)
	bind := &pgproto3.Bind{PreparedStatement: "stmt_1", Parameters: encodeArgs(t, pgtype.NewMap(), r.Args())}
	var out bytes.Buffer
	f := pgproto3.NewFrontend(nil, &out)
	pipeline := func(grow int) ([]byte, uint64) {
		send := func() {
			out.Reset()
			if grow > 0 {
				f.Send(growMessage(grow))
			}
			f.Send(&pgproto3.Query{String: "BEGIN"})
			f.SendBind(bind)
			f.SendExecute(&pgproto3.Execute{})
			f.Send(&pgproto3.Query{String: "COMMIT"})
			if err := f.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		send()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range 10 {
			send()
		}
		runtime.ReadMemStats(&m1)
		return bytes.Clone(out.Bytes()), (m1.TotalAlloc - m0.TotalAlloc) / 10
	}
	want, before := pipeline(0)
	got, after := pipeline(pipelineSize(nil, []CommitPiece{{Rows: r}}))
	if !bytes.Equal(got, want) {
		t.Fatalf("with growMessage the pipeline sent %d bytes, without it %d", len(got), len(want))
	}
	t.Logf("a %d-byte pipeline allocated %d bytes without growMessage, %d with", len(want), before, after)
	if after*4 > before*3 {
		t.Fatalf("growMessage saved too little: %d bytes allocated, then %d", before, after)
	}
}

// With the hook the buffer of the arguments grows once instead of a dozen
// times: fewer allocations per encoding (counted, not timed).
func TestPresizedArgumentsGrowTheBufferOnce(t *testing.T) {
	r := presizeRows(95)
	plain := r.Args()
	plain[0] = r.msgID
	count := func(m *pgtype.Map, args []any) float64 {
		var eqb pgx.ExtendedQueryBuilder
		return testing.AllocsPerRun(20, func() {
			if err := eqb.Build(m, insertDesc, args); err != nil {
				t.Fatal(err)
			}
		})
	}
	hooked := pgtype.NewMap()
	registerPresize(hooked)
	before, after := count(pgtype.NewMap(), plain), count(hooked, r.Args())
	t.Logf("allocations per encoding of 95 rows: %.0f without presizing, %.0f with", before, after)
	if after > before-5 {
		t.Fatalf("presizing saved %.0f of %.0f allocations; the buffer still regrows", before-after, before)
	}
}

func BenchmarkEncodeCommitArgs(b *testing.B) {
	r := presizeRows(95)
	for _, hook := range []bool{false, true} {
		b.Run(fmt.Sprintf("presize=%v", hook), func(b *testing.B) {
			m, args := pgtype.NewMap(), r.Args()
			if hook {
				registerPresize(m)
			} else {
				args[0] = r.msgID
			}
			var eqb pgx.ExtendedQueryBuilder
			b.ReportAllocs()
			for b.Loop() {
				if err := eqb.Build(m, insertDesc, args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
