package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
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
	if cfg.Listen != "127.0.0.1:9999" || cfg.Store != "postgres://x@127.0.0.1/db" || cfg.Cluster.ClusterListen != "127.0.0.1:9998" ||
		cfg.Cluster.MemberTTL != 7*time.Second || cfg.API.MaxBody != 1024 {
		t.Fatalf("environment not applied: %+v", cfg)
	}
	if cfg.NodeID != "from-flag" {
		t.Fatalf("node id %q, want the command line's", cfg.NodeID)
	}
	// Every flag has the SEQUENCER_<FLAG> name of docs/API.md ("Command line").
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
	if code := run([]string{"serve", "--cluster-listen", "127.0.0.1:1"}, &out, &errb, env(nil)); code != 2 ||
		!strings.Contains(errb.String(), "PostgreSQL") {
		t.Fatalf("cluster mode on the embedded store: exit %d %q, want 2 and a PostgreSQL hint", code, errb.String())
	}
}

// docs/API.md, "Command line": a usage error (unknown flag, stray positional argument,
// bad value, a --store outside the allow-list) exits 2 with ONE line, not
// the usage; nothing is started.
func TestUsageErrorsExit2WithOneLine(t *testing.T) {
	t.Chdir(t.TempDir()) // nothing may create ./data
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		want string
	}{
		"unknown flag":      {[]string{"serve", "--no-such-flag"}, nil, "no-such-flag"},
		"stray argument":    {[]string{"serve", "--listen", "127.0.0.1:0", "extra", "--store", "x"}, nil, `unexpected argument "extra"`},
		"bad duration":      {[]string{"serve", "--member-ttl", "soon"}, nil, "member-ttl"},
		"bad env value":     {[]string{"serve"}, map[string]string{"SEQUENCER_MAX_BODY": "lots"}, "SEQUENCER_MAX_BODY"},
		"bad listen":        {[]string{"serve", "--listen", "nope"}, nil, "listen"},
		"mysql upper case":  {[]string{"serve", "--store", "MYSQL://root:pw-m@db/seq"}, nil, `unsupported scheme "MYSQL"`},
		"mysql driver DSN":  {[]string{"serve", "--store", "root:pw-d@tcp(db:3306)/seq"}, nil, "go-sql-driver DSN form is not accepted"},
		"mysql without db":  {[]string{"serve", "--store", "mysql://root:pw-n@db/"}, nil, "must name one database"},
		"typo scheme":       {[]string{"serve", "--store", "postgress://u:pw-t@h/db"}, nil, `unsupported scheme "postgress"`},
		"upper-case scheme": {[]string{"serve", "--store", "POSTGRES://u:pw-u@h/db"}, nil, `unsupported scheme "POSTGRES"`},
		"store from env":    {[]string{"serve"}, map[string]string{"SEQUENCER_STORE": "redis://x:pw-e@h/db"}, "unsupported scheme"},
		"migrate bad store": {[]string{"migrate", "--store", "mongodb://x:pw-g@h/db"}, nil, "unsupported scheme"},
		"migrate stray":     {[]string{"migrate", "now"}, nil, `unexpected argument "now"`},
		"tls half":          {[]string{"serve", "--tls-cert", "c.pem"}, nil, "tls-key"},
		"client-ca no tls":  {[]string{"serve", "--client-ca", "ca.pem"}, nil, "client-ca"},
		"bad cors origin":   {[]string{"serve", "--cors-origins", "app.example.com"}, nil, "cors-origins"},
		"bad log level":     {[]string{"serve", "--log-level", "loud"}, nil, "log-level"},
		"zero count":        {[]string{"serve", "--commit-workers", "0"}, nil, "commit-workers 0: must be >= 1"},
		"zero duration env": {[]string{"serve"}, map[string]string{"SEQUENCER_HEARTBEAT": "0s"}, "heartbeat 0s: must be > 0"},
		"ttl under 2 beats": {[]string{"serve", "--member-ttl", "400ms"}, nil, "member-ttl 400ms: must exceed twice heartbeat (250ms)"},
		"unknown command":   {[]string{"frobnicate"}, nil, "unknown command"},
	} {
		var out, errb bytes.Buffer
		code := run(tc.args, &out, &errb, env(tc.env))
		text := errb.String()
		if code != 2 || !strings.Contains(text, tc.want) {
			t.Errorf("%s: exit %d %q, want 2 and %q", name, code, text, tc.want)
			continue
		}
		if n := strings.Count(text, "\n"); n != 1 {
			t.Errorf("%s: %d lines, want one: %q", name, n, text)
		}
		if strings.Contains(text, "pw-") {
			t.Errorf("%s: the password is printed: %q", name, text)
		}
	}
	if _, err := os.Stat("data"); err == nil {
		t.Fatal("a refused start created ./data")
	}
}

// A stray argument no longer hides the flags after it: they are refused,
// not ignored.
func TestFlagsAfterAPositionalAreNotIgnored(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var cfg server.Config
	var level string
	serveFlags(fs, &cfg, &level)
	err := parseWithEnv(fs, []string{"stray", "--store", "postgres://x@127.0.0.1/db"}, env(nil))
	var ue usageError
	if !errors.As(err, &ue) {
		t.Fatalf("got %v, want a usage error", err)
	}
}

func TestCORSOriginsFlag(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var cfg server.Config
	var level string
	serveFlags(fs, &cfg, &level)
	if err := parseWithEnv(fs, nil, env(map[string]string{"SEQUENCER_CORS_ORIGINS": "https://a.example.com, https://b.example.com"})); err != nil {
		t.Fatal(err)
	}
	if len(cfg.CORSOrigins) != 2 || cfg.CORSOrigins[1] != "https://b.example.com" {
		t.Fatalf("cors origins %q", cfg.CORSOrigins)
	}
}

// A cluster port reachable from other machines needs mutual TLS, or an
// explicit --cluster-insecure.
func TestClusterPortNeedsTLS(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"serve", "--store", "postgres://127.0.0.1:1/x", "--cluster-listen", "0.0.0.0:7946"}, &out, &errb, env(nil)); code != 2 ||
		!strings.Contains(errb.String(), "--cluster-insecure") || strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 {
		t.Fatalf("non-loopback cluster listen without TLS: exit %d %q, want 2 (a usage error) and one line naming the flags", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"serve", "--store", "postgres://127.0.0.1:1/x", "--cluster-listen", "127.0.0.1:0", "--cluster-tls-cert", "c.pem"}, &out, &errb, env(nil)); code != 2 ||
		!strings.Contains(errb.String(), "go together") {
		t.Fatalf("cluster TLS cert without key and CA: exit %d %q", code, errb.String())
	}
}

// `make run` builds only what it runs: bin/sequencer, not the benchmark
// tool (a newcomer's first `make run` compiled both).
func TestMakeRunBuildsOnlySequencer(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make on PATH")
	}
	out, err := exec.Command("make", "-n", "-C", "../..", "run").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n run: %v\n%s", err, out)
	}
	if s := string(out); !strings.Contains(s, "-o bin/sequencer ./cmd/sequencer") || strings.Contains(s, "sequencer-bench") ||
		strings.Count(s, "go build") != 1 {
		t.Fatalf("make -n run:\n%s\nwant one go build, of bin/sequencer only", s)
	}
}
