package postgres

import "testing"

func TestReplaceTable(t *testing.T) {
	if got := ReplaceTable("SELECT 1 FROM im_message\n\tWHERE x", "im_message", `"s"."im_message_102"`); got != "SELECT 1 FROM \"s\".\"im_message_102\"\n\tWHERE x" {
		t.Fatalf("got %q", got)
	}
	for _, c := range []struct{ stmt, table string }{{ReadManySQL, "im_message"}, {ReadManyHeadsSQL, "conv_head"}} {
		if ReplaceTable(c.stmt, c.table, "x") == c.stmt {
			t.Fatalf("%s not replaced in %s", c.table, c.stmt)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a statement without the table did not panic")
		}
	}()
	ReplaceTable("SELECT 1 FROM im_message_x", "im_message", "x")
}

// SplitSQL keeps dollar-quoted bodies, quotes and comments whole.
func TestSplitSQL(t *testing.T) {
	got := SplitSQL("-- a; comment\nSELECT 'x;y';\nCREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $fn$\nBEGIN\n  PERFORM 1;\nEND\n$fn$;\n-- tail;\n")
	want := []string{"-- a; comment\nSELECT 'x;y'", "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $fn$\nBEGIN\n  PERFORM 1;\nEND\n$fn$"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("SplitSQL = %q", got)
	}
}
