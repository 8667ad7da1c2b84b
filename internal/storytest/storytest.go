// Package storytest runs story files: data-driven tests of a pure core in
// the manner of etcd raft's testdata, shared by conv and ownership. A story
// is a file of blocks; each block is a command line, a "----" line and the
// expected output up to a blank line. Lines starting with '#' (and blank
// lines) before a command are comments. Run the tests with -rewrite to
// regenerate the expectations, then read the diff: the files are the
// specification.
package storytest

import (
	"bufio"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.txt expectations with the actual output")

// Run runs every testdata/*.txt story as a subtest. For each story, newDo
// returns the function that carries out one command line and returns its
// output ("" is written "(none)"). A package without stories fails.
func Run(t *testing.T, newDo func(t *testing.T) func(cmd string) string) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no stories: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runStory(t, f, newDo(t)) })
	}
}

type block struct {
	comments []string
	cmd      string
	want     string
	line     int
}

// parse reads the blocks of the story at path.
func parse(t *testing.T, path string) []block {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []block
	var cur block
	var out []string
	state, n := 0, 0 // state 0: before a command, 1: after it, 2: in its output
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		l := sc.Text()
		switch state {
		case 0:
			if strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "" {
				cur.comments = append(cur.comments, l)
				continue
			}
			cur.cmd, cur.line, state = l, n, 1
		case 1:
			if l != "----" {
				t.Fatalf("%s:%d: want ---- after command", path, n)
			}
			state, out = 2, nil
		case 2:
			if l == "" {
				cur.want = strings.Join(out, "\n")
				blocks = append(blocks, cur)
				cur, state = block{}, 0
				continue
			}
			out = append(out, l)
		}
	}
	switch state {
	case 2:
		cur.want = strings.Join(out, "\n")
		blocks = append(blocks, cur)
	case 1:
		t.Fatalf("%s: command without ----", path)
	}
	return blocks
}

func runStory(t *testing.T, path string, do func(cmd string) string) {
	blocks := parse(t, path)
	var rewritten strings.Builder
	for _, b := range blocks {
		got := do(b.cmd)
		if got == "" {
			got = "(none)"
		}
		if *rewrite {
			for _, c := range b.comments {
				rewritten.WriteString(c + "\n")
			}
			rewritten.WriteString(b.cmd + "\n----\n" + got + "\n\n")
			continue
		}
		if got != b.want {
			t.Fatalf("%s:%d: %s\n got:\n%s\nwant:\n%s", path, b.line, b.cmd, got, b.want)
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.TrimRight(rewritten.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
