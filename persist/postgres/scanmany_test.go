package postgres

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// pgTime decodes binary timestamptz values as pgx does, on both sides of
// PostgreSQL's epoch, and refuses the infinities.
func TestPgTimeDecodesBinaryTimestamps(t *testing.T) {
	enc := func(us int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(us)) }
	epoch := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, want := range []time.Time{
		epoch,
		epoch.Add(-500 * time.Millisecond),
		epoch.Add(-time.Microsecond),
		time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 5, 10, 20, 30, 123_000_000, time.UTC),
	} {
		got, err := pgTime(enc(want.Sub(epoch).Microseconds()))
		if err != nil || !got.Equal(want) || got.Location() != time.UTC {
			t.Fatalf("pgTime(%v) = %v, %v", want, got, err)
		}
	}
	for _, us := range []int64{1<<63 - 1, -1 << 63} {
		if _, err := pgTime(enc(us)); err == nil {
			t.Fatalf("pgTime(%d): no error for an infinite timestamp", us)
		}
	}
}

// A read's bodies share blocks that start small and double up to
// bodyBlock: a message kept from a read of a few keeps a small block alive,
// not 64 KiB (issue 33: 10,000 Subscribe streams each holding the one
// message of its backlog read held 625 MB). Each body is its own bytes,
// with no room to append into a neighbour.
func TestManyDecoderBlocksGrowFromSmall(t *testing.T) {
	body := func(i, n int) []byte {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(i + j)
		}
		return b
	}
	var d manyDecoder
	first := d.body(body(0, 128))
	if c := cap(d.bodies); c > firstBlock {
		t.Fatalf("one 128-byte body took a %d-byte block, want at most %d", c, firstBlock)
	}
	got := [][]byte{first}
	blocks := []int{cap(d.bodies)}
	for i := 1; i < 3000; i++ {
		got = append(got, d.body(body(i, 128)))
		if c := cap(d.bodies); c != blocks[len(blocks)-1] || len(d.bodies) == 128 {
			blocks = append(blocks, c)
		}
	}
	want := []int{1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10}
	for i, w := range want {
		if i >= len(blocks) || blocks[i] != w {
			t.Fatalf("blocks %v, want them to start %v", blocks, want)
		}
	}
	for _, c := range blocks[len(want):] {
		if c != bodyBlock {
			t.Fatalf("blocks %v: a block after the largest is not %d bytes", blocks, bodyBlock)
		}
	}
	for i, b := range got {
		if string(b) != string(body(i, 128)) || cap(b) != len(b) {
			t.Fatalf("body %d: %d bytes (cap %d), not its own", i, len(b), cap(b))
		}
	}
	big := d.body(body(7, bodyBlock/4+1))
	if cap(big) != len(big) || string(big) != string(body(7, bodyBlock/4+1)) {
		t.Fatal("a body above a quarter block is not copied into its own allocation")
	}
	if e := d.body(nil); e == nil || len(e) != 0 {
		t.Fatal("an empty body must decode as empty, not nil")
	}
}

// ReadManySQL leaves each cursor's seq order to its LATERAL subquery
// (ORDER BY ord alone, no sort); ScanMessages checks it. The same columns
// in descending seq order must fail the read, not fill a page out of
// order (with LIMIT cutting the last page, that page could have a hole).
func TestScanMessagesRefusesRowsOutOfSeqOrder(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.Commit(ctx, []persist.ConvBatch{msgs("c", 0, 3, 1)}); err != nil {
		t.Fatal(err)
	}
	read := func(order string) ([]persist.Page, error) {
		b := &pgx.Batch{}
		b.Queue(ReadManyHeadsSQL, []string{"c"})
		b.Queue(`SELECT 1::bigint AS ord, ` + PageColumns + ` FROM im_message WHERE conv_id = 'c' ORDER BY seq ` + order)
		br := s.pool.SendBatch(ctx, b)
		defer br.Close()
		pages := make([]persist.Page, 1)
		if err := ScanHeads(br, pages, []int{0}); err != nil {
			return nil, err
		}
		return pages, ScanMessages(br, []persist.Cursor{{ConvID: "c"}}, pages, []int{0}, 10)
	}
	pages, err := read("ASC")
	if err != nil || len(pages[0].Messages) != 3 || pages[0].Messages[2].Seq != 3 {
		t.Fatalf("rows in order: %+v, %v", pages, err)
	}
	if _, err := read("DESC"); err == nil || !strings.Contains(err.Error(), "out of order") {
		t.Fatalf("rows out of seq order: err %v, want out of order", err)
	}
}

