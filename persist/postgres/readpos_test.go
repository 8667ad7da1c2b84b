package postgres

import (
	"context"
	"testing"

	"github.com/sequencer-im/sequencer/persist"
)

// A position's raise is a HOT update (migration 0011: no index on
// read_seq, room on each page): the own-send rule in every commit and
// MarkRead rewrite no index entry. Counted in one transaction by
// pg_stat_xact_user_tables: every update of an existing position is HOT.
// An index on read_seq added back would make none of them HOT.
func TestReadPositionUpdatesAreHOT(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	const raises = 20
	for seq := 1; seq <= raises+1; seq++ { // the first inserts, the others update
		marks := []persist.Mark{{ConvID: "c", UID: 7, Seq: uint64(seq)}, {ConvID: "d", UID: 7, Seq: uint64(seq)}}
		if _, err := tx.Exec(ctx, senderMarksSQL, SenderMarksArrays(marks)...); err != nil {
			t.Fatal(err)
		}
	}
	var upd, hot int64
	if err := tx.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'read_position'`).Scan(&upd, &hot); err != nil {
		t.Fatal(err)
	}
	if upd != 2*raises || hot != upd {
		t.Fatalf("%d updates of read_position, %d of them HOT; want %d, all HOT", upd, hot, 2*raises)
	}
}
