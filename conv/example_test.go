package conv_test

import (
	"fmt"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/conv"
	"github.com/sequencer-im/sequencer/persist"
)

// counter issues msg_ids 1001, 1002, ...
type counter struct{ next uint64 }

func (c *counter) NextID() (uint64, error) { c.next++; return 1000 + c.next, nil }

// Example shows how a caller drives the core, as actor.convActor does: feed
// it inputs (Send, and the answers of the store operations it asked for),
// then take its Ready and carry it out. The core performs no I/O; here a
// map stands in for the store.
func Example() {
	core, err := conv.New(conv.Config{ConvID: "g:1"})
	ids := &counter{}
	if err != nil {
		panic(err)
	}
	stored := map[uint64]sequencer.Message{} // seq -> row: the "store"
	var head uint64

	core.Send("alice", sequencer.SendRequest{ConvID: "g:1", FromUID: 7, ClientMsgID: "a", MsgType: 1, Body: []byte("hi")})
	core.Send("bob", sequencer.SendRequest{ConvID: "g:1", FromUID: 8, ClientMsgID: "b", MsgType: 1, Body: []byte("yo")})

	// The loop: carry out the Ready (at most one store operation), answer it.
	for {
		rd := core.Ready()
		for _, r := range rd.Replies {
			fmt.Printf("reply %v: seq %d msg_id %d err %v\n", r.Token, r.Result.Seq, r.Result.MsgID, r.Err)
		}
		switch {
		case rd.LoadHead:
			fmt.Println("load head")
			core.HeadLoaded(head, nil)
		case rd.Form > 0:
			// What the batch needs from the node: the fence (zero: a single
			// node), msg_ids and the time.
			f := conv.Formation{Now: time.Now()}
			for range rd.Form {
				id, _ := ids.NextID()
				f.IDs = append(f.IDs, id)
			}
			core.Formed(f)
		case rd.Commit != nil:
			fmt.Printf("commit seqs %d..%d\n", rd.Commit.PrevHead+1, rd.Commit.LastSeq())
			commit(rd.Commit, stored, &head)
			core.Committed(nil)
		case rd.Empty():
			fmt.Println("idle:", core.Idle())
			return
		}
	}
	// Both sends queued before the head was known, so they form one batch.
	// Output:
	// load head
	// commit seqs 1..2
	// reply alice: seq 1 msg_id 1001 err <nil>
	// reply bob: seq 2 msg_id 1002 err <nil>
	// idle: true
}

func commit(b *persist.ConvBatch, stored map[uint64]sequencer.Message, head *uint64) {
	for _, m := range b.Messages {
		stored[m.Seq] = m
	}
	*head = b.LastSeq()
}
