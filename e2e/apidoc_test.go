package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// apiDoc is the user-facing API description whose curl examples
// TestAPIDocCurlExamples runs.
const apiDoc = "../docs/API.md"

// The address the examples call, and the one Route answers there; the test
// substitutes the node's.
const (
	docHost      = "localhost:7070"
	docRouteAddr = "127.0.0.1:7070"
)

// docExample is one `$ curl ...` command of docs/API.md and the output
// printed under it.
type docExample struct {
	line    int // of the command's first line in the file
	command string
	output  []string
}

var (
	fenceRe     = regexp.MustCompile("^```")
	curlWordRe  = regexp.MustCompile(`(^|[\s$])curl\s`)
	rpcPathRe   = regexp.MustCompile(`/sequencer\.v1\.SequencerService/([A-Za-z]+)`)
	serveLineRe = regexp.MustCompile(`^\$ sequencer serve (.*?)\s*&$`)
	makeRunRe   = regexp.MustCompile(`^\$ make run &$`) // sequencer serve with the defaults
)

// parseAPIDoc returns the serve command's flags and the curl examples of doc:
// every ```sh block that holds a curl command calling
// /sequencer.v1.SequencerService/. In such a block a line starting with "$ "
// starts a command, which goes on while its line ends with a backslash or a
// single quote is open; the lines after it up to a blank line, a comment or
// the next command are its expected output. Any command there that is not
// curl is an error: the block is documentation the test cannot check.
//
// name is the file's name for messages; line numbers count from lineOffset+1.
func parseAPIDoc(name, doc string, lineOffset int) (serveArgs []string, examples []docExample, err error) {
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		if !fenceRe.MatchString(lines[i]) {
			continue
		}
		lang := strings.TrimSpace(strings.TrimPrefix(lines[i], "```"))
		start := i + 1
		end := start
		for end < len(lines) && !fenceRe.MatchString(lines[end]) {
			end++
		}
		i = end
		block := lines[start:end]
		text := strings.Join(block, "\n")
		if lang != "sh" {
			continue
		}
		for _, l := range block {
			if m := serveLineRe.FindStringSubmatch(l); m != nil && serveArgs == nil {
				serveArgs = strings.Fields(m[1])
			}
			if makeRunRe.MatchString(l) && serveArgs == nil {
				serveArgs = []string{}
			}
		}
		if !curlWordRe.MatchString(text) || !rpcPathRe.MatchString(text) {
			continue
		}
		var cur *docExample
		for j := 0; j < len(block); j++ {
			l := block[j]
			switch {
			case serveLineRe.MatchString(l) || makeRunRe.MatchString(l):
				cur = nil // the node the examples run against
			case strings.HasPrefix(l, "$ "):
				cmd := []string{strings.TrimPrefix(l, "$ ")}
				first := lineOffset + start + j + 1
				for (strings.HasSuffix(cmd[len(cmd)-1], `\`) || strings.Count(strings.Join(cmd, "\n"), "'")%2 == 1) && j+1 < len(block) {
					j++
					cmd = append(cmd, block[j])
				}
				c := strings.Join(cmd, "\n")
				if !strings.HasPrefix(c, "curl ") {
					return nil, nil, fmt.Errorf("%s:%d: a block with curl examples holds a command the test cannot run: %q", name, first, c)
				}
				examples = append(examples, docExample{line: first, command: c})
				cur = &examples[len(examples)-1]
			case strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#"):
				cur = nil
			case cur != nil:
				cur.output = append(cur.output, l)
			default:
				return nil, nil, fmt.Errorf("%s:%d: output line without a command above it: %q", name, lineOffset+start+j+1, l)
			}
		}
	}
	return serveArgs, examples, nil
}

// docBindings maps the ids and times the document shows to the ones the
// running node answered, so later commands (GetMessage of a documented
// msgId) and later answers (the resend's ids) are checked against the run.
type docBindings struct {
	msgID     map[string]string // documented msgId -> actual
	actualMsg map[string]string // actual msgId -> documented (ids map one to one)
	serverAt  map[string]string // actual msgId -> actual serverAt
	docAt     map[string]string // documented msgId -> documented serverAt
}

// compareJSON checks that got has the same shape and values as want: the
// same keys at every level and equal values, except that a msgId may be any
// id (0 < id < 2^63) and a serverAt any RFC 3339 UTC time, as long as each
// documented msgId stands for one actual msgId everywhere and one message's
// serverAt never changes.
func (b *docBindings) compareJSON(path string, want, got any) error {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: documented an object, got %v", path, got)
		}
		if wk, gk := keys(w), keys(g); !slices.Equal(wk, gk) {
			return fmt.Errorf("%s: documented keys %v, got keys %v", path, wk, gk)
		}
		for _, k := range keys(w) {
			switch k {
			case "msgId", "serverAt":
				continue
			case "targetMsgId":
				// An edit or recall names a message shown earlier.
				if wid, _ := w[k].(string); b.msgID[wid] == "" || b.msgID[wid] != g[k] {
					return fmt.Errorf("%s.%s: documented %v (a msgId shown earlier), got %v", path, k, w[k], g[k])
				}
				continue
			case "editedAt":
				// The time of the target's last edit: its edit event's serverAt.
				if gs, _ := g[k].(string); !strings.HasSuffix(gs, "Z") {
					return fmt.Errorf("%s.%s: %v is not an RFC 3339 UTC time", path, k, g[k])
				}
				continue
			}
			if err := b.compareJSON(path+"."+k, w[k], g[k]); err != nil {
				return err
			}
		}
		if wid, ok := w["msgId"]; ok {
			if err := b.bindMsgID(path+".msgId", wid, g["msgId"]); err != nil {
				return err
			}
		}
		if wat, ok := w["serverAt"]; ok {
			if err := b.bindServerAt(path+".serverAt", w["msgId"], g["msgId"], wat, g["serverAt"]); err != nil {
				return err
			}
		}
		return nil
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s: documented %d elements, got %v", path, len(w), got)
		}
		for i := range w {
			if err := b.compareJSON(fmt.Sprintf("%s[%d]", path, i), w[i], g[i]); err != nil {
				return err
			}
		}
		return nil
	default:
		if !reflect.DeepEqual(want, got) {
			return fmt.Errorf("%s: documented %#v, got %#v", path, want, got)
		}
		return nil
	}
}

func (b *docBindings) bindMsgID(path string, want, got any) error {
	w, ok1 := want.(string)
	g, ok2 := got.(string)
	if !ok1 || !ok2 {
		return fmt.Errorf("%s: msgId must be a decimal string: documented %#v, got %#v", path, want, got)
	}
	for _, s := range []string{w, g} {
		if n, err := strconv.ParseUint(s, 10, 64); err != nil || n == 0 || n >= 1<<63 {
			return fmt.Errorf("%s: %q is not a msg_id (a decimal string, 0 < id < 2^63)", path, s)
		}
	}
	if prev, ok := b.msgID[w]; ok && prev != g {
		return fmt.Errorf("%s: the document shows msgId %s again, but the node answered %s where it had answered %s", path, w, g, prev)
	}
	if prev, ok := b.actualMsg[g]; ok && prev != w {
		return fmt.Errorf("%s: the node answered msgId %s for documented ids %s and %s", path, g, prev, w)
	}
	b.msgID[w], b.actualMsg[g] = g, w
	return nil
}

func (b *docBindings) bindServerAt(path string, wantID, gotID, want, got any) error {
	w, ok1 := want.(string)
	g, ok2 := got.(string)
	if !ok1 || !ok2 {
		return fmt.Errorf("%s: serverAt must be a string: documented %#v, got %#v", path, want, got)
	}
	for _, s := range []string{w, g} {
		if _, err := time.Parse(time.RFC3339Nano, s); err != nil || !strings.HasSuffix(s, "Z") {
			return fmt.Errorf("%s: %q is not an RFC 3339 UTC time", path, s)
		}
	}
	if id, ok := wantID.(string); ok {
		if prev, ok := b.docAt[id]; ok && prev != w {
			return fmt.Errorf("%s: the document shows msgId %s with serverAt %s and %s", path, id, prev, w)
		}
		b.docAt[id] = w
	}
	if id, ok := gotID.(string); ok {
		if prev, ok := b.serverAt[id]; ok && prev != g {
			return fmt.Errorf("%s: the node answered msgId %s with serverAt %s, earlier %s", path, id, g, prev)
		}
		b.serverAt[id] = g
	}
	return nil
}

func keys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// TestAPIDocCurlExamples runs every curl example of docs/API.md, in order,
// against a real `sequencer serve` (the flags of the document's own serve
// line, the embedded store in a temp dir, a random port) with the real curl,
// and checks each answer against the output printed under the command: the
// same JSON keys, values, codes, messages and HTTP status lines; only msgId
// and serverAt values may differ (consistently). It fails when the document
// and the code drift apart, and when the examples stop covering every RPC,
// an error answer, a resend, a Pull with hasMore and max_bytes, or a mixed
// SendBatch.
func TestAPIDocCurlExamples(t *testing.T) {
	raw, err := os.ReadFile(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkAPIDoc(t, string(raw)); err != nil {
		t.Fatal(err)
	}
}

// TestAPIDocCheckCatchesDrift feeds checkAPIDoc the document with one
// answer, status, message or request changed, as drift would, and requires
// each to fail.
func TestAPIDocCheckCatchesDrift(t *testing.T) {
	raw, err := os.ReadFile(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	for _, m := range []struct{ name, old, new string }{
		{"a seq in a batch answer", `"seq":"3","serverAt"`, `"seq":"4","serverAt"`},
		{"a renamed answer field", `"hasMore":true}`, `"more":true}`},
		{"a dropped answer field", `,"duplicate":true}`, `}`},
		{"an error message", `must hold 1..1000 items`, `must hold 1..100 items`},
		{"an error code", `{"code":"not_found"`, `{"code":"unavailable"`},
		{"an HTTP status", "}\nHTTP 409\n", "}\nHTTP 400\n"},
		{"a renamed request field", `-d '{"convId":"g:42"}'`, `-d '{"conversationId":"g:42"}'`},
		{"a msgId of another message", `-d '{"msgId":"385807565520371712"}'`, `-d '{"msgId":"385807565491011584"}'`},
	} {
		t.Run(m.name, func(t *testing.T) {
			if !strings.Contains(doc, m.old) {
				t.Fatalf("%s no longer holds %q: update this test's mutations", apiDoc, m.old)
			}
			err := checkAPIDoc(t, strings.Replace(doc, m.old, m.new, 1))
			if err == nil {
				t.Fatalf("replacing %q by %q went unnoticed", m.old, m.new)
			}
			t.Logf("caught: %v", err)
		})
	}
}

// TestREADMEExampleSession runs the curl examples of the README's "Example
// session" (a node as `make run` starts it) like TestAPIDocCurlExamples.
func TestREADMEExampleSession(t *testing.T) {
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "\n## Example session\n")
	if start < 0 {
		t.Fatal("README.md has no \"## Example session\" section")
	}
	start++
	end := strings.Index(doc[start+1:], "\n## ")
	if end < 0 {
		end = len(doc) - start - 1
	}
	section := doc[start : start+1+end]
	if !strings.Contains(section, "docs/API.md") {
		t.Errorf("README.md's example session does not point to docs/API.md")
	}
	err = checkDoc(t, docCheck{
		name: "../README.md", text: section, lineOffset: strings.Count(doc[:start], "\n"),
		serveArgs:   []string{}, // make run: sequencer serve with the defaults
		minExamples: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkAPIDoc starts the document's node and runs its curl examples (see
// TestAPIDocCurlExamples); it returns the first difference.
func checkAPIDoc(t *testing.T, doc string) error {
	t.Helper()
	return checkDoc(t, docCheck{name: apiDoc, text: doc, coverage: true, minExamples: 10})
}

// docCheck is a document (or a part of one) whose curl examples run.
type docCheck struct {
	name       string
	text       string
	lineOffset int // lines of the file before text
	// serveArgs are the node's flags when text has no `$ sequencer serve`
	// line; nil requires one.
	serveArgs []string
	// coverage requires examples of every RPC, an error, a resend, a mixed
	// batch, hasMore and maxBytes.
	coverage    bool
	minExamples int
}

func checkDoc(t *testing.T, d docCheck) error {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("curl not found: the docs test runs the documented commands with it (apt-get install -y curl; .ci/run installs it)")
	}
	apiDoc, doc := d.name, d.text
	serveArgs, examples, err := parseAPIDoc(d.name, d.text, d.lineOffset)
	if err != nil {
		return err
	}
	if serveArgs == nil {
		serveArgs = d.serveArgs
	}
	if serveArgs == nil {
		return fmt.Errorf("%s: no `$ sequencer serve ... &` line: the examples' node is undocumented", apiDoc)
	}
	if len(examples) < d.minExamples {
		return fmt.Errorf("%s: %d curl examples found, want at least %d (is the block still ```sh with `$ curl` lines?)", apiDoc, len(examples), d.minExamples)
	}
	// The document's flags, with a fresh store and the harness's --listen.
	var args []string
	for i := 0; i < len(serveArgs); i++ {
		switch serveArgs[i] {
		case "--store", "--listen":
			i++ // replaced below / by startNode
		default:
			args = append(args, serveArgs[i])
		}
	}
	args = append(args, "--store", filepath.Join(t.TempDir(), "data"))
	n := startNode(t, "node", args...)

	b := &docBindings{msgID: map[string]string{}, actualMsg: map[string]string{}, serverAt: map[string]string{}, docAt: map[string]string{}}
	methods := map[string]bool{}
	var sawError, sawMixedBatch, sawHasMore, sawDuplicate bool
	for _, ex := range examples {
		name := fmt.Sprintf("%s:%d", apiDoc, ex.line)
		if len(ex.output) == 0 {
			return fmt.Errorf("%s: a curl example without the answer it prints", name)
		}
		for _, m := range rpcPathRe.FindAllStringSubmatch(ex.command, -1) {
			methods[m[1]] = true
		}
		if !strings.Contains(ex.command, docHost) {
			return fmt.Errorf("%s: the example does not call %s: %s", name, docHost, ex.command)
		}
		cmd := strings.ReplaceAll(ex.command, docHost, n.Addr)
		// Ids the document showed earlier are the node's ids now.
		for docID, id := range b.msgID {
			cmd = strings.ReplaceAll(cmd, docID, id)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c := exec.CommandContext(ctx, "sh", "-c", cmd)
		var stdout, stderr bytes.Buffer
		c.Stdout, c.Stderr = &stdout, &stderr
		err := c.Run()
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %v\n%s\nstderr: %s", name, err, cmd, stderr.String())
		}
		got := strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n")
		if len(got) != len(ex.output) {
			return fmt.Errorf("%s: the document shows %d output lines, curl printed %d:\n%s\ndocumented:\n%s",
				name, len(ex.output), len(got), stdout.String(), strings.Join(ex.output, "\n"))
		}
		for i, want := range ex.output {
			want = strings.ReplaceAll(want, docRouteAddr, n.Addr)
			var wj, gj any
			if json.Unmarshal([]byte(want), &wj) != nil {
				if strings.TrimSpace(got[i]) != strings.TrimSpace(want) {
					return fmt.Errorf("%s: documented %q, curl printed %q", name, want, got[i])
				}
				continue
			}
			if err := json.Unmarshal([]byte(got[i]), &gj); err != nil {
				return fmt.Errorf("%s: documented JSON, curl printed %q", name, got[i])
			}
			if err := b.compareJSON("answer", wj, gj); err != nil {
				return fmt.Errorf("%s: %v\ndocumented: %s\ncurl printed: %s", name, err, want, got[i])
			}
			obj, _ := gj.(map[string]any)
			if _, ok := obj["code"]; ok {
				sawError = true
			}
			if obj["hasMore"] == true {
				sawHasMore = true
			}
			if obj["duplicate"] == true {
				sawDuplicate = true
			}
			if rs, ok := obj["results"].([]any); ok {
				var ok, bad bool
				for _, r := range rs {
					rm, _ := r.(map[string]any)
					_, ok1 := rm["ok"]
					_, bad1 := rm["error"]
					ok, bad = ok || ok1, bad || bad1
				}
				sawMixedBatch = sawMixedBatch || (ok && bad)
			}
		}
		t.Logf("%s: ok", name)
	}
	if !d.coverage {
		return nil
	}
	for _, m := range []string{"Send", "SendBatch", "Pull", "GetHead", "GetMessage", "Route", "GetReadReceipts", "ListReadPositions"} {
		if !methods[m] {
			return fmt.Errorf("%s: no curl example calls %s", apiDoc, m)
		}
	}
	if !sawError || !sawMixedBatch || !sawHasMore || !sawDuplicate {
		return fmt.Errorf("%s: the examples must show an error answer (%v), a SendBatch with ok and error results (%v), a Pull with hasMore (%v) and a resend with duplicate (%v)",
			apiDoc, sawError, sawMixedBatch, sawHasMore, sawDuplicate)
	}
	if !regexp.MustCompile(`"maxBytes":\d+`).MatchString(doc) {
		return fmt.Errorf("%s: no Pull example with maxBytes", apiDoc)
	}
	return nil
}

