package citus

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// ReadMany on Citus reads each worker's shards in one round trip (2
// workers: 2 round trips for 60 conversations over every shard) and
// answers exactly what one read per conversation through Citus answers,
// the per-conversation limit and the total bound included.
func TestCitusReadManyOneRoundTripPerWorker(t *testing.T) {
	s, db := newCitusStore(t)
	ctx := context.Background()
	var cursors []persist.Cursor
	for i := range 60 {
		c := fmt.Sprintf("many-%d", i)
		var msgs []sequencer.Message
		for seq := range uint64(i % 5) {
			msgs = append(msgs, msgAt(c, seq+1))
		}
		if len(msgs) > 0 {
			if err := s.Commit(ctx, []persist.ConvBatch{{ConvID: c, Messages: msgs}}); err != nil {
				t.Fatal(err)
			}
		}
		cursors = append(cursors, persist.Cursor{ConvID: c, AfterSeq: uint64(i % 2)})
	}
	for _, tc := range []struct{ limit, total int }{{10, 1000}, {2, 1000}, {10, 7}} {
		before := s.DistStats()
		got, err := s.ReadMany(ctx, cursors, tc.limit, tc.total)
		if err != nil {
			t.Fatal(err)
		}
		st := s.DistStats()
		if n := st.ManyWorkerReads - before.ManyWorkerReads; n != int64(len(db.Workers)) || st.ManyEach != before.ManyEach {
			t.Fatalf("limit %d total %d: %d worker round trips, %d reads one at a time; want %d, 0", tc.limit, tc.total, n, st.ManyEach-before.ManyEach, len(db.Workers))
		}
		want, err := persist.ReadManyEach(ctx, s, cursors, tc.limit, tc.total)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if !reflect.DeepEqual(got[i].Head, want[i].Head) || len(got[i].Messages) != len(want[i].Messages) {
				t.Fatalf("limit %d total %d: %s: head %d, %d messages; one at a time: head %d, %d messages",
					tc.limit, tc.total, cursors[i].ConvID, got[i].Head, len(got[i].Messages), want[i].Head, len(want[i].Messages))
			}
			for j := range want[i].Messages {
				g, w := got[i].Messages[j], want[i].Messages[j]
				if g.MsgID != w.MsgID || g.Seq != w.Seq || string(g.Body) != string(w.Body) || !g.ServerAt.Equal(w.ServerAt) {
					t.Fatalf("%s message %d: %+v, one at a time %+v", cursors[i].ConvID, j, g, w)
				}
			}
		}
	}
}
