package postgres

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
		b.Queue(`SELECT 1::bigint AS ord, ` + MessageColumns + ` FROM im_message WHERE conv_id = 'c' ORDER BY seq ` + order)
		br := s.pool.SendBatch(ctx, b)
		defer br.Close()
		pages := make([]persist.Page, 1)
		if err := ScanHeads(br, pages, []int{0}); err != nil {
			return nil, err
		}
		return pages, ScanMessages(br, pages, []int{0}, 10)
	}
	pages, err := read("ASC")
	if err != nil || len(pages[0].Messages) != 3 || pages[0].Messages[2].Seq != 3 {
		t.Fatalf("rows in order: %+v, %v", pages, err)
	}
	if _, err := read("DESC"); err == nil || !strings.Contains(err.Error(), "out of order") {
		t.Fatalf("rows out of seq order: err %v, want out of order", err)
	}
}
