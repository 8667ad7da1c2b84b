// Package pgtest gives tests a fresh, empty PostgreSQL database of their own.
//
// It owns the choice of test server and the life of the databases it creates:
// NewDatabase CREATEs a database with a random name and DROPs it (WITH
// (FORCE)) when the test ends. It never touches a database it did not create.
//
// Server choice, in order:
//  1. $SEQUENCER_TEST_DATABASE_URL when set (its database is the admin
//     database), else postgres://postgres@127.0.0.1:5432/postgres;
//  2. if no server answers there, a throwaway server started once per test
//     process from the installed binaries ($SEQUENCER_TEST_POSTGRES_BIN, or
//     /usr/lib/postgresql/*/bin, or initdb on $PATH) in a temporary directory,
//     listening on a random free port of 127.0.0.1. When running as root it
//     runs as the `postgres` OS user (initdb refuses root). Packages that may
//     use it call Main from TestMain so it is stopped after the run (it is
//     also stopped if the test process dies).
//
// If neither works the calling test FAILS (never skips) and says how to get
// PostgreSQL.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer/persist/internal/serverproc"
)

// EnvURL names the environment variable holding the admin DSN of the test
// server. EnvBin names the one holding the directory of initdb and postgres
// for the throwaway server.
const (
	EnvURL     = "SEQUENCER_TEST_DATABASE_URL"
	EnvBin     = "SEQUENCER_TEST_POSTGRES_BIN"
	DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres"
)

const howToGet = "PostgreSQL is required for this test: install it (apt-get install postgresql) " +
	"so a throwaway server can be started from /usr/lib/postgresql/*/bin, run one at " +
	"127.0.0.1:5432 (user postgres, trust auth), or set " + EnvURL + " to an admin DSN"

var (
	mu       sync.Mutex
	resolved bool
	admin    string       // admin DSN once resolved
	adminErr error        // why no server could be had
	local    *localServer // the throwaway server, if started
)

// Main runs the tests of a package and then stops the throwaway server, if one
// was started. Use it as `func TestMain(m *testing.M) { pgtest.Main(m) }`.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the throwaway server started by this process, if any, and
// removes its directory. Later calls to NewDatabase resolve the server again.
func Stop() {
	mu.Lock()
	defer mu.Unlock()
	if local != nil {
		local.stop()
		local = nil
		resolved = false
		admin, adminErr = "", nil
	}
}

// AdminDSN returns the DSN of the test server's admin database, starting the
// throwaway server if needed. It fails the test if no server can be had.
// Use it only to create and drop databases of your own.
func AdminDSN(t testing.TB) string {
	t.Helper()
	dsn, err := resolve()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsn
}

// NewDatabase creates a fresh database with a random name on the test server
// and returns its DSN. The database is dropped (WITH (FORCE)) when the test
// ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	adminDSN := AdminDSN(t)
	name := dbName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Fatalf("pgtest: connect to admin database: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, adminDSN)
		if err != nil {
			t.Errorf("pgtest: drop database %s: connect: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	dsn, err := withDatabase(adminDSN, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsn
}

// DBName is a fresh database name for a test: "seqtest_<test name,
// sanitized>_<random hex>", at most 57 bytes (fits PostgreSQL's 63 and
// MySQL's 64). persist/mysqltest names its databases with it too.
func DBName(testName string) string { return dbName(testName) }

// dbName is DBName.
func dbName(testName string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > 32 {
		s = s[:32]
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	return "seqtest_" + s + "_" + hex.EncodeToString(rnd[:])
}

// withDatabase returns dsn with its database replaced by name. It accepts URL
// DSNs and keyword/value DSNs.
func withDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse DSN: %w", err)
		}
		u.Path = "/" + name
		u.RawPath = ""
		return u.String(), nil
	}
	return dsn + " dbname=" + name, nil
}

// resolve picks the server once per process (see the package comment).
func resolve() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if resolved {
		return admin, adminErr
	}
	resolved = true
	candidate := os.Getenv(EnvURL)
	if candidate == "" {
		candidate = DefaultURL
	}
	probeErr := probe(candidate, 3*time.Second)
	if probeErr == nil {
		admin = candidate
		return admin, nil
	}
	srv, err := startLocal()
	if err != nil {
		adminErr = fmt.Errorf("no server answers at %s (%v), and starting a throwaway server failed: %v. %s",
			redact(candidate), probeErr, err, howToGet)
		return "", adminErr
	}
	local = srv
	admin = srv.dsn
	return admin, nil
}

func probe(dsn string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = timeout
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// redact hides a password in a URL DSN for messages.
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	return dsn
}

// localServer is a throwaway PostgreSQL server of this process.
type localServer struct {
	dir  string
	dsn  string
	port int
	proc *serverproc.Proc // the postmaster
	log  string
}

// findBinDir returns a directory holding initdb and postgres.
func findBinDir() (string, error) {
	if d := os.Getenv(EnvBin); d != "" {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
		return "", fmt.Errorf("%s=%s holds no initdb and postgres", EnvBin, d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Highest major version first.
	sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) > majorOf(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		d := filepath.Dir(p)
		if isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("no initdb/postgres binaries found (looked in $" + EnvBin + ", /usr/lib/postgresql/*/bin and $PATH)")
}

func majorOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// credential returns the identity the server must run as: the postgres OS
// user when this process is root, else nil (the current user).
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root and no `postgres` OS user to run initdb as: %w", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("bad uid/gid of user postgres: %q/%q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func startLocal() (*localServer, error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sequencer-pgtest-")
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, serverproc.LastLines(out, 10))
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := serverproc.FreePort()
		if err != nil {
			return nil, err
		}
		srv, err := runPostmaster(bin, dir, data, cred, port)
		if err == nil {
			return srv, nil
		}
		lastErr = err
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// runPostmaster starts postgres on port and waits until it answers. The
// postmaster gets a parent-death signal (serverproc): if this test process
// dies without Stop, the kernel tells the server to shut down (fast).
//
// extra are more server settings ("name=value"), passed as -c options.
func runPostmaster(bin, dir, data string, cred *syscall.Credential, port int, extra ...string) (*localServer, error) {
	logPath := filepath.Join(dir, fmt.Sprintf("postgres-%d.log", port))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	if cred != nil {
		_ = logf.Chown(int(cred.Uid), int(cred.Gid))
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data,
		"-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=300",
		"-c", "shared_buffers=64MB")
	for _, kv := range extra {
		cmd.Args = append(cmd.Args, "-c", kv)
	}
	cmd.Dir = dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	srv := &localServer{
		dir:  dir,
		port: port,
		log:  logPath,
		dsn:  fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
	}
	srv.proc, err = serverproc.Start("postgres", cmd, syscall.SIGINT, logPath,
		func() error { return probe(srv.dsn, 2*time.Second) }, func() { logf.Close() })
	if err != nil {
		return nil, err
	}
	return srv, nil
}

// stop shuts the server down (fast shutdown, then kill) and removes its dir.
func (s *localServer) stop() {
	s.halt()
	os.RemoveAll(s.dir)
}

// halt shuts the server down (fast shutdown, then kill), keeping its data.
func (s *localServer) halt() { s.proc.Stop(syscall.SIGINT) }
