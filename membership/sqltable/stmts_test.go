package sqltable

import "testing"

func TestPlaceholders(t *testing.T) {
	for in, want := range map[string]string{
		`SELECT 1`: `SELECT 1`,
		`UPDATE t SET a = ? WHERE b = ? AND c = ? OR d IN (?,?,?,?,?,?,?,?)`: `UPDATE t SET a = $1 WHERE b = $2 AND c = $3 OR d IN ($4,$5,$6,$7,$8,$9,$10,$11)`,
	} {
		if got := Placeholders(in); got != want {
			t.Errorf("Placeholders(%q) = %q, want %q", in, got, want)
		}
	}
}
