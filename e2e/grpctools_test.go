package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer/internal/testcert"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// The real gRPC tools against the real binary (docs/API.md, "From the
// command line"): grpcurl (server reflection) and grpc-health-probe
// (grpc.health.v1), installed by scripts/grpc-tools.sh (make grpc-tools,
// run by .ci/run) into bin/grpc-tools.

// grpcTool is the path of a tool: in $GRPC_TOOLS_BIN, bin/grpc-tools or
// PATH. Missing, it fails the test in CI (CI=true) and skips it elsewhere.
func grpcTool(t *testing.T, name string) string {
	t.Helper()
	for _, dir := range []string{os.Getenv("GRPC_TOOLS_BIN"), filepath.Join("..", "bin", "grpc-tools")} {
		if dir == "" {
			continue
		}
		p, err := filepath.Abs(filepath.Join(dir, name))
		if err == nil {
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				return p
			}
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	msg := name + " not found in $GRPC_TOOLS_BIN, bin/grpc-tools or PATH: install it with `make grpc-tools` (scripts/grpc-tools.sh, go install from the module proxy)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// runTool runs bin args... (bounded at 60 s) and returns its exit code and
// its output (stdout and stderr).
func runTool(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee) && ctx.Err() == nil:
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), args, err, out)
	return 0, ""
}

// grpcurlJSON runs a grpcurl call that must succeed and decodes its JSON answer.
func grpcurlJSON(t *testing.T, grpcurl string, args ...string) map[string]any {
	t.Helper()
	code, out := runTool(t, grpcurl, args...)
	if code != 0 {
		t.Fatalf("grpcurl %v: exit %d\n%s", args, code, out)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("grpcurl %v: %v\n%s", args, err, out)
	}
	return m
}

func wantServices(t *testing.T, out string) {
	t.Helper()
	for _, s := range []string{"sequencer.v1.SequencerService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"} {
		if !strings.Contains(out, s+"\n") {
			t.Fatalf("grpcurl list does not list %s:\n%s", s, out)
		}
	}
}

