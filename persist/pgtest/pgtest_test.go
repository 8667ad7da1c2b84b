package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// helperEnv switches a test binary re-run into one of the helper modes below.
const helperEnv = "PGTEST_HELPER_MODE"

func dbExists(t *testing.T, adminDSN, name string) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Fatalf("connect admin: %v", err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatalf("query pg_database: %v", err)
	}
	return n == 1
}

func TestNewDatabaseIsFreshAndDroppedAfterTest(t *testing.T) {
	var name string
	var dsn1, dsn2 string
	t.Run("inner", func(t *testing.T) {
		dsn1 = NewDatabase(t)
		dsn2 = NewDatabase(t)
		if dsn1 == dsn2 {
			t.Fatalf("two databases share a DSN: %s", dsn1)
		}
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dsn1)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer conn.Close(ctx)
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
		var tables int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Fatalf("fresh database has %d tables", tables)
		}
		if _, err := conn.Exec(ctx, "CREATE TABLE x (a int)"); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(name, "seqtest_") {
			t.Fatalf("database name %q lacks the seqtest_ prefix", name)
		}
		// The still-open connection must not keep the drop from happening.
	})
	if dbExists(t, AdminDSN(t), name) {
		t.Fatalf("database %s still exists after its test ended", name)
	}
}

func TestWithDatabase(t *testing.T) {
	got, err := withDatabase("postgres://u:p@h:5/admin?sslmode=disable", "db1")
	if err != nil || got != "postgres://u:p@h:5/db1?sslmode=disable" {
		t.Fatalf("url form: %q %v", got, err)
	}
	got, err = withDatabase("host=h port=5 dbname=admin", "db1")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(got)
	if err != nil || cfg.Database != "db1" {
		t.Fatalf("keyword form %q: database %q, %v", got, cfg.Database, err)
	}
}

func TestDBNameIsAValidIdentifier(t *testing.T) {
	n := dbName(strings.Repeat("TestVeryLong/Sub Test-ünicode", 5))
	if len(n) > 63 {
		t.Fatalf("name %q is %d bytes, over 63", n, len(n))
	}
	for _, r := range n {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			t.Fatalf("name %q holds %q", n, r)
		}
	}
}

func deadURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?connect_timeout=2", port)
}

func runHelper(t *testing.T, mode string, env ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.v", "-test.count=1")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+mode), env...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.String(), err
}

// TestFallbackStartsThrowawayServer points the URL at a dead port in a
// subprocess: the harness must start its own server, hand out a working
// database, and stop the server and remove its directory when the run ends.
func TestFallbackStartsThrowawayServer(t *testing.T) {
	out, err := runHelper(t, "fallback", EnvURL+"="+deadURL(t))
	if err != nil {
		t.Fatalf("helper failed: %v\n%s", err, out)
	}
	var admin, dir string
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "ADMIN="); ok {
			admin = v
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "DIR="); ok {
			dir = v
		}
	}
	if admin == "" || dir == "" {
		t.Fatalf("helper printed no ADMIN=/DIR=:\n%s", out)
	}
	if err := probe(admin, 2*time.Second); err == nil {
		t.Fatalf("throwaway server %s still answers after the run", admin)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("throwaway server dir %s still exists (%v)", dir, err)
	}
}

// TestNoServerFailsWithHowTo: with a dead URL and no binaries the test fails
// (not skips) and tells how to get PostgreSQL.
func TestNoServerFailsWithHowTo(t *testing.T) {
	out, err := runHelper(t, "nobinaries", EnvURL+"="+deadURL(t), EnvBin+"="+t.TempDir())
	if err == nil {
		t.Fatalf("helper passed without any server:\n%s", out)
	}
	if !strings.Contains(out, "--- FAIL: TestHelperProcess") || strings.Contains(out, "SKIP") {
		t.Fatalf("helper did not fail the test:\n%s", out)
	}
	for _, want := range []string{"apt-get install postgresql", EnvURL} {
		if !strings.Contains(out, want) {
			t.Fatalf("failure message lacks %q:\n%s", want, out)
		}
	}
}

// TestHelperProcess is run only as a subprocess by the tests above.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv(helperEnv) {
	case "":
		t.Skip("helper process only")
	case "fallback":
		dsn := NewDatabase(t)
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "CREATE TABLE t (a int); INSERT INTO t VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		srv := local
		mu.Unlock()
		if srv == nil {
			t.Fatal("no throwaway server was started")
		}
		fmt.Printf("ADMIN=%s\nDIR=%s\n", srv.dsn, srv.dir)
	case "nobinaries":
		NewDatabase(t)
		t.Log("reached past NewDatabase")
	}
}
