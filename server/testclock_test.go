package server

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/idgen"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// With the test-only offset file set, a node's msg_ids and server_at follow
// its stepped wall clock, and it says so in its log; unset, the hook is
// inert (nothing logged).
func TestTestClockOffsetFile(t *testing.T) {
	sendAt := func(s *Server, key string) (time.Time, time.Time) {
		t.Helper()
		c := sequencerv1connect.NewSequencerServiceClient(http.DefaultClient, "http://"+s.Addr(), connect.WithProtoJSON())
		r, err := c.Send(context.Background(), connect.NewRequest(&sequencerv1.SendRequest{ConvId: "c", FromUid: 1, ClientMsgId: key, Body: []byte("x")}))
		if err != nil {
			t.Fatal(err)
		}
		idAt, _, _ := idgen.Decode(r.Msg.MsgId)
		return idAt, r.Msg.ServerAt.AsTime()
	}
	near := func(what string, got, want time.Time) {
		t.Helper()
		if d := got.Sub(want); d < -10*time.Second || d > 10*time.Second {
			t.Fatalf("%s %s, want about %s", what, got.Format(time.RFC3339), want.Format(time.RFC3339))
		}
	}

	var plain syncBuf
	s := start(t, Config{}, slog.New(slog.NewTextHandler(&plain, nil)))
	idAt, serverAt := sendAt(s, "k0")
	near("msg_id time", idAt, time.Now())
	near("server_at", serverAt, time.Now())
	if strings.Contains(plain.String(), "test") {
		t.Fatalf("a node without %s logs about a test clock:\n%s", clock.TestOffsetFileEnv, plain.String())
	}

	file := filepath.Join(t.TempDir(), "offset")
	if err := clock.WriteOffset(file, "1h"); err != nil {
		t.Fatal(err)
	}
	t.Setenv(clock.TestOffsetFileEnv, file)
	var logs syncBuf
	s = start(t, Config{}, slog.New(slog.NewTextHandler(&logs, nil)))
	if !strings.Contains(logs.String(), "test-only clock hook") || !strings.Contains(logs.String(), "to=1h0m0s") {
		t.Fatalf("no warning about the test clock, or no step to 1h:\n%s", logs.String())
	}
	idAt, serverAt = sendAt(s, "k1")
	near("msg_id time", idAt, time.Now().Add(time.Hour))
	near("server_at", serverAt, time.Now().Add(time.Hour))
}
