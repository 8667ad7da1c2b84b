package open

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/mysql"
	"github.com/sequencer-im/sequencer/persist/mysqltest"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/persist/postgres"
	"github.com/sequencer-im/sequencer/persist/sqlite"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	mysqltest.Stop()
	os.Exit(code)
}

func TestParse(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing.db") // a directory despite the name
	if err := os.Mkdir(existing, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spec string
		want Spec
	}{
		{"", Spec{Kind: KindSQLite, Path: "data/sequencer.db"}},
		{"./data", Spec{Kind: KindSQLite, Path: "data/sequencer.db"}},
		{"./data/", Spec{Kind: KindSQLite, Path: "data/sequencer.db"}},
		{"/var/lib/seq", Spec{Kind: KindSQLite, Path: "/var/lib/seq/sequencer.db"}},
		{"/var/lib/seq/my.db", Spec{Kind: KindSQLite, Path: "/var/lib/seq/my.db"}},
		{"my.sqlite3", Spec{Kind: KindSQLite, Path: "my.sqlite3"}},
		{"sqlite:/tmp/x.db", Spec{Kind: KindSQLite, Path: "/tmp/x.db"}},
		{"sqlite:rel/dir", Spec{Kind: KindSQLite, Path: "rel/dir/sequencer.db"}},
		{"sqlite:///tmp/y.db", Spec{Kind: KindSQLite, Path: "/tmp/y.db"}},
		{existing, Spec{Kind: KindSQLite, Path: filepath.Join(existing, "sequencer.db")}},
		{"postgres://u@h:5432/db?sslmode=disable", Spec{Kind: KindPostgres, DSN: "postgres://u@h:5432/db?sslmode=disable"}},
		{"postgresql://u@h/db", Spec{Kind: KindPostgres, DSN: "postgresql://u@h/db"}},
		{"mysql://u:pw@h:3306/db", Spec{Kind: KindMySQL, DSN: "mysql://u:pw@h:3306/db"}},
		{"mysql://root@localhost/seq?socket=/run/mysqld/mysqld.sock", Spec{Kind: KindMySQL, DSN: "mysql://root@localhost/seq?socket=/run/mysqld/mysqld.sock"}},
	} {
		got, err := Parse(c.spec)
		if err != nil || got != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.spec, got, err, c.want)
		}
	}
	if _, err := Parse("sqlite:"); err == nil {
		t.Errorf("Parse(sqlite:) accepted an empty path")
	}
	for _, sp := range []Spec{{Kind: KindPostgres, DSN: "postgres://u:secret@h/db"}, {Kind: KindMySQL, DSN: "mysql://u:secret@h/db"}} {
		if s := sp.String(); strings.Contains(s, "secret") {
			t.Errorf("Spec.String leaks the password: %s", s)
		}
	}
}

