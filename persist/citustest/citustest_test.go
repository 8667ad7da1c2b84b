package citustest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestMain(m *testing.M) { Main(m) }

// TestNewDatabaseSyncsStaleWorkers: a worker marked out of sync (as Citus
// marks one whose metadata update failed) refuses DDL until synced again;
// syncMetadata, which NewDatabase ends with, syncs it.
func TestNewDatabaseSyncsStaleWorkers(t *testing.T) {
	d := NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	stale := func() int {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_dist_node WHERE hasmetadata AND NOT metadatasynced`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := stale(); n != 0 {
		t.Fatalf("NewDatabase left %d worker(s) out of sync", n)
	}
	if _, err := conn.Exec(ctx, `UPDATE pg_dist_node SET metadatasynced = false WHERE nodeport = $1`, d.Workers[0].Port); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE t1 (k text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `SELECT create_distributed_table('t1', 'k')`)
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "55000" {
		t.Logf("DDL beside a worker out of sync: %v (Citus's maintenance daemon may have synced it first)", err)
	}
	if err := syncMetadata(ctx, d.DSN()); err != nil {
		t.Fatal(err)
	}
	if n := stale(); n != 0 {
		t.Fatalf("%d worker(s) still out of sync", n)
	}
	if _, err := conn.Exec(ctx, `SELECT create_distributed_table('t1', 'k')`); err != nil {
		t.Fatalf("DDL after the sync: %v", err)
	}
}
