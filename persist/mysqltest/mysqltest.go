// Package mysqltest gives tests a fresh, empty MySQL / MariaDB database of
// their own, like persist/pgtest does for PostgreSQL.
//
// It owns the choice of test server and the life of the databases it
// creates: NewDatabase CREATEs a database with a random name and DROPs it
// when the test ends. It never touches a database it did not create.
//
// Server choice, in order:
//  1. $SEQUENCER_TEST_MYSQL_URL when set (a mysql:// URL; its database is
//     the admin database), else root over the unix socket
//     /run/mysqld/mysqld.sock (the MariaDB of these machines);
//  2. if no server answers there, a throwaway server started once per test
//     process from Debian's binaries (mariadb-install-db / mysql_install_db
//     and mariadbd, or $SEQUENCER_TEST_MARIADB_BIN's directory) in a
//     temporary directory, on a random port of 127.0.0.1 and a socket in
//     that directory. Packages that may use it call Main from TestMain.
//
// If neither works the calling test FAILS (never skips) and says how to get
// MariaDB.
package mysqltest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/sequencer-im/sequencer/persist/internal/serverproc"
	"github.com/sequencer-im/sequencer/persist/mysql/mysqlurl"
	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// Environment variables and the default admin URL.
const (
	EnvURL     = "SEQUENCER_TEST_MYSQL_URL"
	EnvBin     = "SEQUENCER_TEST_MARIADB_BIN"
	DefaultURL = "mysql://root@localhost/mysql?socket=/run/mysqld/mysqld.sock"
)

const howToGet = "MySQL or MariaDB is required for this test: install it (apt-get install mariadb-server) " +
	"so a throwaway server can be started from mariadbd, run one with root on /run/mysqld/mysqld.sock, or set " +
	EnvURL + " to an admin mysql:// URL"

var (
	mu       sync.Mutex
	resolved bool
	admin    string
	adminErr error
	local    *Server
)

// Main runs the tests of a package and then stops the throwaway server, if
// one was started.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the throwaway server started by this process, if any, and
// removes its directory.
func Stop() {
	mu.Lock()
	defer mu.Unlock()
	if local != nil {
		local.Stop()
		os.RemoveAll(local.dir)
		local, resolved, admin, adminErr = nil, false, "", nil
	}
}

// AdminURL returns the admin URL of the test server, starting the
// throwaway server if needed; it fails the test if none can be had.
func AdminURL(t testing.TB) string {
	t.Helper()
	u, err := resolve()
	if err != nil {
		t.Fatalf("mysqltest: %v", err)
	}
	return u
}

// NewDatabase creates a fresh database on the test server and returns its
// mysql:// URL. It is dropped when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return NewDatabaseOn(t, AdminURL(t))
}

// NewDatabaseOn is NewDatabase on the server of adminURL.
func NewDatabaseOn(t testing.TB, adminURL string) string {
	t.Helper()
	name := pgtest.DBName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := CreateDatabase(ctx, adminURL, name)
	if err != nil {
		t.Fatalf("mysqltest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := DropDatabase(ctx, adminURL, name); err != nil {
			t.Errorf("mysqltest: %v", err)
		}
	})
	return u
}

