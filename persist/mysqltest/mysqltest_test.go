package mysqltest

import (
	"context"
	"strings"
	"testing"
)

// With no server at the configured URL, the harness starts a throwaway
// mariadbd from the installed binaries, and databases come from it.
func TestFallbackStartsAThrowawayServer(t *testing.T) {
	t.Setenv(EnvURL, "mysql://root@127.0.0.1:1/mysql?timeout=1s")
	Stop()
	mu.Lock()
	resolved = false
	mu.Unlock()
	t.Cleanup(Stop)
	u := NewDatabase(t)
	if !strings.Contains(u, "127.0.0.1:") || strings.Contains(u, "127.0.0.1:1/") {
		t.Fatalf("database %s is not on a throwaway server", u)
	}
	db, err := open(u)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var name string
	if err := db.QueryRowContext(context.Background(), "SELECT DATABASE()").Scan(&name); err != nil || !strings.HasPrefix(name, "seqtest_") {
		t.Fatalf("database %q: %v", name, err)
	}
}