// grpcurl over h2c: list, describe, Send, Pull and GetHead with JSON input,
// an invalid Send; grpc-health-probe SERVING for "" and the API's service.
func TestGRPCurlAndHealthProbePlaintext(t *testing.T) {
	grpcurl, probe := grpcTool(t, "grpcurl"), grpcTool(t, "grpc-health-probe")
	n := startNode(t, "node", "--store", t.TempDir())

	code, out := runTool(t, grpcurl, "-plaintext", n.Addr, "list")
	if code != 0 {
		t.Fatalf("grpcurl list: exit %d\n%s", code, out)
	}
	wantServices(t, out)
	code, out = runTool(t, grpcurl, "-plaintext", n.Addr, "describe", "sequencer.v1.SequencerService")
	for _, rpc := range []string{"rpc Send ( .sequencer.v1.SendRequest )", "rpc Pull (", "rpc GetHead (", "rpc SendBatch (", "rpc GetMessage (", "rpc Route ("} {
		if code != 0 || !strings.Contains(out, rpc) {
			t.Fatalf("grpcurl describe: exit %d, no %q\n%s", code, rpc, out)
		}
	}
	code, out = runTool(t, grpcurl, "-plaintext", n.Addr, "describe", "sequencer.v1.SendRequest")
	if code != 0 || !strings.Contains(out, "client_msg_id") {
		t.Fatalf("grpcurl describe sequencer.v1.SendRequest: exit %d\n%s", code, out)
	}

	for i, cid := range []string{"grpcurl-1", "grpcurl-2"} {
		res := grpcurlJSON(t, grpcurl, "-plaintext", "-d",
			`{"convId":"g:grpcurl","fromUid":"1001","clientMsgId":"`+cid+`","body":"aGk="}`,
			n.Addr, "sequencer.v1.SequencerService/Send")
		if res["seq"] != fmt.Sprint(i+1) || res["msgId"] == "" || res["msgId"] == nil {
			t.Fatalf("Send %s: %v", cid, res)
		}
	}
	pull := grpcurlJSON(t, grpcurl, "-plaintext", "-d", `{"convId":"g:grpcurl","afterSeq":"0"}`, n.Addr, "sequencer.v1.SequencerService/Pull")
	msgs, _ := pull["messages"].([]any)
	if len(msgs) != 2 || pull["headSeq"] != "2" {
		t.Fatalf("Pull: %v", pull)
	}
	if m := msgs[0].(map[string]any); m["clientMsgId"] != "grpcurl-1" || m["body"] != "aGk=" || m["seq"] != "1" || m["fromUid"] != "1001" {
		t.Fatalf("Pull's first message: %v", m)
	}
	subscribeWithGRPCurl(t, grpcurl, []string{"-plaintext"}, n.Addr, "g:grpcurl", "grpcurl-2")
	if head := grpcurlJSON(t, grpcurl, "-plaintext", "-d", `{"convId":"g:grpcurl"}`, n.Addr, "sequencer.v1.SequencerService/GetHead"); head["headSeq"] != "2" {
		t.Fatalf("GetHead: %v", head)
	}
	code, out = runTool(t, grpcurl, "-plaintext", "-d", `{"convId":"g:grpcurl","fromUid":"0","clientMsgId":"bad","body":"aGk="}`, n.Addr, "sequencer.v1.SequencerService/Send")
	if code == 0 || !strings.Contains(out, "InvalidArgument") {
		t.Fatalf("Send with fromUid 0: exit %d, want InvalidArgument\n%s", code, out)
	}

	for _, svc := range []string{"", "sequencer.v1.SequencerService"} {
		code, out = runTool(t, probe, "-addr", n.Addr, "-service", svc)
		if code != 0 || !strings.Contains(out, "SERVING") {
			t.Fatalf("grpc-health-probe -service %q: exit %d\n%s", svc, code, out)
		}
	}
	if code, out = runTool(t, probe, "-addr", n.Addr, "-service", "other.v1.Other"); code == 0 {
		t.Fatalf("grpc-health-probe of an unknown service: exit 0\n%s", out)
	}
}

