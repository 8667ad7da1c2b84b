package mysqlurl

import (
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in, net, addr, user, pass, db string
	}{
		{"mysql://app:p%40ss@db.example:3307/seq", "tcp", "db.example:3307", "app", "p@ss", "seq"},
		{"mysql://app@db/seq", "tcp", "db:3306", "app", "", "seq"},
		{"mysql://root@localhost/seq?socket=/run/mysqld/mysqld.sock", "unix", "/run/mysqld/mysqld.sock", "root", "", "seq"},
		{"mysql://u:p@[::1]:3306/seq", "tcp", "[::1]:3306", "u", "p", "seq"},
	} {
		cfg, err := Parse(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if cfg.Net != c.net || cfg.Addr != c.addr || cfg.User != c.user || cfg.Passwd != c.pass || cfg.DBName != c.db {
			t.Errorf("%s: %s %s %s %q %s", c.in, cfg.Net, cfg.Addr, cfg.User, cfg.Passwd, cfg.DBName)
		}
	}
	cfg, err := Parse("mysql://u@h/seq?tls=skip-verify&timeout=3s")
	if err != nil || cfg.TLSConfig != "skip-verify" || cfg.Timeout != 3*time.Second {
		t.Fatalf("driver parameters: %+v %v", cfg, err)
	}
	for _, bad := range []string{"mysql://u:pw-secret@h/", "mysql://u:pw-secret@/seq", "mysql://u:pw-secret@h/a/b",
		"mysql://u:pw-secret@h/seq?timeout=soon", "postgres://u:pw-secret@h/seq", "mysql://u:pw-secret@h:port/seq"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%s: accepted", bad)
		} else if strings.Contains(err.Error(), "pw-secret") {
			t.Errorf("%s: error leaks the password: %v", bad, err)
		}
	}
}
