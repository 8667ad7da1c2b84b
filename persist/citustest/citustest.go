// Package citustest gives tests a fresh database on a real Citus cluster: a
// coordinator and two workers.
//
// Cluster choice, in order:
//  1. $SEQUENCER_TEST_CITUS_URL (the coordinator's admin DSN) with
//     $SEQUENCER_TEST_CITUS_WORKERS (the workers' host:port, comma-separated;
//     they must trust the coordinator's connections as user postgres);
//  2. a throwaway cluster started once per test process by
//     scripts/citus.sh start (three initdb clusters in a temporary directory,
//     random free ports of 127.0.0.1), when Citus is installed
//     (scripts/citus.sh build). Packages that use it call Main from TestMain
//     so it is stopped after the run.
//
// When neither works the test FAILS under CI (CI=true, or
// $SEQUENCER_TEST_CITUS_REQUIRED set, as .ci/run does) and is skipped
// otherwise, with a line saying how to run it.
//
// NewDatabase creates a database with a random name on all three nodes,
// creates the citus extension in each, registers the coordinator
// (citus_set_coordinator_host) and the workers (citus_add_node) in it, and
// drops the database on every node when the test ends.
package citustest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Environment variables naming an external cluster.
const (
	EnvURL     = "SEQUENCER_TEST_CITUS_URL"
	EnvWorkers = "SEQUENCER_TEST_CITUS_WORKERS"
	// EnvRequired set (as .ci/run does) makes a test fail, not skip, when
	// no Citus cluster can be had; so does CI=true.
	EnvRequired = "SEQUENCER_TEST_CITUS_REQUIRED"
)

const howTo = "Citus is required for this test: run `scripts/citus.sh build` (builds Citus 13.2.2 into PostgreSQL 15 " +
	"from ../shared/citus/citus-13.2.2.tar.gz or $CITUS_TARBALL), or set " + EnvURL + " and " + EnvWorkers

// Node is one PostgreSQL server of the cluster.
type Node struct {
	Name string // coordinator, worker1, worker2
	Host string
	Port int
	// DataDir is the node's data directory when this process started the
	// cluster ("" for an external one): Restart and Stop need it.
	DataDir string
}

// Addr is host:port.
func (n Node) Addr() string { return n.Host + ":" + strconv.Itoa(n.Port) }

// DSN is the node's DSN for database db.
func (n Node) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", n.Addr(), url.PathEscape(db))
}

type cluster struct {
	coordinator Node
	workers     []Node
	dir         string // the local cluster's directory, "" if external
	script      string
}

var (
	mu       sync.Mutex
	resolved bool
	cur      *cluster
	curErr   error
)

// Main runs the tests, then stops the throwaway cluster if one was started.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the cluster this process started, if any.
func Stop() {
	mu.Lock()
	defer mu.Unlock()
	if cur != nil && cur.dir != "" {
		_ = exec.Command("bash", cur.script, "stop", cur.dir).Run()
		_ = os.RemoveAll(cur.dir)
	}
	cur, resolved, curErr = nil, false, nil
}

// repoRoot finds the module root (the directory holding go.mod) above the
// working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

func parseAddr(name, addr string) (Node, error) {
	host, port, ok := strings.Cut(strings.TrimSpace(addr), ":")
	p, err := strconv.Atoi(port)
	if !ok || err != nil {
		return Node{}, fmt.Errorf("%s: bad host:port %q", name, addr)
	}
	return Node{Name: name, Host: host, Port: p}, nil
}

func resolve() (*cluster, error) {
	mu.Lock()
	defer mu.Unlock()
	if resolved {
		return cur, curErr
	}
	resolved = true
	cur, curErr = find()
	return cur, curErr
}