// ScanMessages decodes PageColumns' rows from their binary form, or through
// Scan when a column comes otherwise; both read the same messages, with
// the NULLs of PageColumns as the defaults they stand for, and an edit, a
// recall and their targets as they are stored.
func TestScanMessagesBinaryAndScanAgree(t *testing.T) {
	s, dsn := newStore(t)
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // every column in text
	textConn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer textConn.Close(ctx)
	b := msgs("c", 0, 3, 1)
	m1, m2 := b.Messages[0], b.Messages[1]
	if err := s.Commit(ctx, []persist.ConvBatch{b}); err != nil {
		t.Fatal(err)
	}
	events := msgs("c", 3, 2, 10)
	edit, recall := &events.Messages[0], &events.Messages[1]
	edit.Kind, edit.TargetMsgID, edit.Body = sequencer.KindEdit, m1.MsgID, []byte("edited")
	recall.Kind, recall.TargetMsgID, recall.Body = sequencer.KindRecall, m2.MsgID, []byte{}
	edit.ServerAt = m1.ServerAt.Add(time.Minute)
	recall.ServerAt = edit.ServerAt
	if err := s.Commit(ctx, []persist.ConvBatch{events}); err != nil {
		t.Fatal(err)
	}
	read := func(q interface {
		SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
	}) []persist.Page {
		b := &pgx.Batch{}
		b.Queue(ReadManyHeadsSQL, []string{"c"})
		b.Queue(ReadManySQL, []string{"c"}, []int64{0}, 100, 100)
		br := q.SendBatch(ctx, b)
		defer br.Close()
		pages := make([]persist.Page, 1)
		if err := ScanHeads(br, pages, []int{0}); err != nil {
			t.Fatal(err)
		}
		if err := ScanMessages(br, []persist.Cursor{{ConvID: "c"}}, pages, []int{0}, 100); err != nil {
			t.Fatal(err)
		}
		return pages
	}
	bin, text := read(s.pool), read(textConn)
	if len(bin[0].Messages) != 5 || len(text[0].Messages) != 5 || bin[0].Head != 5 || text[0].Head != 5 {
		t.Fatalf("pages %+v and %+v, want 5 messages and head 5 each", bin, text)
	}
	for i, m := range bin[0].Messages {
		want, err := s.GetMessage(ctx, m.MsgID)
		if err != nil {
			t.Fatal(err)
		}
		for _, got := range []sequencer.Message{m, text[0].Messages[i]} {
			if got.MsgID != want.MsgID || got.ConvID != "c" || got.Seq != want.Seq || got.FromUID != want.FromUID ||
				got.MsgType != want.MsgType || string(got.Body) != string(want.Body) || got.Body == nil ||
				got.ClientMsgID != want.ClientMsgID || !got.ServerAt.Equal(want.ServerAt) || got.Kind != want.Kind ||
				got.TargetMsgID != want.TargetMsgID || got.Recalled != want.Recalled || got.EditCount != want.EditCount ||
				!got.EditedAt.Equal(want.EditedAt) || got.ServerAt.Location() != time.UTC {
				t.Fatalf("message %d read as\n%+v, stored\n%+v", i, got, want)
			}
		}
	}
	got := bin[0].Messages
	if got[0].EditCount != 1 || got[0].EditedAt.IsZero() || string(got[0].Body) != "edited" || !got[1].Recalled ||
		got[3].Kind != sequencer.KindEdit || got[3].TargetMsgID != m1.MsgID || got[4].Kind != sequencer.KindRecall {
		t.Fatalf("the edit, the recall and their targets read as %+v", got)
	}
}

// PageReadSettingsSQL holds for the rest of its batch (ReadMany's
// statements plan generically, without JIT) and ends with it: the pool's
// connection is back to the server's settings for the next user.
func TestPageReadSettingsLastTheirBatch(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	settings := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (mode, jit string) {
		if err := q.QueryRow(ctx, `SELECT current_setting('plan_cache_mode'), current_setting('jit')`).Scan(&mode, &jit); err != nil {
			t.Fatal(err)
		}
		return mode, jit
	}
	mode0, jit0 := settings(conn)
	if mode0 == "force_generic_plan" {
		t.Fatalf("the server's plan_cache_mode is already %s: the test shows nothing", mode0)
	}
	b := &pgx.Batch{}
	b.Queue(PageReadSettingsSQL)
	b.Queue(`SELECT current_setting('plan_cache_mode'), current_setting('jit')`)
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		t.Fatal(err)
	}
	var mode, jit string
	if err := br.QueryRow().Scan(&mode, &jit); err != nil {
		t.Fatal(err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if mode != "force_generic_plan" || jit != "off" {
		t.Fatalf("inside the batch: plan_cache_mode %s, jit %s", mode, jit)
	}
	if m, j := settings(conn); m != mode0 || j != jit0 {
		t.Fatalf("after the batch: plan_cache_mode %s, jit %s; before it %s, %s", m, j, mode0, jit0)
	}
	// ReadMany still answers with them (its conformance cases run in TestConformance).
	if _, err := s.ReadMany(ctx, []persist.Cursor{{ConvID: "nobody"}}, 10, 10); err != nil {
		t.Fatal(err)
	}
}
