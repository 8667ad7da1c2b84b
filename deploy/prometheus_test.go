package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/internal/natstest"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// TestPrometheusScrapesDashboardQueries runs a real Prometheus (Debian's
// prometheus binary) that scrapes two real `sequencer serve` processes: one on
// the embedded store in a temp dir, one in cluster mode on a fresh PostgreSQL
// database (so the cluster panels have data). While sends flow, every query
// of deploy/grafana/sequencer.json must return data through Prometheus' HTTP
// API, the alert rules must load and evaluate without error, and every metric
// the rules name must exist.
//
// The embedded node publishes to a private nats-server (the firehose).
// It runs when SEQUENCER_TEST_PROMETHEUS=1 (make deploy-check, .ci/run), and
// then fails when prometheus is missing.
func TestPrometheusScrapesDashboardQueries(t *testing.T) {
	if os.Getenv("SEQUENCER_TEST_PROMETHEUS") != "1" {
		t.Skip("set SEQUENCER_TEST_PROMETHEUS=1 (make deploy-check) to run Prometheus against real nodes")
	}
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("SEQUENCER_TEST_PROMETHEUS=1 but no prometheus binary: apt-get install prometheus (scripts/deploy-check.sh does): %v", err)
	}
	dir := t.TempDir()
	bin := buildSequencer(t)

	// The embedded node runs the firehose (a private nats-server) so the
	// firehose panel and alert have data.
	nats := natstest.Start(t)
	embedded := startNode(t, bin, "embedded", "--store", filepath.Join(dir, "data"), "--feed-nats", nats.URL(), "--feed-create-stream")
	clustered := startNode(t, bin, "clustered", "--store", pgtest.NewDatabase(t),
		"--cluster-listen", "127.0.0.1:0", "--node-id", "clustered")
	nodes := []string{embedded, clustered}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, addr := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); sendLoop(ctx, t, addr) }()
	}

	promAddr := startPrometheus(t, promBin, dir, nodes)
	api := func(path string, q url.Values) json.RawMessage {
		resp, err := http.Get("http://" + promAddr + path + "?" + q.Encode())
		if err != nil {
			t.Fatalf("prometheus %s: %v", path, err)
		}
		defer resp.Body.Close()
		var r struct {
			Status string
			Data   json.RawMessage
			Error  string
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Status != "success" {
			t.Fatalf("prometheus %s %v: status %q error %q (%v)", path, q, r.Status, r.Error, err)
		}
		return r.Data
	}
	waitFor(t, 60*time.Second, "both nodes scraped and up", func() (bool, string) {
		var d struct {
			ActiveTargets []struct{ Health, ScrapeURL, LastError string }
		}
		json.Unmarshal(api("/api/v1/targets", nil), &d)
		up := 0
		for _, tg := range d.ActiveTargets {
			if tg.Health == "up" {
				up++
			}
		}
		return up == len(nodes), fmt.Sprintf("%+v", d.ActiveTargets)
	})

	// Every dashboard query returns at least one series.
	for name, expr := range dashboardQueries(t, "15s") {
		waitFor(t, 60*time.Second, fmt.Sprintf("dashboard query %q (%s) returns data", name, expr), func() (bool, string) {
			var d struct {
				Result []struct {
					Metric map[string]string
					Value  []any
				}
			}
			if err := json.Unmarshal(api("/api/v1/query", url.Values{"query": {expr}}), &d); err != nil {
				return false, err.Error()
			}
			for _, r := range d.Result {
				if len(r.Value) == 2 && r.Value[1] != "NaN" {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%+v", d.Result)
		})
	}

	// Every metric the alert rules name is exported by a node.
	var names []string
	json.Unmarshal(api("/api/v1/label/__name__/values", nil), &names)
	for alert, expr := range alertExprs(t) {
		for _, m := range metricName.FindAllString(expr, -1) {
			if !slices.Contains(names, m) {
				t.Errorf("alert %s uses %s, which no node exports", alert, m)
			}
		}
	}
	// The rules loaded and evaluate without error.
	waitFor(t, 60*time.Second, "every alert rule evaluated without error", func() (bool, string) {
		var d struct {
			Groups []struct {
				Rules []struct {
					Name, Health, LastError string
					LastEvaluation          time.Time
				}
			}
		}
		json.Unmarshal(api("/api/v1/rules", nil), &d)
		n, ok := 0, true
		var bad []string
		for _, g := range d.Groups {
			for _, r := range g.Rules {
				n++
				if r.Health != "ok" || r.LastEvaluation.IsZero() {
					ok = false
					bad = append(bad, fmt.Sprintf("%s: %s %s", r.Name, r.Health, r.LastError))
				}
			}
		}
		return ok && n == len(alertExprs(t)), fmt.Sprintf("%d rules loaded, not ok: %v", n, bad)
	})
}

var built struct {
	sync.Once
	bin string
	err error
}

// buildSequencer builds cmd/sequencer once per test binary.
func buildSequencer(t *testing.T) string {
	t.Helper()
	built.Do(func() {
		dir, err := os.MkdirTemp("", "sequencer-deploy-test")
		if err != nil {
			built.err = err
			return
		}
		built.bin = filepath.Join(dir, "sequencer")
		if out, err := exec.Command("go", "build", "-o", built.bin, "../cmd/sequencer").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// startNode runs `sequencer serve` on 127.0.0.1:0 and returns its API address
// (from the JSON "serving" log line). It is stopped with SIGTERM at cleanup.
func startNode(t *testing.T, bin, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--log-format", "json"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	var logMu sync.Mutex
	var log strings.Builder
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logMu.Lock()
			log.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			var rec struct{ Msg, Listen string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "serving" {
				addr <- rec.Listen
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				logMu.Lock()
				t.Errorf("%s: %v after SIGINT:\n%s", name, err, log.String())
				logMu.Unlock()
			}
		case <-time.After(45 * time.Second):
			cmd.Process.Kill()
			t.Errorf("%s did not stop within 45s", name)
		}
	})
	select {
	case a := <-addr:
		return a
	case <-time.After(60 * time.Second):
		logMu.Lock()
		defer logMu.Unlock()
		t.Fatalf("%s: no \"serving\" line within 60s:\n%s", name, log.String())
		return ""
	}
}

// sendLoop sends until ctx ends: new messages to a few conversations, a
// resend (duplicate) and an invalid send, so every send code the dashboard
// shows has a series.
func sendLoop(ctx context.Context, t *testing.T, addr string) {
	post := func(body string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/sequencer.v1.SequencerService/Send", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("send to %s: %v", addr, err)
			}
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for i := 0; ctx.Err() == nil; i++ {
		post(fmt.Sprintf(`{"convId":"g:%d","fromUid":"7","clientMsgId":"m%d","body":"aGk="}`, i%5, i))
		post(fmt.Sprintf(`{"convId":"g:%d","fromUid":"7","clientMsgId":"m%d","body":"aGk="}`, i%5, i)) // duplicate
		post(`{"convId":"g:1","fromUid":"7","clientMsgId":""}`)                                        // invalid_argument
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startPrometheus runs prometheus with a temp config (1s scrapes of nodes,
// the alert rules evaluated every second) and temp storage, and returns its
// address once it answers /-/ready.
func startPrometheus(t *testing.T, bin, dir string, nodes []string) string {
	t.Helper()
	rules, err := filepath.Abs("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	targets, _ := json.Marshal(nodes)
	cfg := filepath.Join(dir, "prometheus.yml")
	os.WriteFile(cfg, fmt.Appendf(nil, `global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: sequencer
    static_configs:
      - targets: %s
`, rules, targets), 0o644)
	// Prometheus cannot report a port it chose itself, so take a free one
	// from the kernel and retry if another process grabs it first.
	for attempt := 0; attempt < 3; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		var out lockedLog
		cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, fmt.Sprintf("tsdb%d", attempt)),
			"--web.listen-address="+addr, "--log.level=warn")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case err := <-exited:
				t.Logf("prometheus on %s exited (%v): %s", addr, err, out.String())
				goto next
			default:
			}
			if resp, err := http.Get("http://" + addr + "/-/ready"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					t.Cleanup(func() {
						cmd.Process.Signal(os.Interrupt)
						select {
						case <-exited:
						case <-time.After(30 * time.Second):
							cmd.Process.Kill()
						}
					})
					return addr
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		cmd.Process.Kill()
		t.Fatalf("prometheus not ready within 60s: %s", out.String())
	next:
	}
	t.Fatal("prometheus could not start on a free port three times")
	return ""
}

// lockedLog collects a process's output for failure messages.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor polls cond until it holds or the deadline passes; the last detail
// is in the failure.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last: %s", what, timeout, detail)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
