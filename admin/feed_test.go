package admin

import (
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/ring"
)

// TestFeedBacklog: `admin feed` sums the outbox rows per partition: what
// each conversation owes the broker (head - published), and nothing for a
// conversation whose cursor reached its head.
func TestFeedBacklog(t *testing.T) {
	spec, st := migrated(t, "sqlite")
	mark := func(conv string, prev uint64, n int) persist.ConvBatch {
		b := persist.ConvBatch{ConvID: conv, PrevHead: prev, Outbox: persist.OutboxMark{On: true, Partition: ring.PartitionOf(conv, testPartitions)}}
		for i := 1; i <= n; i++ {
			s := prev + uint64(i)
			b.Messages = append(b.Messages, sequencer.Message{MsgID: 1_000_000 + uint64(len(conv))*1000 + s, ConvID: conv, Seq: s,
				FromUID: 1, MsgType: 1, Body: []byte("b"), ClientMsgID: conv + "-" + u(s)})
		}
		return b
	}
	if err := st.Commit(ctx, []persist.ConvBatch{mark("g:a", 0, 5), mark("g:bb", 0, 2), mark("g:ccc", 0, 1)}); err != nil {
		t.Fatal(err)
	}
	ob := st.(persist.Outbox)
	if err := ob.OutboxAdvance(ctx, []persist.OutboxMove{
		{Partition: ring.PartitionOf("g:a", testPartitions), ConvID: "g:a", To: 2},
		{Partition: ring.PartitionOf("g:ccc", testPartitions), ConvID: "g:ccc", To: 1},
	}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	f, err := openAdmin(t, spec).Feed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if f.Messages != 5 || f.Conversations != 2 || f.Partitions != testPartitions {
		t.Fatalf("feed backlog %+v, want 5 messages (3 of g:a, 2 of g:bb) of 2 conversations", f)
	}
	var back FeedBacklog
	if table := rendered(t, f, &back); !strings.Contains(table, "5 messages of 2 conversations") || back.Messages != 5 {
		t.Fatalf("feed table:\n%s", table)
	}
}
