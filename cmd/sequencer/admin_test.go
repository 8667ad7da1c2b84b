package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/open"
	"github.com/sequencer-im/sequencer/server"
)

func TestRetentionFlagTakesDays(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cfg server.Config
	var level string
	serveFlags(fs, &cfg, &level)
	if err := parseWithEnv(fs, nil, env(map[string]string{"SEQUENCER_RETENTION": "90d"})); err != nil {
		t.Fatal(err)
	}
	if cfg.Retention != 90*24*time.Hour {
		t.Fatalf("SEQUENCER_RETENTION=90d gave %v", cfg.Retention)
	}
	if err := parseWithEnv(fs, []string{"--retention", "36h"}, env(nil)); err != nil || cfg.Retention != 36*time.Hour {
		t.Fatalf("--retention 36h gave %v, %v", cfg.Retention, err)
	}
	if err := parseWithEnv(fs, []string{"--retention", "3w"}, env(nil)); err == nil {
		t.Fatal("--retention 3w accepted")
	}
}

// TestAdminDispatch: `sequencer admin` reaches package admin with the
// store from --store or SEQUENCER_STORE, flags before or after the
// argument, tables or JSON; the usage lists admin.
func TestAdminDispatch(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "seq.db")
	st, err := open.Store(ctx, "sqlite:"+path, open.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = st.Commit(ctx, []persist.ConvBatch{{ConvID: "g:7", Messages: []sequencer.Message{
		{MsgID: 11, ConvID: "g:7", Seq: 1, FromUID: 1, MsgType: 1, Body: []byte("a"), ClientMsgID: "a", ServerAt: time.Now().Add(-100 * 24 * time.Hour)},
		{MsgID: 12, ConvID: "g:7", Seq: 2, FromUID: 1, MsgType: 1, Body: []byte("b"), ClientMsgID: "b", ServerAt: time.Now()},
	}}})
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"admin", "head", "g:7", "--store", path, "--json"}, &out, &errb, env(nil)); code != 0 {
		t.Fatalf("admin head: exit %d: %s", code, errb.String())
	}
	var h struct {
		Head        uint64 `json:"head"`
		FirstStored uint64 `json:"first_stored"`
	}
	if err := json.Unmarshal(out.Bytes(), &h); err != nil || h.Head != 2 || h.FirstStored != 1 {
		t.Fatalf("admin head --json: %q (%v)", out.String(), err)
	}
	out.Reset()
	if code := run([]string{"admin", "trim", "--older-than", "90d"}, &out, &errb, env(map[string]string{"SEQUENCER_STORE": path})); code != 0 ||
		!strings.Contains(out.String(), "deleted 1 messages") {
		t.Fatalf("admin trim with SEQUENCER_STORE: exit %d %q %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"admin", "--store", path, "head", "g:7"}, &out, &errb, env(nil)); code == 0 {
		t.Fatal("flags before the admin command were accepted as a command")
	}
	if code := run([]string{"admin", "head", "--store", path, "g:7"}, &out, &errb, env(nil)); code != 0 ||
		!strings.Contains(out.String(), "first stored seq") || !strings.Contains(out.String(), "2") {
		t.Fatalf("admin head table: exit %d %q", code, out.String())
	}
	errb.Reset()
	if code := run([]string{"admin", "members", "--store", path}, &out, &errb, env(nil)); code != 1 ||
		!strings.Contains(errb.String(), "PostgreSQL") {
		t.Fatalf("admin members on the embedded store: exit %d %q", code, errb.String())
	}
	if code := run([]string{"admin", "frobnicate"}, &out, &errb, env(nil)); code != 1 {
		t.Fatalf("unknown admin command: exit %d", code)
	}
	if code := run([]string{"admin", "head", "--store", path}, &out, &errb, env(nil)); code != 1 {
		t.Fatalf("admin head without a conversation: exit %d", code)
	}
	out.Reset()
	if code := run([]string{"--help"}, &out, &errb, env(nil)); code != 0 || !strings.Contains(out.String(), "sequencer admin") {
		t.Fatalf("usage does not list admin:\n%s", out.String())
	}
	out.Reset()
	if code := run([]string{"admin", "--help"}, &out, &errb, env(nil)); code != 0 || !strings.Contains(out.String(), "forget NODE") {
		t.Fatalf("admin --help: exit %d\n%s", code, out.String())
	}
}

// sequencer's usage names every command `sequencer admin --help` lists.
func TestUsageListsEveryAdminCommand(t *testing.T) {
	cmds := strings.SplitN(strings.SplitN(adminUsage, "Commands:\n", 2)[1], "\n\n", 2)[0]
	for _, line := range strings.Split(cmds, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(line, "  ") || strings.HasPrefix(line, "   ") {
			continue // a continuation line
		}
		if !strings.Contains(usage, " "+f[0]+",") && !strings.Contains(usage, " "+f[0]+" ") {
			t.Errorf("sequencer's usage does not name `admin %s`", f[0])
		}
	}
}