// The same over TLS (-cacert) with bearer tokens on: reflection is refused
// without the token and works with it; health needs none.
func TestGRPCurlAndHealthProbeTLSWithTokens(t *testing.T) {
	grpcurl, probe := grpcTool(t, "grpcurl"), grpcTool(t, "grpc-health-probe")
	dir := t.TempDir()
	ca := testcert.NewCA(t, "api-ca")
	pair := ca.Server(t)
	caFile := testcert.Write(t, dir, "ca.pem", ca.PEM)
	cert := testcert.Write(t, dir, "tls.crt", pair.CertPEM)
	key := testcert.Write(t, dir, "tls.key", pair.KeyPEM)
	tokens := testcert.Write(t, dir, "tokens", []byte("# grpcurl\ngrpcurl-token\n"))
	n := startNode(t, "tls", "--store", t.TempDir(), "--tls-cert", cert, "--tls-key", key,
		"--auth-token-file", tokens, "--admin-listen", freeAddr(t))
	auth := []string{"-H", "authorization: Bearer grpcurl-token"}
	tlsArgs := []string{"-cacert", caFile}

	code, out := runTool(t, grpcurl, append(tlsArgs, n.Addr, "list")...)
	if code == 0 || !strings.Contains(out, "Unauthenticated") {
		t.Fatalf("grpcurl list without the token: exit %d, want Unauthenticated\n%s", code, out)
	}
	code, out = runTool(t, grpcurl, append(append(tlsArgs, "-H", "authorization: Bearer wrong"), n.Addr, "list")...)
	if code == 0 || !strings.Contains(out, "Unauthenticated") {
		t.Fatalf("grpcurl list with a wrong token: exit %d, want Unauthenticated\n%s", code, out)
	}
	code, out = runTool(t, grpcurl, append(append(tlsArgs, auth...), n.Addr, "list")...)
	if code != 0 {
		t.Fatalf("grpcurl list with the token: exit %d\n%s", code, out)
	}
	wantServices(t, out)
	code, out = runTool(t, grpcurl, append(append(tlsArgs, auth...), n.Addr, "describe", "sequencer.v1.SequencerService")...)
	if code != 0 || !strings.Contains(out, "rpc Send (") {
		t.Fatalf("grpcurl describe with the token: exit %d\n%s", code, out)
	}
	res := grpcurlJSON(t, grpcurl, append(append(tlsArgs, auth...), "-d",
		`{"convId":"g:tls","fromUid":"7","clientMsgId":"tls-1","body":"aGk="}`, n.Addr, "sequencer.v1.SequencerService/Send")...)
	if res["seq"] != "1" {
		t.Fatalf("Send over TLS: %v", res)
	}
	pull := grpcurlJSON(t, grpcurl, append(append(tlsArgs, auth...), "-d", `{"convId":"g:tls"}`, n.Addr, "sequencer.v1.SequencerService/Pull")...)
	subscribeWithGRPCurl(t, grpcurl, append(tlsArgs, auth...), n.Addr, "g:tls", "tls-1")
	if msgs, _ := pull["messages"].([]any); len(msgs) != 1 || pull["headSeq"] != "1" {
		t.Fatalf("Pull over TLS: %v", pull)
	}

	code, out = runTool(t, probe, "-addr", n.Addr, "-tls", "-tls-ca-cert", caFile)
	if code != 0 || !strings.Contains(out, "SERVING") {
		t.Fatalf("grpc-health-probe over TLS without a token: exit %d\n%s", code, out)
	}
	// grpcurl itself needs reflection (so the token) to build a health
	// request; the health service does not.
	code, out = runTool(t, grpcurl, append(append(tlsArgs, auth...), "-d", `{"service":"sequencer.v1.SequencerService"}`, n.Addr, "grpc.health.v1.Health/Check")...)
	if code != 0 || !strings.Contains(out, `"SERVING"`) {
		t.Fatalf("grpcurl health Check: exit %d\n%s", code, out)
	}
}

// grpcurl's Watch of grpc.health.v1 on a single node streams SERVING, then
// NOT_SERVING when SIGTERM starts the drain; the stream then ends
// (unavailable) and the node exits 0 long before its drain timeout: the
// open Watch does not hold the graceful stop.
func TestGRPCHealthWatchStreamsTheDrain(t *testing.T) {
	grpcurl := grpcTool(t, "grpcurl")
	n := startNode(t, "node", "--store", t.TempDir(), "--drain-timeout", "5m")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	watch := exec.CommandContext(ctx, grpcurl, "-plaintext", "-d", `{"service":""}`, n.Addr, "grpc.health.v1.Health/Watch")
	stdout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	watch.Stderr = &stderr
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	statuses := make(chan string, 16)
	go func() {
		defer close(statuses)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, `"status"`) {
				statuses <- l
			}
		}
	}()
	next := func() string {
		select {
		case s, ok := <-statuses:
			if !ok {
				return "(stream ended)"
			}
			return s
		case <-time.After(30 * time.Second):
			t.Fatalf("no Watch status within 30s; stderr %s", stderr.String())
			return ""
		}
	}
	if s := next(); s != `"status": "SERVING"` {
		t.Fatalf("first Watch status %s, want SERVING", s)
	}
	exited := make(chan error, 1)
	go func() { exited <- n.term(60 * time.Second) }()
	if s := next(); s != `"status": "NOT_SERVING"` {
		t.Fatalf("Watch status after SIGTERM %s, want NOT_SERVING", s)
	}
	if s := next(); s != "(stream ended)" {
		t.Fatalf("after NOT_SERVING: %s, want the stream to end", s)
	}
	if err := watch.Wait(); err == nil || !strings.Contains(stderr.String(), "Unavailable") {
		t.Fatalf("grpcurl Watch: %v, stderr %q; want the stream ended with Unavailable", err, stderr.String())
	}
	if err := <-exited; err != nil {
		t.Fatalf("node after SIGTERM with a Watch open: %v (a drain timeout of 5m: it must not wait for the stream)", err)
	}
}

