package bench

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/client"
	"github.com/sequencer-im/sequencer/server"
)

// The feed engines' streams (--convs-per-stream): 7 conversations at 3 a
// stream are 3 streams; openFeedStreams returns once each conversation
// got its seed, and every later message reaches received once, under its
// conversation's index.
func TestFeedStreamsGroupConversations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := server.Start(ctx, server.Config{Listen: "127.0.0.1:0", Store: "sqlite:" + filepath.Join(t.TempDir(), "s.db"), NodeID: "node-1"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown(context.Background()) }()
	target := "http://" + s.Addr()
	c, err := client.New(client.Config{Addrs: []string{target}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const convs, pfx = 7, "fs:"
	send := func(k int, key string) uint64 {
		r, err := c.Send(ctx, client.SendRequest{ConvID: convID(pfx, k), FromUID: 1, ClientMsgID: key, Body: []byte(key)})
		if err != nil {
			t.Fatal(err)
		}
		return r.MsgID
	}
	for k := range convs {
		send(k, fmt.Sprint("seed-", k))
	}
	var mu sync.Mutex
	got := map[int][]uint64{}
	streams, err := openFeedStreams(ctx, target, pfx, convs, 3, func(k int, msgID uint64) {
		mu.Lock()
		got[k] = append(got[k], msgID)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer streams.Close()
	if streams.n != 3 {
		t.Fatalf("streams = %d, want 3 (7 conversations, 3 a stream)", streams.n)
	}
	want := map[int][]uint64{}
	for k := range convs {
		want[k] = []uint64{send(k, fmt.Sprint("m-", k))}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(got)
		done := fmt.Sprint(got) == fmt.Sprint(want)
		mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("received %v (%d conversations), want %v", got, n, want)
		}
	}
}
