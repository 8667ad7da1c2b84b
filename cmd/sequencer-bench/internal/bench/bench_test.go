package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/sequencer-im/sequencer/persist/citustest"
	"github.com/sequencer-im/sequencer/persist/mysqltest"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(fakeSequencerEnv) == "1" {
		os.Exit(fakeSequencer(os.Args[1:]))
	}
	code := m.Run()
	pgtest.Stop()
	mysqltest.Stop()
	citustest.Stop()
	os.Exit(code)
}

// The bench command, run with tiny numbers against the seed's Redis approach
// and the COPY ceiling, writes a report with one row per engine and
// scenario, and removes its database and Redis keys afterwards.
func TestMainSmokeWritesReport(t *testing.T) {
	admin := pgtest.AdminDSN(t)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("engine b needs Redis at 127.0.0.1:6379: %v", err)
	}
	dir := t.TempDir()
	report := filepath.Join(dir, "out", "bench.md")
	var stdout, stderr bytes.Buffer
	args := []string{
		"--engines", "b,c,d", "--scenarios", "many,hot",
		"--duration", "700ms", "--warmup", "100ms", "--senders", "8", "--convs", "20",
		"--pool", "4", "--copy-writers", "2", "--pg", admin, "--report", report, "--progress", "200ms",
	}
	if err := Main(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Main: %v\nstderr:\n%s", err, stderr.String())
	}

	md, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("markdown report: %v", err)
	}
	for _, want := range []string{"## many:", "## hot:", "| b Redis INCR + INSERT |", "| c DB segment + INSERT |", "| d COPY, no seq (ceiling) |", "bench.svg", "synchronous_commit=on"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("markdown report lacks %q:\n%s", want, md)
		}
	}
	jb, err := os.ReadFile(filepath.Join(dir, "out", "bench.json"))
	if err != nil {
		t.Fatalf("json report: %v", err)
	}
	var rep Report
	if err := json.Unmarshal(jb, &rep); err != nil {
		t.Fatalf("json report does not parse: %v", err)
	}
	got := map[string]Result{}
	for _, r := range rep.Results {
		got[r.Engine+"/"+r.Scenario] = r
	}
	for _, key := range []string{"b/many", "c/many", "d/many", "b/hot", "c/hot", "d/hot"} {
		r, ok := got[key]
		if !ok {
			t.Errorf("json report has no row %s", key)
			continue
		}
		if r.Messages == 0 || r.Errors != 0 || r.Throughput <= 0 || r.Latency.P99 <= 0 {
			t.Errorf("%s: messages=%d errors=%d (%s) msg/s=%.0f p99=%v; want messages and no errors", key, r.Messages, r.Errors, r.ErrorSample, r.Throughput, r.Latency.P99)
		}
		if r.MeanBatch < 1 || r.MeanCommitMs <= 0 {
			t.Errorf("%s: mean batch %.2f, commit %.3f ms; want >= 1 and > 0", key, r.MeanBatch, r.MeanCommitMs)
		}
	}
	svg, err := os.ReadFile(filepath.Join(dir, "out", "bench.svg"))
	if err != nil {
		t.Fatalf("svg chart: %v", err)
	}
	if !bytes.HasPrefix(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("throughput")) || !bytes.Contains(svg, []byte("p99")) {
		t.Errorf("svg chart lacks its panels:\n%s", svg)
	}
	if !strings.Contains(stdout.String(), "Redis INCR + INSERT") || !strings.Contains(stdout.String(), "p99 ms") {
		t.Errorf("final table missing:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "msg/s") {
		t.Errorf("no progress line on stderr:\n%s", stderr.String())
	}

	// Nothing is left behind.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", rep.Info.Database).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if rep.Info.Database == "" || n != 0 {
		t.Errorf("database %q still exists (%d)", rep.Info.Database, n)
	}
	keys, _, err := rdb.Scan(ctx, 0, "seqbench:"+rep.Info.RunID+":*", 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("redis keys left: %v", keys)
	}
}