// roundTrip commits one message and reads it back through s.
func roundTrip(t *testing.T, s persist.Store) {
	t.Helper()
	ctx := context.Background()
	b := persist.ConvBatch{ConvID: "g:1", Messages: []sequencer.Message{{MsgID: 42, ConvID: "g:1", Seq: 1,
		FromUID: 7, MsgType: 1, Body: []byte("hi"), ClientMsgID: "c1"}}}
	if err := s.Commit(ctx, []persist.ConvBatch{b}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if h, err := s.LoadHead(ctx, "g:1"); err != nil || h != 1 {
		t.Fatalf("head = %d, %v", h, err)
	}
}

func TestEmptySpecIsDataDir(t *testing.T) {
	t.Chdir(t.TempDir())
	s, err := Store(context.Background(), "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*sqlite.Store); !ok {
		t.Fatalf("empty spec opened %T", s)
	}
	roundTrip(t, s)
	if _, err := os.Stat(filepath.Join("data", "sequencer.db")); err != nil {
		t.Fatalf("./data/sequencer.db not created: %v", err)
	}
}

func TestSQLiteSpecs(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ spec, file string }{
		{filepath.Join(dir, "a"), filepath.Join(dir, "a", "sequencer.db")},
		{"sqlite:" + filepath.Join(dir, "b", "store.db"), filepath.Join(dir, "b", "store.db")},
	} {
		s, err := Store(context.Background(), c.spec, Options{})
		if err != nil {
			t.Fatalf("%s: %v", c.spec, err)
		}
		roundTrip(t, s)
		s.Close()
		if _, err := os.Stat(c.file); err != nil {
			t.Fatalf("%s: file %s not created: %v", c.spec, c.file, err)
		}
		// Reopening finds the data.
		s, err = Store(context.Background(), c.spec, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if h, err := s.LoadHead(context.Background(), "g:1"); err != nil || h != 1 {
			t.Fatalf("%s: head after reopen = %d, %v", c.spec, h, err)
		}
		s.Close()
	}
}

func TestNoMigrate(t *testing.T) {
	s, err := Store(context.Background(), filepath.Join(t.TempDir(), "x.db"), Options{NoMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.LoadHead(context.Background(), "g:1"); err == nil {
		t.Fatalf("LoadHead on an unmigrated file succeeded")
	}
	if err := s.(*sqlite.Store).Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, s)
}

func TestPostgresSpec(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s, err := Store(context.Background(), dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*postgres.Store); !ok {
		t.Fatalf("postgres spec opened %T", s)
	}
	roundTrip(t, s)
}

func TestPostgresUnreachable(t *testing.T) {
	_, err := Store(context.Background(), "postgres://postgres:pw@127.0.0.1:1/x?connect_timeout=2", Options{})
	if !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("unreachable postgres: %v, want ErrStoreUnavailable", err)
	}
	if strings.Contains(err.Error(), ":pw@") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

// A mysql:// URL opens (and migrates) the MySQL store; over the unix socket
// of the test server when that is how it is reached.
func TestMySQLURLOpensMySQL(t *testing.T) {
	url := mysqltest.NewDatabase(t)
	s, err := Store(context.Background(), url, Options{})
	if err != nil {
		t.Fatalf("open %s: %v", Redact(url), err)
	}
	defer s.Close()
	if _, ok := s.(*mysql.Store); !ok {
		t.Fatalf("mysql:// opened %T", s)
	}
	roundTrip(t, s)
}

// migrations answers Migrate with the errors in turn, then nil.
type migrations struct {
	persist.Migrator
	errs  []error
	calls int
}

func (m *migrations) Migrate(context.Context) error {
	m.calls++
	if len(m.errs) == 0 {
		return nil
	}
	err := m.errs[0]
	m.errs = m.errs[1:]
	return err
}

// A restart on a loaded store: the migration's session ended (the store
// did not answer) twice, and the open goes on; a refused migration stops it
// at once; a store that never answers stops it when the context ends, with
// the store's error.
func TestMigrateRetriesOnlyAStoreThatDidNotAnswer(t *testing.T) {
	ctx := context.Background()
	lost := fmt.Errorf("postgres: migrate: 0010_x: %w (FATAL: terminating connection due to idle-in-transaction timeout)", sequencer.ErrStoreUnavailable)
	m := &migrations{errs: []error{lost, lost}}
	if err := migrate(ctx, m, nil); err != nil || m.calls != 3 {
		t.Fatalf("migrate: %v after %d calls, want nil after 3", err, m.calls)
	}
	refused := errors.New("postgres: migration 0010_x: permission denied")
	m = &migrations{errs: []error{refused, nil}}
	if err := migrate(ctx, m, nil); !errors.Is(err, refused) || m.calls != 1 {
		t.Fatalf("migrate: %v after %d calls, want the refusal after 1", err, m.calls)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	m = &migrations{errs: slices.Repeat([]error{lost}, 1000)}
	if err := migrate(short, m, nil); !errors.Is(err, sequencer.ErrStoreUnavailable) || m.calls < 2 {
		t.Fatalf("migrate: %v after %d calls, want the store's error after retries", err, m.calls)
	}
}
