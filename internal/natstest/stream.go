package natstest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Record is one message read back from the stream.
type Record struct {
	StreamSeq uint64
	Subject   string
	ConvID    string
	Seq       uint64
	MsgID     uint64
	Data      []byte
}

// ReadAll reads every message of stream, in stream order.
func ReadAll(t testing.TB, url, stream string) []Record {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := info.State.Msgs
	out := make([]Record, 0, total)
	if total == 0 {
		return out
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for uint64(len(out)) < total {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			h := m.Headers()
			seq, _ := strconv.ParseUint(h.Get("Sequencer-Seq"), 10, 64)
			id, _ := strconv.ParseUint(h.Get("Sequencer-Msg-Id"), 10, 64)
			if h.Get(jetstream.MsgIDHeader) != h.Get("Sequencer-Msg-Id") {
				t.Fatalf("stream seq %d: Nats-Msg-Id %q != Sequencer-Msg-Id %q", md.Sequence.Stream, h.Get(jetstream.MsgIDHeader), h.Get("Sequencer-Msg-Id"))
			}
			out = append(out, Record{StreamSeq: md.Sequence.Stream, Subject: m.Subject(), ConvID: h.Get("Sequencer-Conv-Id"),
				Seq: seq, MsgID: id, Data: m.Data()})
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("fetch: %v", err)
		}
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d messages of %s", len(out), total, stream)
		}
	}
	return out
}

// Stored is one stored message as the check needs it.
type Stored struct {
	Seq   uint64
	MsgID uint64
}

// Equal checks the stream holds exactly the stored messages: per
// conversation the same msg_ids in seq order, each once, none that is not
// stored, each on the subject PREFIX.<partition of its conversation>.
// from[conv] is the first seq the stream is expected to hold (1 when
// absent). It returns a description of the first difference, "" if none.
func Equal(recs []Record, stored map[string][]Stored, subjectOf func(conv string) string) string {
	byConv := map[string][]Record{}
	for _, r := range recs {
		byConv[r.ConvID] = append(byConv[r.ConvID], r)
		if want := subjectOf(r.ConvID); r.Subject != want {
			return fmt.Sprintf("conv %q seq %d on subject %q, want %q", r.ConvID, r.Seq, r.Subject, want)
		}
	}
	for conv := range byConv {
		if _, ok := stored[conv]; !ok {
			return fmt.Sprintf("the stream holds %d messages of conv %q, which has none stored", len(byConv[conv]), conv)
		}
	}
	for conv, want := range stored {
		got := byConv[conv]
		if len(got) != len(want) {
			return fmt.Sprintf("conv %q: %d messages in the stream, %d stored", conv, len(got), len(want))
		}
		for i := range want {
			if got[i].Seq != want[i].Seq || got[i].MsgID != want[i].MsgID {
				return fmt.Sprintf("conv %q: stream position %d holds seq %d msg_id %d, store has seq %d msg_id %d",
					conv, i, got[i].Seq, got[i].MsgID, want[i].Seq, want[i].MsgID)
			}
		}
	}
	return ""
}