// grpc-health-probe says SERVING while a cluster node serves and NOT_SERVING
// while it drains (the API port still answers during the hand-off of its
// partitions). The test holds the drain open by locking the membership
// version row, which the node's leave must update; /readyz agrees.
func TestGRPCHealthProbeNotServingDuringDrain(t *testing.T) {
	probe := grpcTool(t, "grpc-health-probe")
	dsn := pgtest.NewDatabase(t)
	const partitions = 8
	n := startNode(t, "n1", "--store", dsn, "--cluster-listen", freeAddr(t), "--node-id", "n1",
		"--partitions", fmt.Sprint(partitions), "--drain-timeout", "2m")
	if code, out := runTool(t, probe, "-addr", n.Addr); code != 0 || !strings.Contains(out, "SERVING") {
		t.Fatalf("grpc-health-probe while serving: exit %d\n%s", code, out)
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// Once the node holds every partition it takes no more leases (whose
	// acquire may end a session idle in a transaction that blocks it).
	waitFor(t, 30*time.Second, "n1 to hold every partition", func() bool {
		var held int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM partition_lease WHERE owner <> ''`).Scan(&held)
		return err == nil && held == partitions
	})
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT version FROM cluster_version WHERE id FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- n.term(2 * time.Minute) }()

	var out string
	waitFor(t, 30*time.Second, "grpc-health-probe to say NOT_SERVING during the drain", func() bool {
		var code int
		code, out = runTool(t, probe, "-addr", n.Addr)
		switch code {
		case 0: // SIGTERM not handled yet
			return false
		case 4:
			return strings.Contains(out, "NOT_SERVING")
		}
		t.Fatalf("grpc-health-probe during the drain: exit %d (the API port must still answer)\n%s", code, out)
		return false
	})
	if code, _ := httpGet("http://" + n.Addr + "/readyz"); code != 503 {
		t.Fatalf("/readyz during the drain: %d, want 503", code)
	}
	if code, out := runTool(t, probe, "-addr", n.Addr, "-service", "sequencer.v1.SequencerService"); code != 4 {
		t.Fatalf("grpc-health-probe -service sequencer.v1.SequencerService during the drain: exit %d\n%s", code, out)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err != nil {
		t.Fatalf("node after the drain: %v", err)
	}
}

// toolExample is one `$ grpcurl ...` or `$ grpc-health-probe ...` command of
// docs/API.md's "From the command line" and the lines printed under it.
type toolExample struct {
	line   int
	args   []string
	output []string
}

// parseToolExamples returns the grpcurl and grpc-health-probe commands of
// the ```sh blocks of doc's section "From the command line", each with its
// arguments split as a shell would ('...' quoting, backslash-newline).
func parseToolExamples(doc string) ([]toolExample, error) {
	lines := strings.Split(doc, "\n")
	var out []toolExample
	in, block := false, false
	var cur *toolExample
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.HasPrefix(l, "## "):
			in = l == "## From the command line"
			continue
		case !in:
			continue
		case strings.HasPrefix(l, "```"):
			block = !block && strings.TrimSpace(strings.TrimPrefix(l, "```")) == "sh"
			cur = nil
			continue
		case !block:
			continue
		}
		if !strings.HasPrefix(l, "$ ") {
			if cur != nil {
				cur.output = append(cur.output, l)
			}
			continue
		}
		cmd, first := strings.TrimPrefix(l, "$ "), i+1
		for strings.HasSuffix(cmd, `\`) && i+1 < len(lines) {
			i++
			cmd = strings.TrimSuffix(cmd, `\`) + lines[i]
		}
		args, err := shellWords(cmd)
		if err != nil {
			return nil, fmt.Errorf("docs/API.md:%d: %v", first, err)
		}
		if args[0] == "curl" {
			cur = nil // run by TestAPIDocCurlExamples
			continue
		}
		if args[0] != "grpcurl" && args[0] != "grpc-health-probe" {
			return nil, fmt.Errorf("docs/API.md:%d: a command the test cannot run: %q", first, cmd)
		}
		out = append(out, toolExample{line: first, args: args})
		cur = &out[len(out)-1]
	}
	return out, nil
}

// shellWords splits s at white space outside single quotes.
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case !quoted && (r == ' ' || r == '\t'):
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, errors.New("unbalanced single quote")
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// sameJSON compares a documented answer with the printed one: the same
// fields and values, except msgId and serverAt, which only have to be there.
func sameJSON(doc, got any) bool {
	switch d := doc.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok || len(g) != len(d) {
			return false
		}
		for k, dv := range d {
			gv, ok := g[k]
			if !ok || (k != "msgId" && k != "serverAt" && !sameJSON(dv, gv)) {
				return false
			}
		}
		return true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(d) {
			return false
		}
		for i := range d {
			if !sameJSON(d[i], g[i]) {
				return false
			}
		}
		return true
	}
	return fmt.Sprint(doc) == fmt.Sprint(got)
}

// TestAPIDocToolExamples runs docs/API.md's grpcurl and grpc-health-probe
// examples, in order, against a fresh node and checks what they print.
func TestAPIDocToolExamples(t *testing.T) {
	tools := map[string]string{"grpcurl": grpcTool(t, "grpcurl"), "grpc-health-probe": grpcTool(t, "grpc-health-probe")}
	raw, err := os.ReadFile(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	examples, err := parseToolExamples(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	if len(examples) < 7 {
		t.Fatalf("%s: %d grpcurl/grpc-health-probe examples in \"From the command line\", want at least 7", apiDoc, len(examples))
	}
	n := startNode(t, "doc", "--store", t.TempDir())
	for _, ex := range examples {
		args := make([]string, 0, len(ex.args)-1)
		for _, a := range ex.args[1:] {
			args = append(args, strings.ReplaceAll(a, docHost, n.Addr))
		}
		code, out := runTool(t, tools[ex.args[0]], args...)
		if code != 0 {
			t.Fatalf("docs/API.md:%d: %v: exit %d\n%s", ex.line, ex.args, code, out)
		}
		want := strings.Join(ex.output, "\n")
		got := strings.TrimRight(out, "\n")
		if strings.HasPrefix(want, "{") {
			var dv, gv any
			if err := json.Unmarshal([]byte(want), &dv); err != nil {
				t.Fatalf("docs/API.md:%d: documented output is not JSON: %v", ex.line, err)
			}
			if err := json.Unmarshal([]byte(got), &gv); err != nil || !sameJSON(dv, gv) {
				t.Fatalf("docs/API.md:%d: %v printed\n%s\ndocumented\n%s", ex.line, ex.args, got, want)
			}
			continue
		}
		if got != want {
			t.Fatalf("docs/API.md:%d: %v printed\n%s\ndocumented\n%s", ex.line, ex.args, got, want)
		}
	}
}

// subscribeWithGRPCurl streams a Subscribe of conv from seq 0 with grpcurl
// for a few seconds (the stream never ends by itself: grpcurl's -max-time
// ends it) and checks that the events came, the last one with wantKey.
func subscribeWithGRPCurl(t *testing.T, grpcurl string, args []string, addr, conv, wantKey string) {
	t.Helper()
	_, out := runTool(t, grpcurl, append(append([]string{}, args...), "-max-time", "3", "-d",
		`{"cursors":[{"convId":"`+conv+`"}]}`, addr, "sequencer.v1.SequencerService/Subscribe")...)
	if !strings.Contains(out, `"message": {`) || !strings.Contains(out, `"seq": "1"`) || !strings.Contains(out, `"clientMsgId": "`+wantKey+`"`) {
		t.Fatalf("grpcurl Subscribe of %s: no stored messages streamed\n%s", conv, out)
	}
}