// With --keep the stored rows can be checked: every baseline wrote the row
// shape of docs/API.md ("Storage schema") and per-conversation seqs without duplicates.
func TestBaselinesStoreContractRows(t *testing.T) {
	admin := pgtest.AdminDSN(t)
	var stdout, stderr bytes.Buffer
	args := []string{
		"--engines", "b,c,d", "--scenarios", "many", "--messages", "300", "--senders", "6", "--convs", "5", "--repeat", "2",
		"--pool", "3", "--copy-writers", "2", "--pg", admin, "--keep", "--progress", "-1s", "--report", filepath.Join(t.TempDir(), "r.md"),
	}
	if err := Main(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Main: %v\nstderr:\n%s", err, stderr.String())
	}
	jb, err := os.ReadFile(filepath.Join(filepath.Dir(args[len(args)-1]), "r.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(jb, &rep); err != nil {
		t.Fatal(err)
	}
	db := &benchDB{admin: admin, Name: rep.Info.Database}
	db.DSN, _ = withDatabase(admin, db.Name)
	t.Cleanup(func() { _ = db.Drop(context.Background()) })
	t.Cleanup(func() {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
		defer rdb.Close()
		_ = deleteRedisPrefix(context.Background(), rdb, "seqbench:"+rep.Info.RunID+":")
	})

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, r := range rep.Results {
		if len(r.RunsThroughput) != 2 || len(r.RunsP99) != 2 {
			t.Errorf("%s/%s: runs %v %v, want 2 each with --repeat 2", r.Engine, r.Scenario, r.RunsThroughput, r.RunsP99)
		}
	}
	for _, schema := range []string{"b_many", "c_many", "d_many", "b_many_r2", "c_many_r2", "d_many_r2"} {
		var rows, convs, dupSeqs int
		var minSeq, maxSeq int64
		q := `SELECT count(*), count(DISTINCT conv_id), min(seq), max(seq) FROM ` + schema + `.im_message`
		if err := conn.QueryRow(ctx, q).Scan(&rows, &convs, &minSeq, &maxSeq); err != nil {
			t.Fatalf("%s: %v", schema, err)
		}
		if rows != 300 || convs == 0 || convs > 5 {
			t.Errorf("%s: %d rows in %d conversations, want 300 rows in 1..5", schema, rows, convs)
		}
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT conv_id, seq FROM `+schema+`.im_message GROUP BY 1, 2 HAVING count(*) > 1) x`).Scan(&dupSeqs); err != nil {
			t.Fatal(err)
		}
		if dupSeqs != 0 {
			t.Errorf("%s: %d duplicate (conv_id, seq)", schema, dupSeqs)
		}
		if !strings.HasPrefix(schema, "d_") {
			// b and c number each conversation 1, 2, 3, ... (no send failed).
			var holes int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT conv_id FROM `+schema+`.im_message GROUP BY conv_id HAVING max(seq) <> count(*) OR min(seq) <> 1) x`).Scan(&holes)
			if err != nil {
				t.Fatal(err)
			}
			if holes != 0 {
				t.Errorf("%s: %d conversations whose seqs are not 1..n", schema, holes)
			}
		}
	}
	var floors int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM c_many.seq_segment`).Scan(&floors); err != nil {
		t.Fatal(err)
	}
	if floors == 0 {
		t.Errorf("engine c took no segment")
	}
}

func TestMainHelpAndBadFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if err := Main(context.Background(), []string{"--help"}, &out, &errb); err != nil {
		t.Fatalf("--help: %v", err)
	}
	if !strings.Contains(errb.String(), "--engines") && !strings.Contains(errb.String(), "-engines") {
		t.Errorf("--help does not list flags:\n%s", errb.String())
	}
	for _, args := range [][]string{
		{"--engines", "z"},
		{"--scenarios", "nope"},
		{"--engines", "e"},      // needs --target
		{"--engines", "e-json"}, // so does every e engine
		{"--engines", "e-batch-sqlite", "--target", "http://127.0.0.1:1"}, // starts its own server
		{"--skew", "0.5"},
		{"--engines", "a", "--batches-in-flight", "-1"},
		{"--engines", "a", "--batches-in-flight", "65"},
		{"stray"},
	} {
		errb.Reset()
		if err := Main(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("Main(%q) succeeded, want an error", args)
		}
	}
}

// Engine a (this sequencer in process) through the bench: its rows are
// contiguous per conversation, and in the memory scenario passivation brings
// the live actors back to zero.
func TestNodeEngineContiguousAndPassivates(t *testing.T) {
	admin := pgtest.AdminDSN(t)
	var stdout, stderr bytes.Buffer
	report := filepath.Join(t.TempDir(), "a.md")
	args := []string{
		"--engines", "a", "--scenarios", "many,memory", "--messages", "400", "--senders", "8", "--convs", "6",
		"--memory-convs", "300", "--passivate", "200ms", "--idle-wait", "10s",
		"--pool", "4", "--pg", admin, "--keep", "--progress", "-1s", "--report", report,
	}
	if err := Main(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Main: %v\nstderr:\n%s", err, stderr.String())
	}
	rep := readReport(t, report)
	db := &benchDB{admin: admin, Name: rep.Info.Database}
	db.DSN, _ = withDatabase(admin, db.Name)
	t.Cleanup(func() { _ = db.Drop(context.Background()) })

	many, ok := find(rep.Results, "a", "many")
	if !ok || many.Messages != 400 || many.Errors != 0 || many.MeanBatch < 1 || many.MeanCommitMs <= 0 {
		t.Fatalf("a/many: %+v", many)
	}
	mem, ok := find(rep.Results, "a", "memory")
	if !ok || mem.Memory == nil {
		t.Fatalf("a/memory: %+v", mem)
	}
	m := mem.Memory
	if mem.Messages != 300 || m.PeakLive == 0 || m.BytesPerActor <= 0 || m.PeakRSS == 0 {
		t.Errorf("a/memory: %d messages, %+v", mem.Messages, *m)
	}
	if m.LiveAfterIdle != 0 {
		t.Errorf("a/memory: %d actors still live after %.1fs idle with --passivate 200ms", m.LiveAfterIdle, m.IdleSeconds)
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for schema, want := range map[string]int{"a_many": 400, "a_memory": 300} {
		var rows, bad int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.im_message`).Scan(&rows); err != nil {
			t.Fatalf("%s: %v", schema, err)
		}
		err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT conv_id FROM `+schema+`.im_message GROUP BY conv_id HAVING max(seq) <> count(*) OR min(seq) <> 1) x`).Scan(&bad)
		if err != nil {
			t.Fatal(err)
		}
		if rows != want || bad != 0 {
			t.Errorf("%s: %d rows (want %d), %d conversations whose seqs are not 1..n", schema, rows, want, bad)
		}
	}
}

// On a shared machine the memory scenario must not run away: past
// --max-rss-mib it stops early and says so.
func TestMemoryScenarioStopsAtRSSLimit(t *testing.T) {
	admin := pgtest.AdminDSN(t)
	var stdout, stderr bytes.Buffer
	report := filepath.Join(t.TempDir(), "m.md")
	args := []string{"--engines", "a", "--scenarios", "memory", "--memory-convs", "1000000", "--senders", "8",
		"--max-rss-mib", "1", "--idle-wait", "1ms", "--pool", "4", "--pg", admin, "--progress", "-1s", "--report", report}
	if err := Main(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Main: %v\nstderr:\n%s", err, stderr.String())
	}
	rep := readReport(t, report)
	mem, ok := find(rep.Results, "a", "memory")
	if !ok || mem.Memory == nil || !mem.Memory.StoppedAtRSS || mem.Messages >= 1000000 {
		t.Fatalf("memory run not stopped at the RSS limit: %+v", mem)
	}
	md, _ := os.ReadFile(report)
	if !strings.Contains(string(md), "stopped early at the RSS limit") {
		t.Errorf("report does not say the run stopped early:\n%s", md)
	}
}

// An engine that cannot run does not lose the others' measurements: the
// report is written with the failure in it, and Main returns the error.
func TestFailedEngineKeepsOthersInReport(t *testing.T) {
	admin := pgtest.AdminDSN(t)
	var stdout, stderr bytes.Buffer
	report := filepath.Join(t.TempDir(), "f.md")
	args := []string{"--engines", "d,e", "--serve-bin", filepath.Join(t.TempDir(), "no-such-sequencer"), "--scenarios", "many",
		"--duration", "300ms", "--warmup", "0s", "--senders", "4", "--convs", "10", "--pg", admin, "--progress", "-1s", "--report", report}
	err := Main(context.Background(), args, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "engine e, scenario many") {
		t.Fatalf("Main: %v, want engine e's failure", err)
	}
	md, rerr := os.ReadFile(report)
	if rerr != nil {
		t.Fatalf("no report after a failed engine: %v", rerr)
	}
	if !strings.Contains(string(md), "| d COPY, no seq (ceiling) |") || !strings.Contains(string(md), "skipped: failed: engine e") {
		t.Errorf("report lacks d's row or e's failure:\n%s", md)
	}
}

// Ctrl-C mid-run: the run stops at once, the report keeps what was measured
// (marked interrupted), and the database is dropped.
func TestInterruptWritesPartialReport(t *testing.T) {
	admin := pgtest.AdminDSN(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout bytes.Buffer
	// Interrupt once the progress line shows measured sends (not after a
	// fixed time: opening the engine may take longer on a busy machine).
	stderr := &watchWriter{match: func(line string) bool {
		return strings.Contains(line, " measure ") && !strings.Contains(line, " sent 0 ")
	}, seen: make(chan struct{})}
	report := filepath.Join(t.TempDir(), "i.md")
	args := []string{"--engines", "d", "--scenarios", "many,hot", "--duration", "1m", "--warmup", "0s", "--senders", "4",
		"--convs", "10", "--pg", admin, "--progress", "100ms", "--report", report}
	done := make(chan error, 1)
	go func() { done <- Main(ctx, args, &stdout, stderr) }()
	select {
	case <-stderr.seen:
		cancel()
	case err := <-done:
		t.Fatalf("Main returned before the interrupt: %v\n%s", err, stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("no measured sends within 60s:\n%s", stderr.String())
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Main did not return within 30s of the interrupt")
	}
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Main: %v, want interrupted", err)
	}
	jb, rerr := os.ReadFile(strings.TrimSuffix(report, ".md") + ".json")
	if rerr != nil {
		t.Fatalf("no report after interrupt: %v", rerr)
	}
	var rep Report
	if err := json.Unmarshal(jb, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 || !rep.Results[0].Interrupted || rep.Results[0].Messages == 0 {
		t.Fatalf("results %+v, want d/many measured and marked interrupted", rep.Results)
	}
	if md, _ := os.ReadFile(report); !strings.Contains(string(md), "| d COPY, no seq (ceiling) (interrupted) |") {
		t.Errorf("markdown does not mark the interrupted run:\n%s", md)
	}
	conn, cerr := pgx.Connect(context.Background(), admin)
	if cerr != nil {
		t.Fatal(cerr)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_database WHERE datname = $1", rep.Info.Database).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("database %s left after interrupt", rep.Info.Database)
	}
}

// The default engines: the ones that need a server only when one can be
// had, and the -sqlite e engines only when the bench starts the server.
func TestDefaultEngines(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{ServeBin: "", Target: ""}, "a,b,c,d,a-sqlite"},
		{Config{Target: "http://127.0.0.1:7070"}, "a,b,c,d,e,e-json,e-batch,a-sqlite"},
		{Config{ServeBin: "/bin/sequencer"}, "a,b,c,d,e,e-json,e-batch,a-sqlite,e-sqlite,e-json-sqlite,e-batch-sqlite"},
		{Config{ServeBin: "/bin/sequencer", Target: "http://127.0.0.1:7070"}, "a,b,c,d,e,e-json,e-batch,a-sqlite"},
	} {
		// (No sequencer binary sits beside the test binary, so the first
		// case finds no server.)
		cfg := c.cfg
		cfg.setDefaults()
		if cfg.Engines != c.want {
			t.Errorf("%+v: engines %q, want %q", c.cfg, cfg.Engines, c.want)
		}
	}
}

// watchWriter collects output (safe for concurrent writes) and closes seen
// the first time a line satisfies match.
type watchWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	match func(line string) bool
	seen  chan struct{}
	once  sync.Once
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, line := range strings.Split(string(p), "\n") {
		if w.match(line) {
			w.once.Do(func() { close(w.seen) })
		}
	}
	return w.buf.Write(p)
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// withParam keeps the DSN's other parameters as PostgreSQL reads them: a
// space stays a space (options=-c citus.shard_count=8, which --citus
// documents), and a '+' stays a '+'.
func TestWithParamKeepsOptions(t *testing.T) {
	got, err := withParam("postgres://u:p+q@h:5/db?options=-c%20citus.shard_count%3D8&application_name=a%2Bb", "search_path", "s1")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(got)
	if err != nil {
		t.Fatal(err)
	}
	if o := cfg.RuntimeParams["options"]; o != "-c citus.shard_count=8" {
		t.Fatalf("options %q in %s", o, got)
	}
	if a := cfg.RuntimeParams["application_name"]; a != "a+b" {
		t.Fatalf("application_name %q in %s", a, got)
	}
	if sp := cfg.RuntimeParams["search_path"]; sp != "s1" {
		t.Fatalf("search_path %q in %s", sp, got)
	}
}

// readReport reads the JSON report the bench wrote beside report (the
// Markdown file of --report).
func readReport(t *testing.T, report string) Report {
	t.Helper()
	jb, err := os.ReadFile(strings.TrimSuffix(report, ".md") + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(jb, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}
