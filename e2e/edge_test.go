package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// runOnce runs the binary with args to completion (bounded) and returns its
// exit code and output.
func runOnce(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binPath, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("run %v: %v", args, err)
	return 0, ""
}

// docs/API.md, "Command line": a second process on the embedded store's directory exits 1
// and names the holder.
func TestSecondProcessOnTheDataDirExits1(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // created by the node
	first := startNode(t, "first", "--store", dir, "--node-id", "first-node")
	code, out := runOnce(t, "serve", "--listen", freeAddr(t), "--store", dir, "--node-id", "second-node")
	pid := strconv.Itoa(first.cmd.Process.Pid)
	if code != 1 || !strings.Contains(out, "pid "+pid) || !strings.Contains(out, "first-node") {
		t.Fatalf("second process: exit %d, output %q; want exit 1 naming pid %s node first-node", code, out, pid)
	}
	for name, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, filepath.Join(dir, "sequencer.db"): 0o600} {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want.Perm() {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
	}
	// Once the first is gone (even by kill -9), the directory is free.
	first.kill()
	n := startNode(t, "after", "--store", dir)
	n.kill()
}

func TestStoreRefusedIsAUsageError(t *testing.T) {
	for _, store := range []string{"MYSQL://root:Pw-Mysql-1@127.0.0.1/x", "root:Pw-Drv-1@tcp(127.0.0.1:3306)/x", "postgress://u:Pw-Typo-1@127.0.0.1/x", "POSTGRES://u:Pw-Up-1@127.0.0.1/x"} {
		dir := t.TempDir()
		cmd := exec.Command(binPath, "serve", "--listen", freeAddr(t), "--store", store)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || strings.Count(string(out), "\n") != 1 || strings.Contains(string(out), "Pw-") {
			t.Fatalf("--store %s: %v, output %q; want exit 2, one line, no password", store, err, out)
		}
		if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
			t.Fatalf("--store %s started an embedded store in ./data", store)
		}
	}
}

// A mysql:// store whose server refuses the password is not a usage error
// (exit 1), and neither the password nor its spellings are printed.
func TestMySQLRefusedPasswordIsNotPrinted(t *testing.T) {
	cmd := exec.Command(binPath, "serve", "--listen", freeAddr(t), "--store", "mysql://root:Pw-Mysql-2@127.0.0.1:1/x?timeout=2s")
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || strings.Contains(string(out), "Pw-") || !strings.Contains(string(out), "xxxxx") {
		t.Fatalf("%v, output %q; want exit 1, the password hidden", err, out)
	}
}

// SIGHUP re-reads --auth-token-file; a broken file keeps the old tokens.
func TestSIGHUPReloadsTokens(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte("first-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, "node", "--store", t.TempDir(), "--auth-token-file", file)
	call := func(token string) int {
		req := `{"convId":"g:1"}`
		code, _ := postJSONAuth(t, n.Addr, "GetHead", req, token)
		return code
	}
	if call("first-token") != 200 || call("second-token") != 401 || call("") != 401 {
		t.Fatal("initial tokens not enforced")
	}
	if err := os.WriteFile(file, []byte("# rotated\nsecond-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n.cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the rotated token to be accepted", func() bool { return call("second-token") == 200 })
	if call("first-token") != 401 {
		t.Fatal("the old token still works after the reload")
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n.cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the failed reload to be logged", func() bool { return strings.Contains(n.Output(), "reload failed") })
	if call("second-token") != 200 {
		t.Fatal("a failed reload dropped the tokens in force")
	}
}

// A PostgreSQL outage under load is logged at the default level as a few
// WARN lines (not zero, not one per failed send), its end at INFO; and no
// form of the DSN's password appears in the output, whatever happens.
func TestPostgresOutageLogsAFewWarningsAndNoPassword(t *testing.T) {
	srv := pgtest.StartServer(t)
	const pw = "Pw-Outage-Secret-7"
	dsn := strings.Replace(srv.DSN(), "://postgres@", "://postgres:"+pw+"@", 1)
	n := startNode(t, "node", "--store", dsn)
	c := n.grpcClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := send(ctx, c, "g:1", 1, "before", nil); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	failed := 0
	warnLines := func() int { return strings.Count(n.Output(), "level=WARN") }
	// Keep sending while down until the outage has been logged AND a few
	// hundred sends have failed.
	waitFor(t, 60*time.Second, "the outage to be logged under load", func() bool {
		for i := 0; i < 50; i++ {
			sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
			if _, err := send(sctx, c, fmt.Sprintf("g:%d", i%20), 1, fmt.Sprintf("down-%d-%d", failed, i), nil); err != nil {
				failed++
			}
			scancel()
		}
		return failed >= 300 && strings.Contains(n.Output(), "store unreachable")
	})
	if w := warnLines(); w < 1 || w > 30 {
		t.Fatalf("%d WARN lines for %d failed sends; want a few\n%s", w, failed, lastLines(n.Output(), 40))
	}
	t.Logf("%d WARN lines for %d failed sends", warnLines(), failed)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the store's return to be logged", func() bool { return strings.Contains(n.Output(), "store reachable again") })
	waitFor(t, 60*time.Second, "a send to succeed again", func() bool {
		_, err := send(ctx, c, "g:1", 1, "after", nil)
		return err == nil
	})
	if err := n.term(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(n.Output(), pw) {
		t.Fatalf("the password is in the output:\n%s", n.Output())
	}
}

// postJSONAuth is postJSON with a bearer token (none when empty).
func postJSONAuth(t testing.TB, addr, method, body, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+addr+"/sequencer.v1.SequencerService/"+method, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
