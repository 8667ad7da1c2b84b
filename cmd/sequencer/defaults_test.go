package main

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer/server"
)

// flaglessFields are the server.Config fields no serve flag sets, by their
// path: the server's own, and the components' knobs that keep their
// component's default (serve starts from DefaultConfig, so they do).
var flaglessFields = []string{
	"RetentionEvery", "TracerProvider",
	"Actors.MaxFloors",
	"Cluster.ForwardTimeout", "Cluster.StopTimeout", "Cluster.SlowLink", "Cluster.Ring.ReplicationFactor", "Cluster.Ring.Load",
	"Cluster.MaxBody", // Start sets it from --max-body (API.MaxBody)
	"IDs.MaxStoreSkew",
}

// Parsing no flag from a zero Config gives server.DefaultConfig() (but for
// the fields without a flag): every flag's default is the DefaultConfig
// field it sets, and every field with a non-zero default has a flag or is
// listed in flaglessFields. The components' Configs inside server.Config
// are compared field by field.
func TestServeFlagDefaultsAreDefaultConfig(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cfg server.Config
	var level string
	serveFlags(fs, &cfg, &level)
	if err := parseWithEnv(fs, nil, env(nil)); err != nil {
		t.Fatal(err)
	}
	want := server.DefaultConfig()
	flagless := map[string]bool{}
	for _, f := range flaglessFields {
		flagless[f] = true
	}
	var compare func(path string, got, want reflect.Value)
	compare = func(path string, got, want reflect.Value) {
		for i := range want.NumField() {
			sf := want.Type().Field(i)
			if !sf.IsExported() {
				continue
			}
			p := sf.Name
			if path != "" {
				p = path + "." + sf.Name
			}
			g, w := got.Field(i), want.Field(i)
			switch {
			case flagless[p]:
				if !g.IsZero() {
					t.Errorf("%s: listed as flagless, but a flag set it to %v", p, g)
				}
			case w.Kind() == reflect.Struct && w.Type().String() != "time.Time":
				compare(p, g, w)
			case !reflect.DeepEqual(g.Interface(), w.Interface()):
				t.Errorf("%s: flag default %v, server.DefaultConfig() has %v", p, g, w)
			}
		}
	}
	compare("", reflect.ValueOf(cfg), reflect.ValueOf(want))
	// serve itself starts from DefaultConfig, so the flagless fields keep it.
}

// helpDefaults runs `sequencer serve --help` and returns every flag with the
// default it shows ("" when it shows none).
func helpDefaults(t *testing.T) map[string]string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run([]string{"serve", "--help"}, &out, &errb, env(nil)); code != 0 {
		t.Fatalf("serve --help: exit %d", code)
	}
	re := regexp.MustCompile(`(?m)^  --([a-z-]+)  \[[A-Z_]+\](?: \(default (.*)\))?$`)
	got := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(errb.String(), -1) {
		got[m[1]] = m[2]
	}
	if len(got) < 30 {
		t.Fatalf("serve --help lists %d flags:\n%s", len(got), errb.String())
	}
	return got
}

// emptyDefault says, for the flags whose default is empty, how the docs
// spell it ("none" unless listed).
var emptyDefault = map[string]string{
	"node-id":           "hostname + random",
	"cluster-advertise": "the bound --cluster-listen",
}

// flagTable parses the "| flag | default | meaning |" tables of a Markdown
// file into flag -> default cell (backticks and a trailing parenthesis
// removed; "--a / --b" or "--a, --b" rows with "x / y" defaults give one
// entry each).
func flagTable(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	in := false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "| flag | default |") {
			in = true
			continue
		}
		if !in || strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			in = false
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			t.Fatalf("%s: bad row %q", path, line)
		}
		clean := func(s string) string {
			s = strings.TrimSpace(strings.ReplaceAll(s, "`", ""))
			if i := strings.Index(s, " ("); i > 0 {
				s = s[:i]
			}
			return s
		}
		var names []string
		for _, n := range strings.FieldsFunc(cells[1], func(r rune) bool { return r == '/' || r == ',' }) {
			names = append(names, strings.TrimPrefix(clean(n), "--"))
		}
		defs := strings.Split(cells[2], " / ")
		for i, n := range names {
			d := defs[0]
			if len(defs) == len(names) {
				d = defs[i]
			}
			rows[n] = clean(d)
		}
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no \"| flag | default | meaning |\" table", path)
	}
	return rows
}

// sameDefault reports whether a docs cell states the default --help shows.
func sameDefault(flagName, help, cell string) bool {
	switch {
	case help == "":
		want, ok := emptyDefault[flagName]
		if !ok {
			want = "none"
		}
		return strings.HasPrefix(cell, want)
	case help == "false":
		return cell == "false" || cell == "off"
	}
	return cell == help
}

// README's flag table lists every serve flag with the default `serve
// --help` shows (which is server.DefaultConfig()'s), and docs/API.md's
// shorter table agrees with it.
func TestServeHelpMatchesTheDocsFlagTables(t *testing.T) {
	help := helpDefaults(t)
	readme := flagTable(t, "../../README.md")
	for name, def := range help {
		cell, ok := readme[name]
		if !ok {
			t.Errorf("README's flag table lacks --%s (default %q)", name, def)
			continue
		}
		if !sameDefault(name, def, cell) {
			t.Errorf("README: --%s default %q, serve --help says %q", name, cell, def)
		}
	}
	for name := range readme {
		if _, ok := help[name]; !ok {
			t.Errorf("README's flag table has --%s, which serve does not have", name)
		}
	}
	for name, cell := range flagTable(t, "../../docs/API.md") {
		def, ok := help[name]
		if !ok {
			t.Errorf("docs/API.md's flag table has --%s, which serve does not have", name)
			continue
		}
		if !sameDefault(name, def, cell) {
			t.Errorf("docs/API.md: --%s default %q, serve --help says %q", name, cell, def)
		}
	}
}

// A default stated in running text ("`--heartbeat` (250 ms)", "`--partitions`
// ... (default 271", "(`--member-ttl`, default 1.5s)") in README.md,
// docs/*.md, deploy/README.md or cluster/README.md is the one serve uses.
func TestDocsProseStatesTrueDefaults(t *testing.T) {
	help := helpDefaults(t)
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md", "../../cluster/README.md", "../../deploy/README.md")
	re := regexp.MustCompile("`--([a-z-]+)`(?:[^()0-9\n]{0,60}\\(|, )(?:default )?([0-9][0-9.]*) ?([a-zA-Z]*)[;,)]")
	seen := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(raw), -1) {
			def, ok := help[m[1]]
			if !ok {
				continue // another command's flag (sequencer-bench, admin)
			}
			seen++
			got := m[2] + m[3]
			if shift, ok := map[string]uint{"KiB": 10, "MiB": 20, "GiB": 30}[m[3]]; ok {
				n, err := strconv.Atoi(m[2])
				if err != nil {
					t.Fatalf("%s: %q: %v", f, m[0], err)
				}
				got = strconv.Itoa(n << shift)
			}
			if got != def {
				t.Errorf("%s: %q states default %s, serve --help says %s", f, m[0], got, def)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no default found in the docs' prose: the pattern is stale")
	}
}
