package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `sequencer bench ARGS` runs the sequencer-bench binary beside it with the
// same arguments and output, and exits with its exit code.
func TestBenchRunsTheBinaryBesideIt(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\necho \"bench args: $*\"\necho to-stderr >&2\nexit 3\n"
	if err := os.WriteFile(filepath.Join(dir, benchBinary), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	err := runBench(dir, []string{"--engines", "a", "--duration", "2s"}, &out, &errb)
	if code, ok := err.(exitCode); !ok || code != 3 {
		t.Fatalf("runBench: %v, want exit code 3", err)
	}
	if out.String() != "bench args: --engines a --duration 2s\n" || errb.String() != "to-stderr\n" {
		t.Fatalf("stdout %q stderr %q", out.String(), errb.String())
	}
	// run() passes the child's code on without a message of its own.
	if err := os.WriteFile(filepath.Join(dir, benchBinary), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := runBench(dir, nil, &out, &errb); err != nil {
		t.Fatalf("a bench that exits 0: %v", err)
	}
}

// Without sequencer-bench beside it, `sequencer bench` says what to build.
func TestBenchWithoutTheBinarySaysHowToGetIt(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	err := runBench(dir, []string{"--help"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "make build") || !strings.Contains(err.Error(), "./cmd/sequencer-bench") {
		t.Fatalf("runBench without the binary: %v", err)
	}
	// Through run(): exit 1 and one line naming the command.
	errb.Reset()
	if code := run([]string{"bench", "--help"}, &out, &errb, env(nil)); code != 1 || !strings.Contains(errb.String(), "sequencer bench: the benchmark is its own binary, sequencer-bench") {
		t.Fatalf("sequencer bench without sequencer-bench: exit %d %q", code, errb.String())
	}
}

// Issue 13: the server binary and the client SDK do not link the bench's
// baselines (go-redis) nor the bench itself.
func TestServerAndClientDoNotLinkTheBench(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = "/usr/local/go/bin/go"
	}
	for _, pkg := range []string{"github.com/sequencer-im/sequencer/cmd/sequencer", "github.com/sequencer-im/sequencer/client"} {
		out, err := exec.Command(gobin, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed %d packages: %q", pkg, len(deps), out)
		}
		for _, d := range deps {
			if strings.HasPrefix(d, "github.com/redis/go-redis") || d == "github.com/sequencer-im/sequencer/cmd/sequencer-bench/internal/bench" {
				t.Errorf("%s links %s", pkg, d)
			}
		}
	}
	// The Go SDK links the root package and the generated code only: no
	// server edge, no server wiring, no Prometheus.
	out, err := exec.Command(gobin, "list", "-deps", "github.com/sequencer-im/sequencer/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps ./client: %v\n%s", err, out)
	}
	for _, d := range strings.Fields(string(out)) {
		if strings.HasPrefix(d, "github.com/prometheus/") || (strings.HasPrefix(d, "github.com/sequencer-im/sequencer/") &&
			!strings.HasPrefix(d, "github.com/sequencer-im/sequencer/proto/") && d != "github.com/sequencer-im/sequencer/client") {
			t.Errorf("the client SDK links %s", d)
		}
	}
	// The check itself sees a dependency when there is one.
	out, err = exec.Command(gobin, "list", "-deps", "github.com/sequencer-im/sequencer/cmd/sequencer-bench").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "github.com/redis/go-redis/v9\n") {
		t.Fatalf("go list -deps ./cmd/sequencer-bench does not show go-redis: %v\n%s", err, out)
	}
}
