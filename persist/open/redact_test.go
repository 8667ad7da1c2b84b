package open

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

// docs/API.md, "Command line": only the listed forms are stores; everything else is an
// error that names the spec without its password.
func TestParseRefusesWhatIsNotListed(t *testing.T) {
	for _, spec := range []string{
		"postgress://u:pw-typo@h/db",
		"MYSQL://root:pw-upper@db/seq",
		"mysql://root:pw-nodb@db/",
		"mysql://root:pw-nohost@/seq",
		"root:pw-driver@tcp(db:3306)/seq",
		"root:pw-driver@unix(/run/mysqld/mysqld.sock)/seq",
		"POSTGRES://u:pw-upper@h/db",
		"Postgresql://u@h/db",
		"file:///var/lib/seq",
		"redis://127.0.0.1:6379",
		"host=db password='pw-unterminated",
	} {
		_, err := Parse(spec)
		if err == nil {
			t.Errorf("Parse(%q) accepted", spec)
			continue
		}
		if strings.Contains(err.Error(), "pw-") {
			t.Errorf("Parse(%q) error leaks the password: %v", spec, err)
		}
	}
	for spec, want := range map[string]Kind{
		"host=db dbname=seq user=app password=pw":                 KindPostgres,
		"dbname = seq host=/var/run/postgresql":                   KindPostgres,
		"host=a,b port=5432,5433 target_session_attrs=read-write": KindPostgres,
		"postgres://u@h1:5432,h2:5432/db":                         KindPostgres,
		"mysql:notascheme":                                        KindSQLite, // a path without "://"
		"mysql://root:pw@db:3306/seq?tls=skip-verify":             KindMySQL,
	} {
		got, err := Parse(spec)
		if err != nil || got.Kind != want {
			t.Errorf("Parse(%q) = %+v, %v; want kind %s", spec, got, err, want)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://app:hunter2@db:5432/seq?sslmode=disable":     "postgres://app:xxxxx@db:5432/seq?sslmode=disable",
		"postgresql://app:p%40ss@h1:5432,h2:5432/seq":            "postgresql://app:xxxxx@h1:5432,h2:5432/seq",
		"postgres://app@db/seq?sslmode=require&password=hunter2": "postgres://app@db/seq?sslmode=require&password=xxxxx",
		"postgres://app:a@b@db/seq":                              "postgres://app:xxxxx@db/seq",
		"host=db user=app password=hunter2 dbname=seq":           "host=db user=app password=xxxxx dbname=seq",
		"host=db password = 'hun ter\\'2' dbname=seq":            "host=db password = xxxxx dbname=seq",
		"host=db PASSWORD=hunter2":                               "host=db PASSWORD=xxxxx",
		"postgres://app@db/seq":                                  "postgres://app@db/seq",
		"./data":                                                 "./data",
		"mysql://app:hunter2@db:3306/seq":                        "mysql://app:xxxxx@db:3306/seq",
		"mysql://app:a@b@db/seq?socket=/s":                       "mysql://app:xxxxx@db/seq?socket=/s",
		"app:hunter2@tcp(db:3306)/seq":                           "app:xxxxx@tcp(db:3306)/seq",
		"app:hun@ter2@unix(/run/mysqld.sock)/seq":                "app:xxxxx@unix(/run/mysqld.sock)/seq",
		"app@tcp(db)/seq":                                        "app@tcp(db)/seq",
		"sqlite:/var/lib/seq/x.db":                               "sqlite:/var/lib/seq/x.db",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
	// Scrub removes every spelling of the password from any text.
	dsn := "postgres://app:p%40ss-w0rd@db/seq"
	text := "cannot parse `postgres://app:p%40ss-w0rd@db/seq`: password p@ss-w0rd rejected"
	if got := Scrub(dsn, text); strings.Contains(got, "ss-w0rd") {
		t.Errorf("Scrub left the password: %q", got)
	}
	kw := "host=db password='a b\\'c' user=app"
	if got := Scrub(kw, "failed: "+kw+" and a b'c"); strings.Contains(got, "a b") {
		t.Errorf("Scrub(keyword) left the password: %q", got)
	}
	if got := Scrub("app:hunter2@tcp(db)/seq", "dial app:hunter2@tcp(db)/seq: hunter2"); strings.Contains(got, "hunter2") {
		t.Errorf("Scrub(driver DSN) left the password: %q", got)
	}
	base := errors.New("boom hunter2")
	if err := ScrubError("host=x password=hunter2", base); strings.Contains(err.Error(), "hunter2") || !errors.Is(err, base) {
		t.Errorf("ScrubError: %v (chain kept: %v)", err, errors.Is(err, base))
	}
}

// Opening PostgreSQL with a password that fails (nothing listens) gives an
// error without the password, in every DSN form.
func TestOpenErrorHidesThePassword(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, dsn := range []string{
		"postgres://app:Sup3rSecretPW@127.0.0.1:1/seq?connect_timeout=2",
		"postgres://app@127.0.0.1:1/seq?password=Sup3rSecretPW&connect_timeout=2",
		"host=127.0.0.1 port=1 user=app password=Sup3rSecretPW dbname=seq connect_timeout=2",
		"postgres://app:Sup3rSecretPW@127.0.0.1:notaport/seq",
		"host=127.0.0.1 port=notaport password=Sup3rSecretPW",
		"mysql://app:Sup3rSecretPW@127.0.0.1:1/seq?timeout=2s",
		"mysql://app:Sup3rSecretPW@127.0.0.1:notaport/seq",
		"mysql://app:Sup3rSecretPW@127.0.0.1:1/seq?badparam=%zz",
		"app:Sup3rSecretPW@tcp(127.0.0.1:1)/seq",
	} {
		s, err := Store(ctx, dsn, Options{})
		if err == nil {
			s.Close()
			t.Fatalf("%s: opened", Redact(dsn))
		}
		if strings.Contains(err.Error(), "Sup3rSecretPW") {
			t.Errorf("open error leaks the password: %v", err)
		}
	}
}

// A libpq keyword DSN opens PostgreSQL.
func TestKeywordDSNOpensPostgres(t *testing.T) {
	u, err := url.Parse(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	dsn := fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable password='not used by trust auth'",
		u.Hostname(), u.Port(), u.User.Username(), strings.TrimPrefix(u.Path, "/"))
	s, err := Store(context.Background(), dsn, Options{})
	if err != nil {
		t.Fatalf("open %s: %v", Redact(dsn), err)
	}
	defer s.Close()
	if _, ok := s.(*postgres.Store); !ok {
		t.Fatalf("keyword DSN opened %T", s)
	}
	roundTrip(t, s)
}