func find() (*cluster, error) {
	if u := os.Getenv(EnvURL); u != "" {
		pu, err := url.Parse(u)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", EnvURL, err)
		}
		c, err := parseAddr("coordinator", pu.Host)
		if err != nil {
			return nil, err
		}
		cl := &cluster{coordinator: c}
		for i, w := range strings.Split(os.Getenv(EnvWorkers), ",") {
			if strings.TrimSpace(w) == "" {
				continue
			}
			n, err := parseAddr(fmt.Sprintf("worker%d", i+1), w)
			if err != nil {
				return nil, err
			}
			cl.workers = append(cl.workers, n)
		}
		if len(cl.workers) == 0 {
			return nil, fmt.Errorf("%s is set but %s names no worker", EnvURL, EnvWorkers)
		}
		return cl, nil
	}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	script := filepath.Join(root, "scripts", "citus.sh")
	if err := exec.Command("bash", script, "installed").Run(); err != nil {
		return nil, fmt.Errorf("citus.so is not installed")
	}
	dir, err := os.MkdirTemp("", "citustest-")
	if err != nil {
		return nil, err
	}
	_ = os.Chmod(dir, 0o755)
	var out, errb bytes.Buffer
	cmd := exec.Command("bash", script, "start", dir)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		_ = exec.Command("bash", script, "stop", dir).Run()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("scripts/citus.sh start: %v: %s", err, errb.String())
	}
	cl := &cluster{dir: dir, script: script}
	sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case EnvURL:
			pu, err := url.Parse(v)
			if err != nil {
				return nil, err
			}
			if cl.coordinator, err = parseAddr("coordinator", pu.Host); err != nil {
				return nil, err
			}
			cl.coordinator.DataDir = filepath.Join(dir, "coordinator")
		case EnvWorkers:
			for i, w := range strings.Split(v, ",") {
				n, err := parseAddr(fmt.Sprintf("worker%d", i+1), w)
				if err != nil {
					return nil, err
				}
				n.DataDir = filepath.Join(dir, n.Name)
				cl.workers = append(cl.workers, n)
			}
		}
	}
	if cl.coordinator.Port == 0 || len(cl.workers) == 0 {
		return nil, fmt.Errorf("scripts/citus.sh start printed no cluster: %s", out.String())
	}
	return cl, nil
}

// Database is one test's database on every node of the cluster.
type Database struct {
	Name        string
	Coordinator Node
	Workers     []Node
}

// DSN is the coordinator's DSN of the database (what --store names).
func (d *Database) DSN() string { return d.Coordinator.DSN(d.Name) }

// SyncMetadata waits until every metadata worker of the database is
// synced again, syncing the ones that are not, or ctx ends. Call it after
// changing pg_dist_node: citus_update_node marks every metadata worker
// not synced and leaves the resync to Citus's maintenance daemon, and
// until it ran DDL fails with "... is a metadata node, but is out of
// sync" (SQLSTATE 55000).
func (d *Database) SyncMetadata(ctx context.Context) error {
	return syncMetadata(ctx, d.DSN())
}

// Available reports whether a Citus cluster can be had, and if not why.
func Available() error {
	_, err := resolve()
	return err
}

// Require fails the test under CI, or skips it otherwise, when no Citus
// cluster can be had.
func Require(t testing.TB) {
	t.Helper()
	if _, err := resolve(); err != nil {
		if os.Getenv("CI") == "true" || os.Getenv(EnvRequired) != "" {
			t.Fatalf("citustest: %v; %s", err, howTo)
		}
		t.Skipf("citustest: %v; %s", err, howTo)
	}
}

