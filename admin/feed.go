package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/sequencer-im/sequencer/persist"
)

// FeedBacklog is the firehose's backlog as the store's outbox holds it
// (`sequencer admin feed`): per partition with a backlog, the conversations
// that owe the broker messages and how many. Read from the store, so it is
// the same on every node, and includes acks a node has not recorded yet
// (at most its last 100 ms).
type FeedBacklog struct {
	Partitions    int             `json:"partitions"`
	Messages      uint64          `json:"messages"`
	Conversations int             `json:"conversations"`
	Backlog       []FeedPartition `json:"backlog"` // partitions with a backlog, ascending
}

// FeedPartition is one partition's backlog.
type FeedPartition struct {
	Partition     uint32 `json:"partition"`
	Conversations int    `json:"conversations"`
	Messages      uint64 `json:"messages"`
	// Worst is the conversation owing the most messages, WorstCount how many.
	Worst      string `json:"worst_conv_id"`
	WorstCount uint64 `json:"worst_messages"`
}

// Feed reads every partition's outbox rows (a cost in proportion to the
// backlog, not to the number of conversations).
func (a *Admin) Feed(ctx context.Context) (FeedBacklog, error) {
	ob, ok := a.store.(persist.Outbox)
	if !ok {
		return FeedBacklog{}, errors.New("feed: this store has no outbox")
	}
	out := FeedBacklog{Partitions: a.partitions()}
	for p := uint32(0); p < uint32(out.Partitions); p++ {
		fp := FeedPartition{Partition: p}
		after := ""
		for {
			rows, err := ob.OutboxPending(ctx, p, after, 1000)
			if err != nil {
				return FeedBacklog{}, fmt.Errorf("feed: partition %d: %w", p, err)
			}
			for _, r := range rows {
				if r.Head <= r.Published {
					continue // published in full, not yet swept
				}
				n := r.Head - r.Published
				fp.Conversations++
				fp.Messages += n
				if n > fp.WorstCount {
					fp.Worst, fp.WorstCount = r.ConvID, n
				}
			}
			if len(rows) < 1000 {
				break
			}
			after = rows[len(rows)-1].ConvID
		}
		if fp.Conversations > 0 {
			out.Backlog = append(out.Backlog, fp)
			out.Messages += fp.Messages
			out.Conversations += fp.Conversations
		}
	}
	return out, nil
}

func (f FeedBacklog) Table() Table {
	t := Table{Lines: []string{fmt.Sprintf("firehose backlog: %d messages of %d conversations in %d of %d partitions",
		f.Messages, f.Conversations, len(f.Backlog), f.Partitions)}}
	if len(f.Backlog) == 0 {
		return t
	}
	t.Header = []string{"PARTITION", "CONVERSATIONS", "MESSAGES", "MOST BEHIND"}
	for _, p := range f.Backlog {
		t.Rows = append(t.Rows, []string{u(uint64(p.Partition)), fmt.Sprint(p.Conversations), u(p.Messages),
			fmt.Sprintf("%s (%d)", p.Worst, p.WorstCount)})
	}
	return t
}
