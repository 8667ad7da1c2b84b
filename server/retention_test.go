package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/sqlite"
)

// TestRetentionLoopTrimsOldMessages: a node with --retention 24h deletes the
// rows older than a day in its first pass (shortly after start), keeps the
// newer ones and the heads, counts them in sequencer_trimmed_messages_total,
// and a send afterwards continues at head+1.
func TestRetentionLoopTrimsOldMessages(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "seq.db")
	st, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	old, recent := now.Add(-48*time.Hour), now.Add(-time.Hour)
	var batches []persist.ConvBatch
	id := uint64(1000)
	for c := range 3 {
		conv := fmt.Sprintf("g:ret:%d", c)
		b := persist.ConvBatch{ConvID: conv}
		for i := range 4 {
			id++
			at := old
			if c == 0 && i >= 2 {
				at = recent // g:ret:0 keeps seqs 3 and 4
			}
			b.Messages = append(b.Messages, sequencer.Message{MsgID: id, ConvID: conv, Seq: uint64(i + 1), FromUID: 7,
				MsgType: 1, Body: []byte("x"), ClientMsgID: fmt.Sprintf("k%d", id), ServerAt: at})
		}
		batches = append(batches, b)
	}
	if err := st.Commit(ctx, batches); err != nil {
		t.Fatal(err)
	}
	st.Close() // the embedded store admits one opener at a time

	s, err := Start(ctx, Config{Listen: "127.0.0.1:0", Store: "sqlite:" + path, Retention: 24 * time.Hour,
		RetentionEvery: time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())

	deadline := time.Now().Add(20 * time.Second)
	for {
		var m dto.Metric
		if err := s.Metrics().Trimmed.Write(&m); err != nil {
			t.Fatal(err)
		}
		if m.GetCounter().GetValue() == 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sequencer_trimmed_messages_total = %v after 20s, want 10", m.GetCounter().GetValue())
		}
		time.Sleep(20 * time.Millisecond)
	}
	mresp, err := http.Get("http://" + s.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mbody, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if !strings.Contains(string(mbody), "\nsequencer_trimmed_messages_total 10\n") {
		t.Fatalf("/metrics lacks sequencer_trimmed_messages_total 10")
	}
	resp, err := http.Post("http://"+s.Addr()+"/sequencer.v1.SequencerService/Send", "application/json",
		strings.NewReader(`{"convId":"g:ret:1","fromUid":"7","clientMsgId":"after-trim","body":"eA=="}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got struct{ Seq string }
	if resp.StatusCode != 200 || json.Unmarshal(body, &got) != nil || got.Seq != "5" {
		t.Fatalf("send after retention: %d %s, want seq 5", resp.StatusCode, body)
	}
	// The node holds the embedded store: read it back after the node stops.
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err = sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// g:ret:0 keeps seqs 3 and 4; g:ret:2 keeps nothing; g:ret:1 holds only
	// the send after the trim, at seq 5. Heads never went back.
	for c, want := range [][]uint64{{3, 4}, {5}, nil} {
		conv := fmt.Sprintf("g:ret:%d", c)
		ms, err := st.ReadRange(ctx, conv, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		for _, m := range ms {
			seqs = append(seqs, m.Seq)
		}
		if fmt.Sprint(seqs) != fmt.Sprint(want) {
			t.Fatalf("%s holds seqs %v after retention, want %v", conv, seqs, want)
		}
		wantHead := uint64(4)
		if c == 1 {
			wantHead = 5
		}
		if h, _ := st.LoadHead(ctx, conv); h != wantHead {
			t.Fatalf("%s head %d after retention, want %d", conv, h, wantHead)
		}
	}
}
