package main

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/server"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestEveryServeFlagReadsItsEnvironmentVariable(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cfg server.Config
	var level string
	serveFlags(fs, &cfg, &level)
	vars := map[string]string{
		"SEQUENCER_LISTEN":         "127.0.0.1:9999",
		"SEQUENCER_STORE":          "postgres://x@127.0.0.1/db",
		"SEQUENCER_CLUSTER_LISTEN": "127.0.0.1:9998",
		"SEQUENCER_NODE_ID":        "from-env",
		"SEQUENCER_MEMBER_TTL":     "7s",
		"SEQUENCER_MAX_BODY":       "1024",
	}
	// The command line beats the environment.
	if err := parseWithEnv(fs, []string{"--node-id", "from-flag"}, env(vars)); err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9999" || cfg.Store != "postgres://x@127.0.0.1/db" || cfg.ClusterListen != "127.0.0.1:9998" ||
		cfg.MemberTTL != 7*time.Second || cfg.MaxBody != 1024 {
		t.Fatalf("environment not applied: %+v", cfg)
	}
	if cfg.NodeID != "from-flag" {
		t.Fatalf("node id %q, want the command line's", cfg.NodeID)
	}
	// Every flag has the SEQUENCER_<FLAG> name of CONTRACT.md section 3.
	fs.VisitAll(func(f *flag.Flag) {
		want := "SEQUENCER_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if envName(f.Name) != want {
			t.Errorf("flag %s: env %s, want %s", f.Name, envName(f.Name), want)
		}
	})
}

func TestBadEnvironmentValueIsAnError(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cfg server.Config
	var level string
	serveFlags(fs, &cfg, &level)
	err := parseWithEnv(fs, nil, env(map[string]string{"SEQUENCER_MAX_BODY": "lots"}))
	if err == nil || !strings.Contains(err.Error(), "SEQUENCER_MAX_BODY") {
		t.Fatalf("got %v, want an error naming SEQUENCER_MAX_BODY", err)
	}
}

func TestHelpAndUnknownCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"serve", "--help"}, &out, &errb, env(nil)); code != 0 {
		t.Fatalf("serve --help exit %d", code)
	}
	for _, want := range []string{"--listen", "SEQUENCER_LISTEN", "--store", "--cluster-listen", "--node-id"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("serve --help lacks %s", want)
		}
	}
	if code := run([]string{"frobnicate"}, &out, &errb, env(nil)); code != 2 {
		t.Fatalf("unknown command exit %d, want 2", code)
	}
	errb.Reset()
	if code := run([]string{"serve", "--cluster-listen", "127.0.0.1:1"}, &out, &errb, env(nil)); code != 1 ||
		!strings.Contains(errb.String(), "PostgreSQL") {
		t.Fatalf("cluster mode on the embedded store: exit %d %q, want 1 and a PostgreSQL hint", code, errb.String())
	}
	// A cluster port reachable from other machines needs mutual TLS, or an
	// explicit --cluster-insecure.
	errb.Reset()
	if code := run([]string{"serve", "--store", "postgres://127.0.0.1:1/x", "--cluster-listen", "0.0.0.0:7946"}, &out, &errb, env(nil)); code != 1 ||
		!strings.Contains(errb.String(), "--cluster-insecure") || strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 {
		t.Fatalf("non-loopback cluster listen without TLS: exit %d %q, want 1 and one line naming the flags", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"serve", "--store", "postgres://127.0.0.1:1/x", "--cluster-listen", "127.0.0.1:0", "--cluster-tls-cert", "c.pem"}, &out, &errb, env(nil)); code != 1 ||
		!strings.Contains(errb.String(), "go together") {
		t.Fatalf("cluster TLS cert without key and CA: exit %d %q", code, errb.String())
	}
}
