package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The cores (conv, ownership, membership) are on the root's types: they
// import nothing of persist, directly or through another package
// (docs/ARCHITECTURE.md, "Rules that hold everywhere").
func TestCoresImportNothingOfPersist(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = "/usr/local/go/bin/go"
	}
	const mod = "github.com/sequencer-im/sequencer"
	for _, core := range []string{"conv", "ownership", "membership"} {
		out, err := exec.Command(gobin, "list", "-deps", mod+"/"+core).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == mod+"/persist" || strings.HasPrefix(dep, mod+"/persist/") {
				t.Errorf("%s depends on %s", core, dep)
			}
		}
	}
}

// timeCalls are the functions of package time that read or wait on the wall
// clock: the packages below call them only through a clock.Clock.
var timeCalls = map[string]bool{"Now": true, "Since": true, "Sleep": true, "NewTimer": true,
	"After": true, "AfterFunc": true, "NewTicker": true}

// TestTimeOnlyThroughTheClock: actor, cluster, commit, conv, ownership, idgen and
// membership take their time from a clock.Clock, so the fake clock drives
// them; a call to time's own is allowed only for a metric's own timing,
// marked on its line with a comment naming the metric (the grep in
// docs/ARCHITECTURE.md checks the same).
func TestTimeOnlyThroughTheClock(t *testing.T) {
	checked := 0
	for _, dir := range []string{"actor", "cluster", "commit", "conv", "ownership", "idgen", "membership"} {
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no files (%v)", dir, err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			checked++
			for _, p := range timeCallsIn(t, path) {
				t.Errorf("%s: time.%s outside the clock (take it from a clock.Clock)", p.pos, p.name)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d files checked", checked)
	}
	// The check sees a call when there is one.
	dir := t.TempDir()
	src := filepath.Join(dir, "x.go")
	code := "package x\n\nimport \"time\"\n\nfunc f() { _ = time.Now() }\n\nfunc g() { _ = time.Since(time.Time{}) } // metric timing\n"
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := timeCallsIn(t, src); len(got) != 1 || got[0].name != "Now" {
		t.Fatalf("the check found %v in a file with one unmarked time.Now", got)
	}
}

type timeCall struct {
	pos  token.Position
	name string
}

// timeCallsIn returns the calls of timeCalls in the file at path whose line
// carries no comment naming a metric.
func timeCallsIn(t *testing.T, path string) []timeCall {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	timeName := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"time"` {
			timeName = "time"
			if imp.Name != nil {
				timeName = imp.Name.Name
			}
		}
	}
	if timeName == "" {
		return nil
	}
	marked := map[int]bool{} // lines with a comment naming a metric
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			if strings.Contains(c.Text, "metric") {
				marked[fset.Position(c.Pos()).Line] = true
			}
		}
	}
	var out []timeCall
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); ok && id.Name == timeName && timeCalls[sel.Sel.Name] {
			if pos := fset.Position(sel.Pos()); !marked[pos.Line] {
				out = append(out, timeCall{pos, sel.Sel.Name})
			}
		}
		return true
	})
	return out
}