// RequireStoppable is for tests that stop and start the cluster's nodes
// (PgCtl): it fails the test under CI (or skips it otherwise) when the
// cluster is an external one (named by EnvURL), which this process did not
// start and cannot stop.
func RequireStoppable(t testing.TB, d *Database) {
	t.Helper()
	if d.Coordinator.DataDir != "" {
		return
	}
	msg := "citustest: this test stops and starts Citus nodes: it needs a cluster this process starts (unset " + EnvURL + ")"
	if os.Getenv("CI") == "true" || os.Getenv(EnvRequired) != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// NewDatabase creates the test's database on every node (see the package
// comment) and drops it when the test ends.
func NewDatabase(t testing.TB) *Database {
	t.Helper()
	Require(t)
	cl, _ := resolve()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "citustest_" + sanitize(t.Name()) + "_" + hex.EncodeToString(rnd[:])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodes := append([]Node{cl.coordinator}, cl.workers...)
	for _, n := range nodes {
		if err := execOn(ctx, n.DSN("postgres"), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatalf("citustest: create database on %s: %v", n.Name, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, n := range nodes {
			if err := execOn(ctx, n.DSN("postgres"), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
				t.Logf("citustest: drop database on %s: %v", n.Name, err)
			}
		}
	})
	for _, n := range nodes {
		if err := execOn(ctx, n.DSN(name), "CREATE EXTENSION citus"); err != nil {
			t.Fatalf("citustest: create extension on %s: %v", n.Name, err)
		}
	}
	stmts := []string{fmt.Sprintf("SELECT citus_set_coordinator_host('%s', %d)", cl.coordinator.Host, cl.coordinator.Port)}
	for _, w := range cl.workers {
		stmts = append(stmts, fmt.Sprintf("SELECT citus_add_node('%s', %d)", w.Host, w.Port))
	}
	for _, s := range stmts {
		if err := execOn(ctx, cl.coordinator.DSN(name), s); err != nil {
			t.Fatalf("citustest: %s: %v", s, err)
		}
	}
	if err := syncMetadata(ctx, cl.coordinator.DSN(name)); err != nil {
		t.Fatalf("citustest: %v", err)
	}
	return &Database{Name: name, Coordinator: cl.coordinator, Workers: append([]Node(nil), cl.workers...)}
}

// syncMetadata waits until every metadata worker of the database is
// synced, syncing the ones that are not. When propagating a node's
// metadata to a worker fails (a connection refused under load, during
// citus_add_node of the next worker), Citus only warns and marks that
// worker out of sync; its maintenance daemon syncs it again later, and
// until then every DDL fails with "... is a metadata node, but is out of
// sync" (SQLSTATE 55000): a test's migration at once, as seen in CI.
func syncMetadata(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var last error
	for {
		rows, err := conn.Query(ctx, `SELECT nodename, nodeport FROM pg_dist_node
			WHERE hasmetadata AND NOT metadatasynced AND noderole = 'primary' ORDER BY nodeid`)
		if err != nil {
			return fmt.Errorf("metadata sync: %w", err)
		}
		type hostPort struct {
			Host string
			Port int32
		}
		stale, err := pgx.CollectRows(rows, pgx.RowToStructByPos[hostPort])
		if err != nil {
			return fmt.Errorf("metadata sync: %w", err)
		}
		if len(stale) == 0 {
			return nil
		}
		for _, n := range stale {
			if _, err := conn.Exec(ctx, `SELECT start_metadata_sync_to_node($1, $2)`, n.Host, n.Port); err != nil {
				last = fmt.Errorf("start_metadata_sync_to_node(%s, %d): %w", n.Host, n.Port, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("metadata of %d worker(s) still out of sync: %v (last error: %v)", len(stale), ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func execOn(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	out := b.String()
	if len(out) > 30 {
		out = out[:30]
	}
	return out
}

// PgCtl runs pg_ctl on a node this process started (e.g. "restart", "-m",
// "immediate"), as the postgres OS user when running as root.
func PgCtl(n Node, args ...string) error {
	if n.DataDir == "" {
		return fmt.Errorf("citustest: %s was not started by this process", n.Name)
	}
	bin := os.Getenv("SEQUENCER_TEST_POSTGRES_BIN")
	if bin == "" {
		bin = "/usr/lib/postgresql/15/bin"
	}
	argv := append([]string{filepath.Join(bin, "pg_ctl"), "-D", n.DataDir, "-l", n.DataDir + ".log", "-w"}, args...)
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--"}, argv...)...)
	} else {
		cmd = exec.Command(argv[0], argv[1:]...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %v on %s: %v: %s", args, n.Name, err, out)
	}
	return nil
}
