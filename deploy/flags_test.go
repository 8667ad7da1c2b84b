package deploy

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// pendingFlags are security flags of docs/API.md ("Security")
// that the deploy files use. Until that work is merged a build may lack them;
// this test then only logs them. Once every one is in `sequencer serve --help`,
// delete this list: every flag the files name must exist.
var pendingFlags = []string{}

var (
	helpFlag = regexp.MustCompile(`(?m)^\s+--([a-z0-9-]+)\s`)
	fileFlag = regexp.MustCompile(`(?:^|[\s"'(\[=,])--([a-z][a-z0-9-]+)`)
	envVar   = regexp.MustCompile(`\bSEQUENCER_([A-Z0-9_]+)\b`)
)

// usedFlags returns the serve flags the deploy files name, as --flags in
// commands and args or as SEQUENCER_* variables, with where each was seen.
func usedFlags(t *testing.T) map[string]string {
	used := map[string]string{}
	add := func(flag, where string) {
		if _, ok := used[flag]; !ok {
			used[flag] = where
		}
	}
	// Sequencer commands and environments in compose and the StatefulSet
	// (Prometheus' and Grafana's own flags are not ours; SEQUENCER_IMAGE is
	// compose's variable, not the node's).
	compose := get(t, docs(t, "compose.yaml")[0], "services").(map[string]any)
	for _, name := range []string{"seq1", "seq2", "seq3"} {
		for _, a := range get(t, compose[name], "command").([]any) {
			if f, ok := strings.CutPrefix(a.(string), "--"); ok {
				add(strings.SplitN(f, "=", 2)[0], "compose.yaml "+name)
			}
		}
		for k := range get(t, compose[name], "environment").(map[string]any) {
			addEnv(add, k, "compose.yaml "+name)
		}
	}
	c := get(t, kubeObjects(t)["StatefulSet/sequencer"], "spec", "template", "spec", "containers", 0)
	for _, a := range get(t, c, "args").([]any) {
		if f, ok := strings.CutPrefix(a.(string), "--"); ok {
			add(strings.SplitN(f, "=", 2)[0], "kubernetes/statefulset.yaml")
		}
	}
	for _, e := range get(t, c, "env").([]any) {
		addEnv(add, get(t, e, "name").(string), "kubernetes/statefulset.yaml")
	}
	// The unit (outside comments), the image's ENV and the alert texts.
	for _, f := range []string{"systemd/sequencer.service", "Containerfile", "prometheus/alerts.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			for _, m := range envVar.FindAllStringSubmatch(line, -1) {
				addEnv(add, m[0], f)
			}
			if f != "Containerfile" { // its --flags are the build's (COPY --chown)
				for _, m := range fileFlag.FindAllStringSubmatch(line, -1) {
					add(m[1], f)
				}
			}
		}
	}
	return used
}

// addEnv records the flag a SEQUENCER_* variable sets (other names are not ours).
func addEnv(add func(flag, where string), name, where string) {
	if v, ok := strings.CutPrefix(name, "SEQUENCER_"); ok {
		add(strings.ReplaceAll(strings.ToLower(v), "_", "-"), where+" ("+name+")")
	}
}

// TestDeployFilesUseExistingFlags: every flag and SEQUENCER_* variable the
// deploy files use is a flag of this build's `sequencer serve` (or one of the
// pending contract flags). Runs with the Prometheus test, which builds the
// binary.
func TestDeployFilesUseExistingFlags(t *testing.T) {
	if os.Getenv("SEQUENCER_TEST_PROMETHEUS") != "1" {
		t.Skip("set SEQUENCER_TEST_PROMETHEUS=1 (make deploy-check): builds the binary")
	}
	out, _ := exec.Command(buildSequencer(t), "serve", "--help").CombinedOutput()
	var have []string
	for _, m := range helpFlag.FindAllStringSubmatch(string(out), -1) {
		have = append(have, m[1])
	}
	if len(have) < 10 {
		t.Fatalf("serve --help lists %d flags:\n%s", len(have), out)
	}
	used := usedFlags(t)
	if len(used) < 10 {
		t.Fatalf("found only %d flags in the deploy files: %v", len(used), used)
	}
	var pending []string
	for flag, where := range used {
		switch {
		case slices.Contains(have, flag):
		case slices.Contains(pendingFlags, flag):
			pending = append(pending, flag)
		default:
			t.Errorf("%s uses --%s, which `sequencer serve` does not have", where, flag)
		}
	}
	sort.Strings(pending)
	if len(pending) > 0 {
		t.Logf("contract flags not in this build yet (the security work): %v", pending)
	}
}
