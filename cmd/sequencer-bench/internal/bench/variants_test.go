package bench

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite" // database/sql driver "sqlite", to read the -sqlite engines' files

	"github.com/sequencer-im/sequencer/conv"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// buildSequencer builds the real server binary (cmd/sequencer) into a
// temporary directory.
func buildSequencer(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = "/usr/local/go/bin/go"
	}
	bin := filepath.Join(t.TempDir(), "sequencer")
	if out, err := exec.Command(gobin, "build", "-o", bin, "github.com/sequencer-im/sequencer/cmd/sequencer").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/sequencer: %v\n%s", err, out)
	}
	return bin
}

// storeQuerier is a PostgreSQL schema or a SQLite file holding im_message.
type storeQuerier func(ctx context.Context, q string, dest ...any) error

// checkStored checks one engine's store after exactly n sends without
// errors: n rows, each conversation numbered 1..k, msg_ids unique, every
// body the bench's (the same bytes in every store) and msg_type 1.
func checkStored(t *testing.T, name string, n int, query storeQuerier, bodies map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	var rows, ids, convs, holes, badType int
	if err := query(ctx, `SELECT count(*), count(DISTINCT msg_id), count(DISTINCT conv_id) FROM im_message`, &rows, &ids, &convs); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := query(ctx, `SELECT count(*) FROM (SELECT conv_id FROM im_message GROUP BY conv_id HAVING max(seq) <> count(*) OR min(seq) <> 1) x`, &holes); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := query(ctx, `SELECT count(*) FROM im_message WHERE msg_type <> 1`, &badType); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var body []byte
	var distinctBodies int
	if err := query(ctx, `SELECT count(DISTINCT body) FROM im_message`, &distinctBodies); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := query(ctx, `SELECT body FROM im_message LIMIT 1`, &body); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if rows != n || ids != n || convs == 0 || holes != 0 || badType != 0 || distinctBodies != 1 {
		t.Errorf("%s: %d rows, %d msg_ids, %d conversations, %d not numbered 1..k, %d msg_type <> 1, %d distinct bodies; want %d rows numbered 1..k, one body",
			name, rows, ids, convs, holes, badType, distinctBodies, n)
	}
	bodies[name] = body
}

