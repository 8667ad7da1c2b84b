package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/buildinfo"
)

func TestVersionCommandAndFlag(t *testing.T) {
	bi := buildinfo.Get()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb, env(nil)); code != 0 {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errb.String())
		}
		line := out.String()
		for _, want := range []string{bi.Version, bi.Commit, runtime.Version()} {
			if !strings.Contains(line, want) {
				t.Errorf("%v printed %q, lacks %q", args, line, want)
			}
		}
	}
}

func TestNewLoggerFormats(t *testing.T) {
	var buf bytes.Buffer
	l, err := newLogger(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("serving", "listen", "127.0.0.1:7070")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("json format wrote %q: %v", buf.String(), err)
	}
	if rec["msg"] != "serving" || rec["listen"] != "127.0.0.1:7070" || rec["level"] != "INFO" {
		t.Fatalf("json record %v", rec)
	}
	buf.Reset()
	if l, err = newLogger(&buf, "info", "text"); err != nil {
		t.Fatal(err)
	}
	l.Info("serving", "listen", "127.0.0.1:7070")
	if !strings.Contains(buf.String(), "msg=serving listen=127.0.0.1:7070") {
		t.Fatalf("text format wrote %q", buf.String())
	}
	if _, err := newLogger(&buf, "info", "yaml"); err == nil || !strings.Contains(err.Error(), "log-format") {
		t.Fatalf("log-format yaml: %v, want an error naming log-format", err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"serve", "--log-format", "yaml"}, &out, &errb, env(nil)); code == 0 || !strings.Contains(errb.String(), "log-format") {
		t.Fatalf("serve --log-format yaml: exit %d %q, want a failure naming log-format", code, errb.String())
	}
}

// lockedBuffer is a bytes.Buffer safe for the server's logger and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serve --log-format json (here from SEQUENCER_LOG_FORMAT) writes only JSON
// lines, from start to the clean stop after SIGTERM.
func TestServeLogsJSON(t *testing.T) {
	var out bytes.Buffer
	var errb lockedBuffer
	vars := env(map[string]string{
		"SEQUENCER_LOG_FORMAT": "json",
		"SEQUENCER_LISTEN":     "127.0.0.1:0",
		"SEQUENCER_STORE":      filepath.Join(t.TempDir(), "data"),
	})
	exit := make(chan int, 1)
	go func() { exit <- run([]string{"serve"}, &out, &errb, vars) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(errb.String(), `"msg":"serving"`) {
		select {
		case code := <-exit:
			t.Fatalf("serve exited %d before serving: %s", code, errb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no JSON \"serving\" line within 30s: %s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// serve listens for SIGTERM (signal.NotifyContext) before it logs "serving".
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("exit %d after SIGTERM: %s", code, errb.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("serve did not stop within 60s of SIGTERM: %s", errb.String())
	}
	lines := 0
	sc := bufio.NewScanner(strings.NewReader(errb.String()))
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("not a JSON line: %q", sc.Text())
		}
		if rec["msg"] == "stopped cleanly" {
			lines++
		}
	}
	if lines != 1 {
		t.Fatalf("no JSON \"stopped cleanly\" line: %s", errb.String())
	}
}

func TestHealthCommand(t *testing.T) {
	ready := true
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != "/readyz" || !ready {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	var out, errb bytes.Buffer
	if code := run([]string{"health", "--url", srv.URL + "/readyz"}, &out, &errb, env(nil)); code != 0 {
		t.Fatalf("ready node: exit %d %q", code, errb.String())
	}
	mu.Lock()
	ready = false
	mu.Unlock()
	errb.Reset()
	if code := run([]string{"health", "--url", srv.URL + "/readyz"}, &out, &errb, env(nil)); code != 1 || !strings.Contains(errb.String(), "503") {
		t.Fatalf("unready node: exit %d %q, want 1 and the status", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"health", "--url", "http://127.0.0.1:1/readyz", "--timeout", "1s"}, &out, &errb, env(nil)); code != 1 {
		t.Fatalf("nothing listening: exit %d %q, want 1", code, errb.String())
	}
}
