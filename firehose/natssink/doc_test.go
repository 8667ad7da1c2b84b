package natssink_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFeedDocConsumerBuilds: the Go consumer example of docs/FEED.md
// compiles against this module (the nats.go and generated proto it names).
func TestFeedDocConsumerBuilds(t *testing.T) {
	doc, err := os.ReadFile("../../docs/FEED.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "```go\n")
	if !ok {
		t.Fatal("docs/FEED.md has no Go example")
	}
	code, _, ok := strings.Cut(after, "```")
	if !ok || !strings.Contains(code, "package main") {
		t.Fatal("docs/FEED.md's Go example is not a whole program")
	}
	dir, err := os.MkdirTemp("../../internal", "feeddoc")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "vet", "./"+filepath.Join("internal", filepath.Base(dir)))
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docs/FEED.md's consumer does not build: %v\n%s", err, out)
	}
}