// CreateDatabase creates the database name (utf8mb4) on the server of
// adminURL and returns its mysql:// URL (adminURL with the database
// replaced). Tools that are not tests and own the database's life use it
// (sequencer-bench); tests call NewDatabase.
func CreateDatabase(ctx context.Context, adminURL, name string) (string, error) {
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", fmt.Errorf("admin URL: %w", err)
	}
	if err := execAdmin(ctx, adminURL, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4"); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// DropDatabase drops the database name on the server of adminURL, if it
// exists.
func DropDatabase(ctx context.Context, adminURL, name string) error {
	if err := execAdmin(ctx, adminURL, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

func execAdmin(ctx context.Context, adminURL, stmt string) error {
	db, err := open(adminURL)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

func open(rawURL string) (*sql.DB, error) {
	cfg, err := mysqlurl.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 3 * time.Second
	c, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}

func probe(rawURL string) error {
	db, err := open(rawURL)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

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
	probeErr := probe(candidate)
	if probeErr == nil {
		admin = candidate
		return admin, nil
	}
	srv, err := startServer()
	if err != nil {
		adminErr = fmt.Errorf("no server answers at %s (%v), and starting a throwaway server failed: %v. %s",
			Redact(candidate), probeErr, err, howToGet)
		return "", adminErr
	}
	local = srv
	admin = srv.URL()
	return admin, nil
}

// Redact returns a mysql:// URL with its password hidden, for messages.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// Server is a throwaway MariaDB server in a temporary directory.
type Server struct {
	dir, bin string
	port     int
	proc     *serverproc.Proc // nil while stopped
}

// StartServer starts a throwaway MariaDB server for this test (stopped and
// removed when it ends): for tests that stop and restart the database.
func StartServer(t testing.TB) *Server {
	t.Helper()
	s, err := startServer()
	if err != nil {
		t.Fatalf("mysqltest: start a throwaway server: %v. %s", err, howToGet)
	}
	t.Cleanup(func() { s.Stop(); os.RemoveAll(s.dir) })
	return s
}

// URL is the server's admin URL (root over TCP, no password).
func (s *Server) URL() string {
	return fmt.Sprintf("mysql://root@127.0.0.1:%d/mysql", s.port)
}

func findBin() (string, error) {
	if d := os.Getenv(EnvBin); d != "" {
		return d, nil
	}
	for _, d := range []string{"/usr/sbin", "/usr/bin", "/usr/local/mysql/bin"} {
		if fi, err := os.Stat(filepath.Join(d, "mariadbd")); err == nil && !fi.IsDir() {
			return d, nil
		}
	}
	if p, err := exec.LookPath("mariadbd"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("mariadbd not found (set %s)", EnvBin)
}

func installDB() (string, error) {
	for _, n := range []string{"mariadb-install-db", "mysql_install_db"} {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("mariadb-install-db not found")
}

func startServer() (*Server, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	inst, err := installDB()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sequencer-mysqltest-")
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	args := []string{"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	if out, err := exec.Command(inst, args...).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%s: %v: %s", inst, err, serverproc.LastLines(out, 10))
	}
	s := &Server{dir: dir, bin: bin}
	for attempt := 0; attempt < 3; attempt++ {
		if s.port, err = serverproc.FreePort(); err != nil {
			break
		}
		if err = s.Start(); err == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, err
}

// Start (re)starts the server on its port and data directory and waits
// until it answers. The server gets a parent-death signal.
func (s *Server) Start() error {
	logPath := filepath.Join(s.dir, "mariadbd.log")
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(s.dir, "data"),
		"--socket=" + filepath.Join(s.dir, "mysqld.sock"), "--port=" + strconv.Itoa(s.port),
		"--bind-address=127.0.0.1", "--pid-file=" + filepath.Join(s.dir, "mariadbd.pid"),
		"--log-error=" + logPath, "--innodb-buffer-pool-size=64M", "--max-connections=300",
		"--innodb-flush-log-at-trx-commit=1", "--skip-name-resolve"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	p, err := serverproc.Start("mariadbd", exec.Command(filepath.Join(s.bin, "mariadbd"), args...), syscall.SIGTERM, logPath,
		func() error { return probe(s.URL()) }, nil)
	if err != nil {
		return err
	}
	s.proc = p
	return nil
}

// Stop shuts the server down (SIGTERM, then SIGKILL after 30s); its data
// stays for Start.
func (s *Server) Stop() {
	if s.proc != nil {
		s.proc.Stop(syscall.SIGTERM)
		s.proc = nil
	}
}

// Kill stops the server with SIGKILL (a crash); its data stays for Start.
func (s *Server) Kill() {
	if s.proc != nil {
		s.proc.Kill()
		s.proc = nil
	}
}