// Each network and embedded-store variant, on the real server binary,
// stores exactly the messages it was given: contiguous seqs per
// conversation, the bench's body byte for byte (JSON's base64 included),
// no errors; and each reports a CPU figure of the right process.
func TestEngineVariantsStoreMessages(t *testing.T) {
	admin := pgtest.AdminDSN(t)
	bin := buildSequencer(t)
	report := filepath.Join(t.TempDir(), "v.md")
	engines := []string{"e", "e-json", "e-batch", "a-sqlite", "e-sqlite", "e-json-sqlite", "e-batch-sqlite"}
	const n = 400
	var stdout, stderr bytes.Buffer
	args := []string{"--engines", strings.Join(engines, ","), "--scenarios", "many", "--messages", "400", "--senders", "8", "--convs", "5",
		"--serve-bin", bin, "--sqlite-dir", t.TempDir(), "--pg", admin, "--keep", "--progress", "-1s", "--report", report}
	if err := Main(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Main: %v\nstderr:\n%s", err, stderr.String())
	}
	rep := readReport(t, report)
	db := &benchDB{admin: admin, Name: rep.Info.Database}
	db.DSN, _ = withDatabase(admin, db.Name)
	t.Cleanup(func() { _ = db.Drop(context.Background()) })

	// The servers' CPU over the windows, read from /proc/PID/stat: 2,400
	// messages at (today) 100-300 µs each are tens of 10 ms ticks.
	serverCPU := 0.0
	for _, e := range engines {
		r, ok := find(rep.Results, e, "many")
		if r.CPUScope == cpuScopeServer {
			serverCPU += r.CPUSeconds
		}
		wantScope := cpuScopeServer
		if e == "a-sqlite" {
			wantScope = cpuScopeBench
		}
		if !ok || r.Messages != n || r.Errors != 0 || r.CPUScope != wantScope || r.CPUSeconds < 0 || r.MeanBatch < 1 {
			t.Errorf("%s: %+v; want %d messages, no errors, CPU of the %s, a mean batch", e, r, n, wantScope)
		}
	}
	if serverCPU <= 0 {
		t.Errorf("the servers used no CPU time in their measured windows (%v s)", serverCPU)
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	bodies := map[string][]byte{}
	for _, schema := range []string{"e_many", "e_json_many", "e_batch_many"} {
		checkStored(t, schema, n, func(ctx context.Context, q string, dest ...any) error {
			return conn.QueryRow(ctx, strings.ReplaceAll(q, "FROM im_message", "FROM "+schema+".im_message")).Scan(dest...)
		}, bodies)
	}
	if rep.Info.SQLiteDir == "" {
		t.Fatal("report does not say where the SQLite files are")
	}
	for _, file := range []string{"a_sqlite_many", "e_sqlite_many", "e_json_sqlite_many", "e_batch_sqlite_many"} {
		path := filepath.Join(rep.Info.SQLiteDir, file+".db")
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		sdb, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		checkStored(t, file, n, func(ctx context.Context, q string, dest ...any) error {
			return sdb.QueryRowContext(ctx, q).Scan(dest...)
		}, bodies)
		sdb.Close()
	}
	var first []byte
	for name, b := range bodies {
		if len(b) != 128 {
			t.Errorf("%s: body of %d bytes, want 128", name, len(b))
		}
		if first == nil {
			first = b
		} else if !bytes.Equal(b, first) {
			t.Errorf("%s: body differs from another store's: %x vs %x", name, b, first)
		}
	}
}

// The read-position engines seed their conversations and then answer every
// operation without an error, on PostgreSQL and on the embedded store; the
// marks land (the seeded positions and the measured marks are in the
// store); they are not in the default engine list.
func TestReadPositionEngines(t *testing.T) {
	admin := pgtest.AdminDSN(t)
	bin := buildSequencer(t)
	report := filepath.Join(t.TempDir(), "r.md")
	engines := []string{"r-mark", "r-state", "r-mark-sqlite", "r-state-sqlite"}
	const n, convs = 300, 1200
	var stdout, stderr bytes.Buffer
	args := []string{"--engines", strings.Join(engines, ","), "--scenarios", "light", "--messages", fmt.Sprint(n), "--senders", "4", "--convs", fmt.Sprint(convs),
		"--serve-bin", bin, "--sqlite-dir", t.TempDir(), "--pg", admin, "--keep", "--progress", "-1s", "--report", report}
	if err := Main(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Main: %v\nstderr:\n%s", err, stderr.String())
	}
	rep := readReport(t, report)
	db := &benchDB{admin: admin, Name: rep.Info.Database}
	db.DSN, _ = withDatabase(admin, db.Name)
	t.Cleanup(func() { _ = db.Drop(context.Background()) })
	for _, e := range engines {
		r, ok := find(rep.Results, e, "light")
		if !ok || r.Messages != n || r.Errors != 0 || r.Latency.P99 <= 0 {
			t.Errorf("%s: %+v; want %d operations, no errors, a p99", e, r, n)
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var positions, heads int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM r_mark_light.read_position), (SELECT count(*) FROM r_mark_light.conv_head)`).Scan(&positions, &heads); err != nil {
		t.Fatal(err)
	}
	// Every conversation seeded with one message and one position; the
	// measured marks (uids 1..4 on picked conversations) add rows.
	if heads != convs || positions < convs {
		t.Errorf("r-mark store: %d heads, %d positions; want %d heads and at least %d positions", heads, positions, convs, convs)
	}
	cfg := Config{ServeBin: bin}
	cfg.setDefaults()
	if strings.Contains(cfg.Engines, "r-") {
		t.Errorf("default engines %q include the opt-in read-position engines", cfg.Engines)
	}
}

// The event engines seed their conversations and then answer every
// operation without an error, on PostgreSQL and on the embedded store; the
// PostgreSQL store holds exactly that many edit or recall events, and
// recalled targets, and x-send's schema the seeded messages and its sends
// (no event); they are not in the default list.
func TestEventEngines(t *testing.T) {
	admin := pgtest.AdminDSN(t)
	bin := buildSequencer(t)
	report := filepath.Join(t.TempDir(), "x.md")
	engines := []string{"x-send", "x-edit", "x-recall", "x-send-sqlite", "x-edit-sqlite", "x-recall-sqlite"}
	const n, convs = 200, 100
	var stdout, stderr bytes.Buffer
	args := []string{"--engines", strings.Join(engines, ","), "--scenarios", "light", "--messages", fmt.Sprint(n), "--senders", "4", "--convs", fmt.Sprint(convs),
		"--serve-bin", bin, "--sqlite-dir", t.TempDir(), "--pg", admin, "--keep", "--progress", "-1s", "--report", report}
	if err := Main(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Main: %v\nstderr:\n%s", err, stderr.String())
	}
	rep := readReport(t, report)
	db := &benchDB{admin: admin, Name: rep.Info.Database}
	db.DSN, _ = withDatabase(admin, db.Name)
	t.Cleanup(func() { _ = db.Drop(context.Background()) })
	for _, e := range engines {
		r, ok := find(rep.Results, e, "light")
		if !ok || r.Messages != n || r.Errors != 0 {
			t.Errorf("%s: %+v; want %d operations, no errors", e, r, n)
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var edits, edited, recalls, recalled int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM x_edit_light.im_message WHERE kind = 1),
		(SELECT coalesce(sum(edit_count), 0) FROM x_edit_light.im_message WHERE kind = 0),
		(SELECT count(*) FROM x_recall_light.im_message WHERE kind = 2),
		(SELECT count(*) FROM x_recall_light.im_message WHERE kind = 0 AND recalled)`).Scan(&edits, &edited, &recalls, &recalled); err != nil {
		t.Fatal(err)
	}
	if edits < n || edited != edits || recalls < n || recalled != recalls {
		t.Errorf("stored: %d edit events, %d edits applied, %d recall events, %d recalled; want at least %d each, applied = events", edits, edited, recalls, recalled, n)
	}
	var sent, events int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 0 AND from_uid = 1), count(*) FILTER (WHERE kind <> 0)
		FROM x_send_light.im_message`).Scan(&sent, &events); err != nil {
		t.Fatal(err)
	}
	if sent != convs*eventTargets+n || events != 0 {
		t.Errorf("x-send stored %d messages from uid 1 and %d events; want %d seeded + %d sent, no event", sent, events, convs*eventTargets, n)
	}
	cfg := Config{ServeBin: bin}
	cfg.setDefaults()
	if strings.Contains(cfg.Engines, "x-") {
		t.Errorf("default engines %q include the opt-in event engines", cfg.Engines)
	}
}

func TestRecallOrderTakesTheRecentFirst(t *testing.T) {
	for _, n := range []int{1, 8, 16, 32} {
		var got []int
		seen := map[int]bool{}
		for i := range n {
			k := recallOrder(i, n)
			if k < 0 || k >= n || seen[k] {
				t.Fatalf("n=%d: recall %d takes %d (taken so far %v)", n, i, k, got)
			}
			seen[k] = true
			got = append(got, k)
		}
		recent := min(n, recentTargets)
		for i := range recent {
			if got[i] != n-recent+i {
				t.Errorf("n=%d: recall %d takes %d, want the recent %d first, oldest of them first", n, i, got[i], n-recent+i)
			}
		}
	}
	if d := conv.DefaultConfig().TargetCache; d != recentTargets {
		t.Errorf("the writer remembers %d targets, the bench assumes %d", d, recentTargets)
	}
}
