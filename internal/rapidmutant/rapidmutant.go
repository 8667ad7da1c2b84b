// Package rapidmutant runs a rapid property with a test-only mutation
// switched on and checks that rapid reports the failure: the way the
// model-based tests of conv and ownership show each property able to fail.
package rapidmutant

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// tb records a rapid failure instead of failing the test.
type tb struct {
	*testing.T
	failed bool
	out    strings.Builder
}

func (f *tb) Helper()                      {}
func (f *tb) Fail()                        { f.failed = true }
func (f *tb) FailNow()                     { f.failed = true }
func (f *tb) Failed() bool                 { return f.failed }
func (f *tb) Log(args ...any)              { fmt.Fprintln(&f.out, args...) }
func (f *tb) Logf(s string, args ...any)   { fmt.Fprintf(&f.out, s+"\n", args...) }
func (f *tb) Error(args ...any)            { f.failed = true; f.Log(args...) }
func (f *tb) Errorf(s string, args ...any) { f.failed = true; f.Logf(s, args...) }
func (f *tb) Fatal(args ...any)            { f.Error(args...) }
func (f *tb) Fatalf(s string, args ...any) { f.Errorf(s, args...) }
func (f *tb) Skip(args ...any)             { f.Log(args...) }
func (f *tb) Skipf(s string, args ...any)  { f.Logf(s, args...) }
func (f *tb) SkipNow()                     {}

// Fails runs prop with *mutation set to name and fails t unless rapid
// reports a failure whose output contains property (the invariant's name,
// which the property's failure messages start with; "a|b": either). No fail file is
// written, shrinking is cut short, and up to 500 runs are tried.
func Fails(t *testing.T, mutation *string, name, property string, prop func(*rapid.T)) {
	t.Helper()
	FailsWithin(t, 500, mutation, name, property, prop)
}

// FailsWithin is Fails with up to checks runs, for a mutation that only
// a rarer sequence of actions meets.
func FailsWithin(t *testing.T, checks int, mutation *string, name, property string, prop func(*rapid.T)) {
	t.Helper()
	for f, v := range map[string]string{"rapid.nofailfile": "true", "rapid.shrinktime": "2s", "rapid.checks": strconv.Itoa(checks)} {
		fl := flag.Lookup(f)
		if fl == nil {
			t.Fatalf("no flag %s", f)
		}
		old := fl.Value.String()
		if err := flag.Set(f, v); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = flag.Set(f, old) })
	}
	*mutation = name
	defer func() { *mutation = "" }()
	r := &tb{T: t}
	rapid.Check(r, prop)
	if !r.failed {
		t.Fatalf("mutation %s: rapid found no failure", name)
	}
	if !slices.ContainsFunc(strings.Split(property, "|"), func(p string) bool { return strings.Contains(r.out.String(), p) }) {
		t.Fatalf("mutation %s: rapid failed, but not on %q:\n%s", name, property, r.out.String())
	}
	t.Logf("mutation %s: rapid reports %q as expected", name, property)
}
