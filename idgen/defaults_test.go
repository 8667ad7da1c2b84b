package idgen

import (
	"os"
	"regexp"
	"testing"
	"time"
)

// docs/IDGEN.md's IssuerConfig table states DefaultIssuerConfig's values and
// the intervals derived from them ("TTL/5 = 2s").
func TestIDGENDocStatesTheLeaseDefaults(t *testing.T) {
	raw, err := os.ReadFile("../docs/IDGEN.md")
	if err != nil {
		t.Fatal(err)
	}
	d := DefaultIssuerConfig().withDerived()
	want := map[string]time.Duration{
		"TTL": d.TTL, "RenewEvery": d.RenewEvery, "ReserveAhead": d.ReserveAhead,
		"RetryEvery": d.RetryEvery, "StoreTimeout": d.StoreTimeout, "MaxStoreSkew": d.MaxStoreSkew,
	}
	row := regexp.MustCompile(`(?m)^\| (\w+) \| (?:[^|=]*= )?([0-9a-z.]+) \|`)
	seen := 0
	for _, m := range row.FindAllStringSubmatch(string(raw), -1) {
		w, ok := want[m[1]]
		if !ok {
			continue
		}
		seen++
		got, err := time.ParseDuration(m[2])
		if err != nil || got != w {
			t.Errorf("docs/IDGEN.md: %s default %q, DefaultIssuerConfig gives %v", m[1], m[2], w)
		}
	}
	if seen != len(want) {
		t.Fatalf("docs/IDGEN.md: %d of the %d IssuerConfig defaults found", seen, len(want))
	}
	if err := DefaultIssuerConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}
