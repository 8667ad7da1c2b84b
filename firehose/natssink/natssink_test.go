package natssink_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/firehose"
	"github.com/sequencer-im/sequencer/firehose/natssink"
	"github.com/sequencer-im/sequencer/internal/natstest"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/memstore"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/ring"
)

const parts = 8

func open(t *testing.T, url string, create bool) *natssink.Sink {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := natssink.Open(ctx, natssink.Config{URL: url, CreateStream: create, PublishTimeout: time.Second})
	if err != nil {
		t.Fatalf("open sink: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// writer commits messages like the conversation actors do: marked for the
// outbox, and handed to the live path unless told not to (a node killed
// between its commit and the publish).
type writer struct {
	st    *memstore.Store
	heads map[string]uint64
	id    uint64
}

func (w *writer) send(t *testing.T, pub *firehose.Publisher, conv string, n int, live bool) {
	t.Helper()
	prev := w.heads[conv]
	b := persist.ConvBatch{ConvID: conv, PrevHead: prev, Outbox: persist.OutboxMark{On: true, Partition: ring.PartitionOf(conv, parts)}}
	for i := 1; i <= n; i++ {
		w.id++
		b.Messages = append(b.Messages, sequencer.Message{MsgID: w.id, ConvID: conv, Seq: prev + uint64(i), FromUID: 1,
			MsgType: 1, Body: []byte("x"), ClientMsgID: fmt.Sprintf("c%d", w.id), ServerAt: time.Now()})
	}
	if err := w.st.Commit(context.Background(), []persist.ConvBatch{b}); err != nil {
		t.Fatal(err)
	}
	w.heads[conv] = prev + uint64(n)
	if live && pub != nil {
		pub.Publish(conv, b.Messages)
	}
}

func start(t *testing.T, st firehose.Store, sink firehose.Sink) (*firehose.Publisher, func()) {
	t.Helper()
	p, err := firehose.New(firehose.Config{Store: st, Sink: sink, Core: firehose.CoreConfig{Partitions: parts}, RescanEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.Run(ctx) }()
	return p, func() { cancel(); wg.Wait() }
}

func waitDrained(t *testing.T, st persist.Outbox) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		n := 0
		for p := uint32(0); p < parts; p++ {
			rows, err := st.OutboxPending(context.Background(), p, "", 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				if r.Head > r.Published {
					n++
				}
			}
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d conversations still owe messages to the stream", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func check(t *testing.T, nats *natstest.Server, w *writer, stream string) {
	t.Helper()
	stored := map[string][]natstest.Stored{}
	total := 0
	for conv := range w.heads {
		ms, err := w.st.ReadRange(context.Background(), conv, 0, 1_000_000)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			stored[conv] = append(stored[conv], natstest.Stored{Seq: m.Seq, MsgID: m.MsgID})
		}
		total += len(ms)
	}
	recs := natstest.ReadAll(t, nats.URL(), stream)
	if diff := natstest.Equal(recs, stored, func(c string) string { return fmt.Sprintf("sequencer.%d", ring.PartitionOf(c, parts)) }); diff != "" {
		t.Fatal(diff)
	}
	if len(recs) != total {
		t.Fatalf("stream holds %d messages, store %d", len(recs), total)
	}
}

// TestStreamEqualsStoreAcrossOutageAndCrash: messages committed with and
// without the live path, a broker killed and restarted mid-way, and a
// publisher that dies (its unstored acks republished and de-duplicated by
// JetStream): the stream ends equal to the store, per conversation in seq
// order, each message once.
func TestStreamEqualsStoreAcrossOutageAndCrash(t *testing.T) {
	nats := natstest.Start(t)
	st := memstore.New()
	sink := open(t, nats.URL(), true)
	stream, created := sink.Stream()
	if !created || stream != "SEQUENCER" {
		t.Fatalf("stream %q created=%v", stream, created)
	}
	w := &writer{st: st, heads: map[string]uint64{}}
	convs := make([]string, 40)
	for i := range convs {
		convs[i] = fmt.Sprintf("g:%d", i)
	}
	// Before any publisher runs: a backlog only the outbox knows.
	for _, c := range convs[:10] {
		w.send(t, nil, c, 3, false)
	}
	pub, stop := start(t, st, sink)
	for r := 0; r < 5; r++ {
		for i, c := range convs {
			w.send(t, pub, c, 1+i%3, true)
		}
	}
	nats.Stop() // outage: sends go on
	for r := 0; r < 5; r++ {
		for _, c := range convs {
			w.send(t, pub, c, 2, true)
		}
	}
	if s := pub.Stats(); s.Messages == 0 {
		t.Fatalf("no backlog during the outage: %+v", s.Lag)
	}
	nats.Start()
	waitDrained(t, st)
	stop()
	// A new owner after a crash: resumes from the outbox.
	for _, c := range convs[:5] {
		w.send(t, nil, c, 4, false)
	}
	_, stop2 := start(t, st, open(t, nats.URL(), false))
	waitDrained(t, st)
	stop2()
	check(t, nats, w, stream)
}

func TestOpenRefusesAMissingStreamAndBadURLs(t *testing.T) {
	nats := natstest.Start(t)
	ctx := context.Background()
	_, err := natssink.Open(ctx, natssink.Config{URL: nats.URL()})
	if err == nil || !strings.Contains(err.Error(), "--feed-create-stream") {
		t.Fatalf("Open without a stream: %v, want advice naming --feed-create-stream", err)
	}
	for _, u := range []string{"http://127.0.0.1:4222", "nats://", "::"} {
		if _, err := natssink.Open(ctx, natssink.Config{URL: u}); err == nil || !strings.Contains(err.Error(), "--feed-nats") {
			t.Fatalf("Open(%q) = %v, want a --feed-nats error", u, err)
		}
	}
}

// TestPayloadAndHeaders: a published message carries the contract's headers
// and the stored Message as payload, protobuf by default and protojson
// with Format json, on PREFIX.<partition>.
func TestPayloadAndHeaders(t *testing.T) {
	nats := natstest.Start(t)
	m := sequencer.Message{MsgID: 7_000_000_000_123, ConvID: "g:payload", Seq: 3, FromUID: 42, MsgType: 2,
		Body: []byte{0, 1, 2, 250}, ClientMsgID: "c-1", ServerAt: time.Date(2026, 12, 5, 4, 0, 0, 123_000_000, time.UTC)}
	for i, format := range []string{"proto", "json"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		prefix := "feed" + format
		s, err := natssink.Open(ctx, natssink.Config{URL: nats.URL(), Subject: prefix, Format: format, CreateStream: true})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		s.Publish(uint32(5+i), m, func(err error) { done <- err })
		if err := <-done; err != nil {
			t.Fatalf("%s: publish: %v", format, err)
		}
		stream, _ := s.Stream()
		s.Close()
		recs := natstest.ReadAll(t, nats.URL(), stream)
		if len(recs) != 1 {
			t.Fatalf("%s: %d messages in the stream", format, len(recs))
		}
		r := recs[0]
		if r.Subject != fmt.Sprintf("%s.%d", prefix, 5+i) || r.ConvID != m.ConvID || r.Seq != m.Seq || r.MsgID != m.MsgID {
			t.Fatalf("%s: record %+v", format, r)
		}
		var pm sequencerv1.Message
		if format == "json" {
			err = protojson.Unmarshal(r.Data, &pm)
			if !strings.Contains(string(r.Data), `"msgId":"7000000000123"`) {
				t.Fatalf("json payload %s: msgId is not a decimal string", r.Data)
			}
		} else {
			err = proto.Unmarshal(r.Data, &pm)
		}
		if err != nil {
			t.Fatalf("%s: payload: %v", format, err)
		}
		if pm.GetMsgId() != m.MsgID || pm.GetConvId() != m.ConvID || pm.GetSeq() != m.Seq || pm.GetFromUid() != m.FromUID ||
			pm.GetMsgType() != int32(m.MsgType) || string(pm.GetBody()) != string(m.Body) || pm.GetClientMsgId() != m.ClientMsgID ||
			!pm.GetServerAt().AsTime().Equal(m.ServerAt) {
			t.Fatalf("%s: payload %v, want %+v", format, &pm, m)
		}
	}
}
