// Package conf holds what every component's Config shares: filling the zero
// fields of a Config from its DefaultConfig, and a field error that names the
// field (so a caller that set the field from a flag can name the flag).
//
// It owns no default and no rule: those live in each component's
// DefaultConfig and Validate.
package conf

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// FillZero sets every exported field of *c that holds its zero value to the
// same field of d (a DefaultConfig). Fields are compared as a whole: a
// non-zero struct field is kept as it is.
func FillZero[T any](c *T, d T) {
	cv, dv := reflect.ValueOf(c).Elem(), reflect.ValueOf(d)
	if cv.Kind() != reflect.Struct {
		panic("conf.FillZero: not a struct")
	}
	for i := range cv.NumField() {
		f := cv.Field(i)
		if f.CanSet() && f.IsZero() {
			f.Set(dv.Field(i))
		}
	}
}

// FillZeroNested is FillZero for a Config that holds other components'
// Configs as struct fields (server.Config holds actor.Config, which holds
// commit.Config): a struct field with exported fields is filled field by
// field, recursively; every other field (time.Time, slices, pointers,
// interfaces, numbers) is taken from d only when it is zero as a whole.
func FillZeroNested[T any](c *T, d T) {
	fillNested(reflect.ValueOf(c).Elem(), reflect.ValueOf(d))
}

func fillNested(cv, dv reflect.Value) {
	if cv.Kind() != reflect.Struct {
		panic("conf.FillZeroNested: not a struct")
	}
	for i := range cv.NumField() {
		f := cv.Field(i)
		if !f.CanSet() {
			continue
		}
		if f.Kind() == reflect.Struct && hasExported(f.Type()) {
			fillNested(f, dv.Field(i))
			continue
		}
		if f.IsZero() {
			f.Set(dv.Field(i))
		}
	}
}

// hasExported reports whether struct type t has an exported field (a
// Config, as opposed to a value type like time.Time).
func hasExported(t reflect.Type) bool {
	for i := range t.NumField() {
		if t.Field(i).IsExported() {
			return true
		}
	}
	return false
}

// FieldError says that one Config field holds a value that makes no sense.
type FieldError struct {
	Pkg   string // component, printed as a prefix when set ("commit")
	Field string // the Go field name, or the flag name after Rename
	Value any
	Rule  string // what the value must be; "%s" stands for Other's name
	Other string // the field a cross-field rule compares with, if any
}

func (e *FieldError) Error() string {
	rule := e.Rule
	if e.Other != "" {
		rule = strings.Replace(rule, "%s", e.Other, 1)
	}
	var b strings.Builder
	if e.Pkg != "" {
		b.WriteString(e.Pkg + ": ")
	}
	if e.Value == nil {
		fmt.Fprintf(&b, "%s: %s", e.Field, rule)
	} else {
		fmt.Fprintf(&b, "%s %v: %s", e.Field, e.Value, rule)
	}
	return b.String()
}

// Checker collects the FieldErrors of one Validate.
type Checker struct {
	Pkg  string
	errs []error
}

// Bad records that field (holding v) breaks rule.
func (c *Checker) Bad(field string, v any, rule string) {
	c.errs = append(c.errs, &FieldError{Pkg: c.Pkg, Field: field, Value: v, Rule: rule})
}

// BadVs records a cross-field rule: rule holds "%s" for other's name.
func (c *Checker) BadVs(field string, v any, rule, other string) {
	c.errs = append(c.errs, &FieldError{Pkg: c.Pkg, Field: field, Value: v, Rule: rule, Other: other})
}

// Add records err as it is (nil is ignored): the errors of a nested Validate.
func (c *Checker) Add(err error) {
	if err != nil {
		c.errs = append(c.errs, err)
	}
}

// Err joins what was recorded; nil when nothing was.
func (c *Checker) Err() error { return errors.Join(c.errs...) }

// Number is what Range and Positive compare.
type Number interface {
	~int | ~int32 | ~int64 | ~float64
}

// Positive records field when v < 1 (counts and sizes).
func Positive[N Number](c *Checker, field string, v N) {
	if v < 1 {
		c.Bad(field, v, "must be >= 1")
	}
}

// Range records field when v is outside [lo, hi].
func Range[N Number](c *Checker, field string, v, lo, hi N) {
	if v < lo || v > hi {
		c.Bad(field, v, fmt.Sprintf("must be %v..%v", lo, hi))
	}
}

// PositiveDuration records field when d <= 0.
func PositiveDuration(c *Checker, field string, d time.Duration) {
	if d <= 0 {
		c.Bad(field, d, "must be > 0")
	}
}

// Rename returns the FieldErrors found in err whose Field is a key of names,
// renamed to names[Field] (and Other too when it is a key) and with the
// component prefix pkg ("" for none); every other error in err is dropped. A caller that fills
// a component's Config from its own fields (server from flags) uses it to
// report the component's rules under its own names; the fields it does not
// map are the component's dependencies, which the component checks when it
// is built.
func Rename(err error, pkg string, names map[string]string) error {
	var out []error
	visit(err, func(fe *FieldError) {
		n, ok := names[fe.Field]
		if !ok {
			return
		}
		r := *fe
		r.Pkg, r.Field = pkg, n
		if o, ok := names[fe.Other]; ok {
			r.Other = o
		}
		out = append(out, &r)
	})
	return errors.Join(out...)
}

// Nest returns err with the Field (and Other) of every FieldError in it
// prefixed by "prefix." and the component prefix set to pkg (the enclosing
// component's, or ""): the errors of a nested Config's Validate under their
// path in the enclosing Config ("actor: Commit.Workers" for actor.Config's
// commit.Config). Other errors are kept as they are.
func Nest(err error, pkg, prefix string) error {
	if err == nil {
		return nil
	}
	var out []error
	walk(err, func(e error) {
		fe, ok := e.(*FieldError)
		if !ok {
			out = append(out, e)
			return
		}
		r := *fe
		r.Pkg, r.Field = pkg, prefix+"."+fe.Field
		if fe.Other != "" {
			r.Other = prefix + "." + fe.Other
		}
		out = append(out, &r)
	})
	return errors.Join(out...)
}

// walk calls f on every leaf of err's tree of joined errors (a FieldError is
// a leaf; so is any error that joins nothing).
func walk(err error, f func(error)) {
	if _, ok := err.(*FieldError); ok {
		f(err)
		return
	}
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range u.Unwrap() {
			walk(e, f)
		}
		return
	}
	f(err)
}

// Fields lists the Field of every FieldError in err, in order.
func Fields(err error) []string {
	var out []string
	visit(err, func(fe *FieldError) { out = append(out, fe.Field) })
	return out
}

// visit calls f on every FieldError in err's tree.
func visit(err error, f func(*FieldError)) {
	if fe, ok := err.(*FieldError); ok {
		f(fe)
		return
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			visit(e, f)
		}
	case interface{ Unwrap() error }:
		visit(u.Unwrap(), f)
	}
}
