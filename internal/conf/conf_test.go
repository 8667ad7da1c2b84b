package conf

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

type sample struct {
	N     int
	D     time.Duration
	S     string
	Inner struct{ A, B int }
	L     []string
	hid   int
}

func TestFillZeroTakesOnlyZeroFields(t *testing.T) {
	d := sample{N: 4, D: time.Second, S: "def", L: []string{"x"}, hid: 9}
	d.Inner.A, d.Inner.B = 1, 2
	c := sample{N: -1, S: ""}
	c.Inner.B = 5 // a non-zero struct is kept as a whole
	FillZero(&c, d)
	want := sample{N: -1, D: time.Second, S: "def", L: []string{"x"}}
	want.Inner.B = 5
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got %+v, want %+v", c, want)
	}
}

func TestFillZeroNestedFillsNestedConfigsFieldByField(t *testing.T) {
	type inner struct{ A, B int }
	type outer struct {
		N  int
		In inner
		At time.Time // a value type: taken as a whole
		L  []string
	}
	at := time.Unix(7, 0)
	d := outer{N: 4, In: inner{A: 1, B: 2}, At: at, L: []string{"x"}}
	c := outer{In: inner{B: 5}}
	FillZeroNested(&c, d)
	want := outer{N: 4, In: inner{A: 1, B: 5}, At: at, L: []string{"x"}}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got %+v, want %+v", c, want)
	}
}

func TestNestPrefixesFieldsWithTheirPath(t *testing.T) {
	ch := Checker{Pkg: "commit"}
	Positive(&ch, "Workers", 0)
	ch.BadVs("Timeout", time.Duration(0), "must exceed %s", "Workers")
	other := errors.New("not a field error")
	err := Nest(errors.Join(ch.Err(), other), "actor", "Commit")
	if got := Fields(err); !reflect.DeepEqual(got, []string{"Commit.Workers", "Commit.Timeout"}) {
		t.Fatalf("fields %v", got)
	}
	if !errors.Is(err, other) {
		t.Fatalf("%v: the other error was dropped", err)
	}
	if msg := err.Error(); strings.Contains(msg, "commit:") || !strings.Contains(msg, "actor: Commit.Timeout 0s: must exceed Commit.Workers") {
		t.Fatalf("message %q", msg)
	}
	if Nest(nil, "", "X") != nil {
		t.Fatal("Nest(nil) is not nil")
	}
}

func TestRenameKeepsMappedFieldsUnderTheirNewNames(t *testing.T) {
	ch := Checker{Pkg: "cluster"}
	Positive(&ch, "MaxBody", -1)
	ch.Bad("Store", nil, "is required")
	ch.BadVs("MemberTTL", time.Second, "must exceed twice %s (500ms)", "Heartbeat")
	err := fmt.Errorf("wrapped: %w", ch.Err())
	if got := Fields(err); !reflect.DeepEqual(got, []string{"MaxBody", "Store", "MemberTTL"}) {
		t.Fatalf("fields %v", got)
	}
	if !strings.Contains(err.Error(), "cluster: MemberTTL 1s: must exceed twice Heartbeat (500ms)") {
		t.Fatalf("message %q", err)
	}
	r := Rename(err, "", map[string]string{"MemberTTL": "member-ttl", "Heartbeat": "heartbeat", "MaxBody": "max-body"})
	if got := r.Error(); got != "max-body -1: must be >= 1\nmember-ttl 1s: must exceed twice heartbeat (500ms)" {
		t.Fatalf("renamed %q", got)
	}
	if Rename(errors.New("not a field"), "", map[string]string{"x": "y"}) != nil {
		t.Fatal("an error that names no field is dropped")
	}
}

func TestCheckerBounds(t *testing.T) {
	ch := Checker{}
	Range(&ch, "A", 0, 1, 10)
	Range(&ch, "B", 11, 1, 10)
	Range(&ch, "C", 5, 1, 10)
	PositiveDuration(&ch, "D", 0)
	PositiveDuration(&ch, "E", time.Nanosecond)
	Positive(&ch, "F", int64(0))
	if got := Fields(ch.Err()); !reflect.DeepEqual(got, []string{"A", "B", "D", "F"}) {
		t.Fatalf("fields %v", got)
	}
	if (&Checker{}).Err() != nil {
		t.Fatal("an empty checker reports nothing")
	}
}
