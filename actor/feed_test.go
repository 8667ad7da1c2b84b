package actor

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist/faulty"
	"github.com/sequencer-im/sequencer/persist/memstore"
)

// published records what the actors told the feed.
type published struct {
	mu   sync.Mutex
	msgs map[string][]sequencer.Message
}

func (p *published) Publish(convID string, msgs []sequencer.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs[convID] = append(p.msgs[convID], msgs...)
}

// The feed hears of every acknowledged message, per conversation in seq
// order, and of nothing the store does not hold, also when commits fail,
// report errors after landing, or land late.
func TestFeedGetsOnlyStoredMessages(t *testing.T) {
	inner := memstore.New()
	fs := faulty.New(inner, 7, proofRates)
	pub := &published{msgs: map[string][]sequencer.Message{}}
	n := newNode(t, Config{Store: fs, Feed: pub})
	ctx := context.Background()
	acked := map[string][]uint64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				conv := fmt.Sprint("g:", i%5)
				res, err := n.Send(ctx, req(conv, fmt.Sprint("w", w, "-", i)))
				if err == nil {
					mu.Lock()
					acked[conv] = append(acked[conv], res.Seq)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	fs.SetRates(faulty.Rates{})
	pub.mu.Lock()
	defer pub.mu.Unlock()
	for conv, seqs := range acked {
		got := map[uint64]uint64{}
		last := uint64(0)
		for _, m := range pub.msgs[conv] {
			stored, err := inner.ReadRange(ctx, conv, m.Seq-1, 1)
			if err != nil || len(stored) != 1 || stored[0].MsgID != m.MsgID {
				t.Fatalf("%s: published seq %d (msg_id %d) is not what the store holds (%v, %v)", conv, m.Seq, m.MsgID, stored, err)
			}
			if m.Seq > last {
				last = m.Seq
			}
			got[m.Seq] = m.MsgID
		}
		for _, s := range seqs {
			if _, ok := got[s]; !ok {
				t.Fatalf("%s: acked seq %d never published", conv, s)
			}
		}
	}
}
