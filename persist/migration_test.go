package persist

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoadMigrations(t *testing.T) {
	ms, err := LoadMigrations(fstest.MapFS{
		"m/0002_b.sql": {Data: []byte("B")},
		"m/0001_a.sql": {Data: []byte("A")},
		"m/README.md":  {Data: []byte("not a migration")},
		"m/0010_c.sql": {Data: []byte("C")},
	}, "m")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.Name+"="+m.SQL)
	}
	if strings.Join(got, ",") != "0001_a=A,0002_b=B,0010_c=C" {
		t.Fatalf("order or content: %v", got)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"misnamed":          {"m/init.sql": {Data: []byte("x")}},
		"version 0":         {"m/0000_zero.sql": {Data: []byte("x")}},
		"duplicate version": {"m/0001_a.sql": {Data: []byte("x")}, "m/1_b.sql": {Data: []byte("y")}},
	} {
		if _, err := LoadMigrations(fsys, "m"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
