package admin

import (
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	const day = 24 * time.Hour
	for in, want := range map[string]time.Duration{
		"0": 0, "90d": 90 * day, "1d12h": day + 12*time.Hour, "36h": 36 * time.Hour, "90m": 90 * time.Minute, "0d": 0,
	} {
		got, err := ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"d", "x d", "-1d", "90", "3w", "1.5d", "-5h"} {
		if got, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", in, got)
		}
	}
	var d time.Duration
	f := Duration{&d}
	if err := f.Set("7d"); err != nil || d != 7*day || f.String() != "7d" {
		t.Fatalf("Duration flag: %v %v %q", err, d, f.String())
	}
}
