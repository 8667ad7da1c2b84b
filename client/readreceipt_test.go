package client_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/client"
)

// GetReadReceipts counts the readers of each seq, the senders included;
// ListReadPositions pages them by uid; Subscribe with ReadPositions yields
// MarkRead's and the senders' ticks.
func TestReadReceiptsAndPositions(t *testing.T) {
	node := startNode(t, t.TempDir(), "127.0.0.1:0")
	ctx := ctxT(t)
	c := newClient(t, client.Config{Addrs: []string{node.Addr()}})
	conv := "g:receipts"
	ticks := make(chan client.ReadPositionChanged, 16)
	stop := make(chan struct{})
	go func() {
		for ev, err := range c.SubscribeWith(ctx, []client.Cursor{{ConvID: conv}}, client.SubscribeOptions{ReadPositions: true}) {
			if err != nil {
				return
			}
			if ev.ReadPosition != nil {
				select {
				case ticks <- *ev.ReadPosition:
				case <-stop:
					return
				}
			}
		}
	}()
	defer close(stop)
	// Send until the stream is attached (ticks are live only): the sender's
	// own tick says so.
	var seq uint64
	for attached := false; !attached; {
		r, err := c.Send(ctx, client.SendRequest{ConvID: conv, FromUID: 1001, Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		seq = r.Seq
		select {
		case tk := <-ticks:
			attached = tk.UID == 1001
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the stream never attached")
		}
	}
	if _, err := c.Send(ctx, client.SendRequest{ConvID: conv, FromUID: 1002, Body: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.MarkRead(ctx, conv, 1003, seq); err != nil {
		t.Fatal(err)
	}
	waitTick(t, ticks, client.ReadPositionChanged{ConvID: conv, UID: 1003, ReadSeq: seq})
	got, err := c.GetReadReceipts(ctx, conv, []uint64{seq + 1, seq, seq + 2})
	if err != nil || !slices.Equal(got, []uint64{1, 3, 0}) {
		t.Fatalf("GetReadReceipts = %v, %v; want [1 3 0]", got, err)
	}
	page, more, err := c.ListReadPositions(ctx, conv, 0, 2)
	if err != nil || !more || !slices.Equal(page, []client.ReadPosition{{UID: 1001, ReadSeq: seq}, {UID: 1002, ReadSeq: seq + 1}}) {
		t.Fatalf("first page = %v, more=%v, %v", page, more, err)
	}
	page, more, err = c.ListReadPositions(ctx, conv, 1002, 0)
	if err != nil || more || !slices.Equal(page, []client.ReadPosition{{UID: 1003, ReadSeq: seq}}) {
		t.Fatalf("second page = %v, more=%v, %v", page, more, err)
	}
	if _, err := c.GetReadReceipts(ctx, conv, nil); sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
		t.Fatalf("GetReadReceipts of no seqs: %v, want invalid_argument", err)
	}
}

// waitTick reads ticks until want comes (others, such as the senders',
// are skipped).
func waitTick(t *testing.T, ticks <-chan client.ReadPositionChanged, want client.ReadPositionChanged) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case tk := <-ticks:
			if tk == want {
				return
			}
		case <-deadline:
			t.Fatalf("no tick %+v", want)
		}
	}
}
