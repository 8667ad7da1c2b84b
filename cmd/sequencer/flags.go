package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// envName is the environment variable that sets a flag: SEQUENCER_<FLAG>,
// upper case, '-' as '_' (docs/API.md, "Command line").
func envName(flagName string) string {
	return "SEQUENCER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// usageError is a mistake on the command line or in the environment (unknown
// flag, stray argument, bad value): exit 2 with one line.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef returns a usageError.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// parseWithEnv parses args; every flag not given on the command line takes its
// SEQUENCER_<FLAG> environment variable when set. Command line beats
// environment beats default. Positional arguments are refused (the flag
// package stops at the first one, so flags after it would be silently
// ignored). Errors are usageErrors of one line; --help prints the usage and
// returns flag.ErrHelp.
func parseWithEnv(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard) // the flag package prints the error and the whole usage
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return err
	}
	if err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q: every setting is a --flag", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = usagef("%s=%q: %v", envName(f.Name), v, e)
			}
		}
	})
	return err
}

// usageWithEnv prints the flags with their environment variables.
func usageWithEnv(fs *flag.FlagSet, synopsis string) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, "%s\n\nFlags (each also read from the environment variable shown):\n", synopsis)
		fs.VisitAll(func(f *flag.Flag) {
			def := ""
			if f.DefValue != "" {
				def = fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintf(w, "  --%s  [%s]%s\n      %s\n", f.Name, envName(f.Name), def, f.Usage)
		})
	}
}

// listFlag is a comma-separated list flag.
type listFlag struct{ list *[]string }

func (l listFlag) String() string {
	if l.list == nil {
		return ""
	}
	return strings.Join(*l.list, ",")
}

func (l listFlag) Set(v string) error {
	*l.list = nil
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l.list = append(*l.list, p)
		}
	}
	return nil
}
