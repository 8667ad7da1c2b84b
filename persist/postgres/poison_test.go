package postgres

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPoisonedMessageFailsAlone: messages PostgreSQL refuses (a 100-byte
// conv_id; the API's validation would stop it, so it goes to the writer
// directly, as a forged forward once could) arrive among many good sends
// that share group commits with them. Every good send is acked and stored;
// only the bad ones fail (invalid_argument), and the log says so a few
// times, not once per message.
func TestPoisonedMessageFailsAlone(t *testing.T) {
	s, _ := newStore(t)
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	n, err := actor.NewConversations(actor.Config{Store: s, IDs: &stallIDs{}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	badConv := strings.Repeat("x", 100)
	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := map[string]sequencer.SendResult{}
	badAnswers := 0
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				conv := fmt.Sprintf("g%d", (w*7+i)%40)
				key := fmt.Sprintf("w%d-%d", w, i)
				if w%8 == 0 && i%10 == 0 {
					conv = badConv
				}
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				res, err := n.Send(cctx, sequencer.SendRequest{ConvID: conv, FromUID: 1, ClientMsgID: key, MsgType: 1, Body: []byte(key)})
				cancel()
				mu.Lock()
				switch {
				case conv == badConv:
					badAnswers++
					if err == nil || sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
						t.Errorf("bad message %s: %v (code %s), want invalid_argument", key, err, sequencer.ErrorCode(err))
					}
				case err != nil:
					t.Errorf("good message %s in %s failed: %v", key, conv, err)
				default:
					acked[key] = res
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := n.Close(cctx); err != nil {
		t.Fatal(err)
	}
	for key, res := range acked {
		m, err := s.FindByClientKey(ctx, sequencer.ClientKey{FromUID: 1, ClientMsgID: key})
		if err != nil || m.Seq != res.Seq || m.MsgID != res.MsgID {
			t.Fatalf("acked %s %+v, stored %+v (%v)", key, res, m, err)
		}
	}
	warns := strings.Count(logs.String(), "refused")
	if warns == 0 || warns > 20 {
		t.Fatalf("%d log lines about refused rows for %d bad messages (want a few):\n%s", warns, badAnswers, logs.String())
	}
	t.Logf("%d good sends acked, %d bad ones refused alone, %d log lines", len(acked), badAnswers, warns)
}