// TestAPIDocSchemaIsTheMigration checks that the im_message table docs/API.md
// shows is the one PostgreSQL gets from the first migration (comments and
// spacing aside).
func TestAPIDocSchemaIsTheMigration(t *testing.T) {
	doc, err := os.ReadFile(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	mig, err := os.ReadFile("../persist/postgres/migrations/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```sql\n(.*?)```").FindSubmatch(doc)
	if block == nil {
		t.Fatalf("%s: no ```sql block with the storage schema", apiDoc)
	}
	table := regexp.MustCompile(`(?s)CREATE TABLE im_message \(.*?\n\);`)
	want := table.Find(mig)
	got := table.Find(block[1])
	if want == nil || got == nil {
		t.Fatalf("CREATE TABLE im_message not found (migration: %v, %s: %v)", want != nil, apiDoc, got != nil)
	}
	if w, g := normalizeSQL(string(want)), normalizeSQL(string(got)); w != g {
		t.Fatalf("%s shows another im_message than the migration:\n%s\nmigration:\n%s", apiDoc, g, w)
	}
}

// normalizeSQL drops -- comments and collapses white space.
func normalizeSQL(s string) string {
	s = regexp.MustCompile(`--[^\n]*`).ReplaceAllString(s, "")
	return strings.Join(strings.Fields(s), " ")
}

// TestAPIDocProtoMatchesTheProto checks the ```proto blocks of docs/API.md
// against the compiled proto/sequencer/v1/sequencer.proto: every message of
// the package is shown with exactly its fields (cardinality, type, name,
// number) and the service block lists exactly its RPCs with their types.
func TestAPIDocProtoMatchesTheProto(t *testing.T) {
	raw, err := os.ReadFile(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	var proto strings.Builder
	for _, m := range regexp.MustCompile("(?s)```proto\\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		proto.WriteString(m[1])
	}
	doc := proto.String()

	fieldRe := regexp.MustCompile(`(?:(repeated)\s+)?([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*;`)
	docMsgs := map[string][]string{}
	msgRe := regexp.MustCompile(`message\s+(\w+)\s*\{`)
	for _, loc := range msgRe.FindAllStringSubmatchIndex(doc, -1) {
		name := doc[loc[2]:loc[3]]
		depth, end := 1, loc[1]
		for ; end < len(doc) && depth > 0; end++ {
			switch doc[end] {
			case '{':
				depth++
			case '}':
				depth--
			}
		}
		var fields []string
		for _, f := range fieldRe.FindAllStringSubmatch(doc[loc[1]:end], -1) {
			fields = append(fields, strings.TrimSpace(f[1]+" "+f[2]+" "+f[3]+" = "+f[4]))
		}
		sort.Strings(fields)
		if _, dup := docMsgs[name]; dup {
			t.Errorf("%s: message %s is shown twice", apiDoc, name)
		}
		docMsgs[name] = fields
	}
	var docRPCs []string
	for _, m := range regexp.MustCompile(`rpc\s+(\w+)\s*\(\s*(\w+)\s*\)\s*returns\s*\(\s*(?:stream\s+)?(\w+)\s*\)`).FindAllStringSubmatch(doc, -1) {
		docRPCs = append(docRPCs, m[1]+"("+m[2]+") "+m[3])
	}
	sort.Strings(docRPCs)

	fd := sequencerv1.File_sequencer_v1_sequencer_proto
	typeName := func(f protoreflect.FieldDescriptor) string {
		if f.Kind() == protoreflect.MessageKind {
			if f.Message().ParentFile().Path() == fd.Path() {
				return string(f.Message().Name())
			}
			return string(f.Message().FullName())
		}
		if f.Kind() == protoreflect.EnumKind {
			return string(f.Enum().Name())
		}
		return f.Kind().String()
	}
	msgs := fd.Messages()
	for i := 0; i < msgs.Len(); i++ {
		md := msgs.Get(i)
		var want []string
		fs := md.Fields()
		for j := 0; j < fs.Len(); j++ {
			f := fs.Get(j)
			card := ""
			if f.Cardinality() == protoreflect.Repeated {
				card = "repeated "
			}
			want = append(want, fmt.Sprintf("%s%s %s = %d", card, typeName(f), f.Name(), f.Number()))
		}
		sort.Strings(want)
		got, ok := docMsgs[string(md.Name())]
		if !ok {
			t.Errorf("%s does not show message %s", apiDoc, md.Name())
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: message %s shows fields %q, the proto has %q", apiDoc, md.Name(), got, want)
		}
		delete(docMsgs, string(md.Name()))
	}
	for name := range docMsgs {
		t.Errorf("%s shows message %s, which the proto does not have", apiDoc, name)
	}
	var want []string
	methods := fd.Services().ByName("SequencerService").Methods()
	for i := 0; i < methods.Len(); i++ {
		m := methods.Get(i)
		want = append(want, fmt.Sprintf("%s(%s) %s", m.Name(), m.Input().Name(), m.Output().Name()))
	}
	sort.Strings(want)
	if !slices.Equal(docRPCs, want) {
		t.Errorf("%s: the service shows %q, the proto has %q", apiDoc, docRPCs, want)
	}
}

// TestAPIDocFlagsExist checks that every --flag docs/API.md names is a flag
// of this build's `sequencer serve` (or of another tool it shows), and that
// a flag the document calls planned is still absent: when it lands, the
// document must say so.
func TestAPIDocFlagsExist(t *testing.T) {
	raw, err := os.ReadFile(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binPath, "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("serve --help: %v\n%s", err, out)
	}
	have := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+--([a-z0-9-]+)\s`).FindAllStringSubmatch(string(out), -1) {
		have[m[1]] = true
	}
	if !have["listen"] || !have["store"] {
		t.Fatalf("serve --help lists no --listen/--store: the help format changed?\n%s", out)
	}
	otherTools := map[string]bool{
		"version": true, "help": true, // sequencer's commands, not serve flags
		"schema": true, "protocol": true, "http2-prior-knowledge": true, // buf curl
		"no-buffer": true, "data-binary": true, // curl streaming a Subscribe
	}
	planned := map[string]bool{}
	doc := string(raw)
	for _, m := range regexp.MustCompile("(?:^|[\\s`(/])--([a-z][a-z0-9-]+)").FindAllStringSubmatch(doc, -1) {
		f := m[1]
		switch {
		case planned[f]:
			if have[f] {
				t.Errorf("%s calls --%s planned, but this build has it: describe it as it is", apiDoc, f)
			}
		case otherTools[f]:
		case !have[f]:
			t.Errorf("%s names --%s, which `sequencer serve --help` does not list", apiDoc, f)
		}
	}
	for f := range planned {
		if strings.Contains(doc, "--"+f) && !regexp.MustCompile("--"+f+"`?[^.]*planned").MatchString(doc) {
			t.Errorf("%s names --%s without saying it is planned", apiDoc, f)
		}
	}
}
