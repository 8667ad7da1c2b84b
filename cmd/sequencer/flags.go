package main

import (
	"flag"
	"fmt"
	"strings"
)

// envName is the environment variable that sets a flag: SEQUENCER_<FLAG>,
// upper case, '-' as '_' (CONTRACT.md section 3).
func envName(flagName string) string {
	return "SEQUENCER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseWithEnv parses args; every flag not given on the command line takes its
// SEQUENCER_<FLAG> environment variable when set. Command line beats
// environment beats default.
func parseWithEnv(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", envName(f.Name), v, e)
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
