// Package deploy holds no Go code: its tests check the deployment files in
// this directory. The checks here only parse the files and compare fields
// (nothing is applied to a Kubernetes cluster or started with compose);
// prometheus_test.go runs a real Prometheus against real nodes when
// SEQUENCER_TEST_PROMETHEUS=1 (make deploy-check).
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/server"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	if built.bin != "" {
		os.RemoveAll(filepath.Dir(built.bin))
	}
	os.Exit(code)
}

// docs parses every YAML document of a file.
func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			out = append(out, d)
		}
	}
}

// get walks maps and lists: get(doc, "spec", "template", "containers", 0).
func get(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %v: %T is not a map", path, v)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("at %v: %T has no element %d", path, v, k)
			}
			v = l[k]
		}
	}
	return v
}

func TestEveryYAMLFileParses(t *testing.T) {
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ext := filepath.Ext(path); ext == ".yaml" || ext == ".yml" {
			if len(docs(t, path)) == 0 {
				t.Errorf("%s: no YAML document", path)
			}
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("parsed %d YAML files under deploy/, expected the compose, Prometheus, Grafana and Kubernetes files", n)
	}
}

// kubeObjects indexes deploy/kubernetes by kind/name.
func kubeObjects(t *testing.T) map[string]map[string]any {
	objs := map[string]map[string]any{}
	files, _ := filepath.Glob("kubernetes/*.yaml")
	for _, f := range files {
		for _, d := range docs(t, f) {
			kind, _ := d["kind"].(string)
			if kind == "Kustomization" {
				for _, r := range get(t, d, "resources").([]any) {
					if _, err := os.Stat(filepath.Join("kubernetes", r.(string))); err != nil {
						t.Errorf("kustomization lists %v: %v", r, err)
					}
				}
				continue
			}
			meta, _ := d["metadata"].(map[string]any)
			name, _ := meta["name"].(string)
			if kind == "" || name == "" {
				t.Fatalf("%s: a document without kind or metadata.name", f)
			}
			objs[kind+"/"+name] = d
		}
	}
	return objs
}

func flagValue(args []any, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a.(string), "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func TestKubernetesStatefulSet(t *testing.T) {
	objs := kubeObjects(t)
	sts := objs["StatefulSet/sequencer"]
	if sts == nil {
		t.Fatal("no StatefulSet sequencer")
	}
	pod := get(t, sts, "spec", "template", "spec")
	c := get(t, pod, "containers", 0)
	args := get(t, c, "args").([]any)
	if args[0] != "serve" {
		t.Fatalf("args %v do not run serve", args)
	}

	// Probes: readiness on /readyz, liveness on /healthz, on the admin port.
	if p := get(t, c, "readinessProbe", "httpGet", "path"); p != "/readyz" {
		t.Errorf("readiness path %v, want /readyz", p)
	}
	if p := get(t, c, "livenessProbe", "httpGet", "path"); p != "/healthz" {
		t.Errorf("liveness path %v, want /healthz", p)
	}
	admin, ok := flagValue(args, "admin-listen")
	if !ok || !strings.HasSuffix(admin, ":7072") {
		t.Errorf("--admin-listen %q, want the admin port 7072 the probes use", admin)
	}
	ports := map[string]int{}
	for _, p := range get(t, c, "ports").([]any) {
		ports[get(t, p, "name").(string)] = get(t, p, "containerPort").(int)
	}
	if ports[get(t, c, "readinessProbe", "httpGet", "port").(string)] != 7072 {
		t.Errorf("readiness probe port is not the admin port: %v", ports)
	}
	// The kubelet's grpc: probe has no TLS: with --tls-cert on the API port
	// it would always fail.
	if _, tls := flagValue(args, "tls-cert"); tls {
		for _, probe := range []string{"startupProbe", "readinessProbe", "livenessProbe"} {
			if m, _ := c.(map[string]any)[probe].(map[string]any); m["grpc"] != nil {
				t.Errorf("%s is a grpc: probe, but the API port has TLS (kubelet gRPC probes are cleartext)", probe)
			}
		}
	}

	// The grace period covers the preStop sleep and the whole drain.
	drain := server.Config{}.WithDefaults().DrainTimeout
	if v, ok := flagValue(args, "drain-timeout"); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		drain = d
	}
	preStop := time.Duration(get(t, c, "lifecycle", "preStop", "sleep", "seconds").(int)) * time.Second
	grace := time.Duration(get(t, pod, "terminationGracePeriodSeconds").(int)) * time.Second
	if grace <= preStop+drain {
		t.Errorf("terminationGracePeriodSeconds %v <= preStop %v + drain timeout %v: the kubelet would kill a draining node", grace, preStop, drain)
	}

	// Non-root, matching the image's numeric user; anti-affinity over hosts.
	if u := get(t, pod, "securityContext", "runAsUser"); u != 65532 {
		t.Errorf("runAsUser %v, want the image's 65532", u)
	}
	term := get(t, pod, "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution", 0, "podAffinityTerm")
	if get(t, term, "topologyKey") != "kubernetes.io/hostname" {
		t.Errorf("anti-affinity topology %v", get(t, term, "topologyKey"))
	}

	// Every Secret the pod uses exists; the DSN comes from one.
	var dsnFromSecret bool
	for _, e := range get(t, c, "env").([]any) {
		if get(t, e, "name") == "SEQUENCER_STORE" {
			ref := get(t, e, "valueFrom", "secretKeyRef")
			name := get(t, ref, "name").(string)
			if objs["Secret/"+name] == nil {
				t.Errorf("SEQUENCER_STORE from missing Secret %s", name)
			}
			dsnFromSecret = true
		}
	}
	if !dsnFromSecret {
		t.Error("SEQUENCER_STORE does not come from a Secret")
	}
	for _, v := range get(t, pod, "volumes").([]any) {
		if s, ok := get(t, v, "secret").(map[string]any); ok && objs["Secret/"+s["secretName"].(string)] == nil {
			t.Errorf("volume from missing Secret %v", s["secretName"])
		}
	}

	// The headless Service is the StatefulSet's and its address is advertised.
	svc := get(t, sts, "spec", "serviceName").(string)
	if objs["Service/"+svc] == nil || get(t, objs["Service/"+svc], "spec", "clusterIP") != "None" {
		t.Errorf("serviceName %s is not a headless Service here", svc)
	}
	if adv, _ := flagValue(args, "cluster-advertise"); !strings.Contains(adv, "."+svc+".") {
		t.Errorf("--cluster-advertise %q does not use the headless Service %s", adv, svc)
	}

	// The PodDisruptionBudget selects these pods.
	pdb := objs["PodDisruptionBudget/sequencer"]
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget")
	}
	labels := get(t, sts, "spec", "template", "metadata", "labels").(map[string]any)
	for k, v := range get(t, pdb, "spec", "selector", "matchLabels").(map[string]any) {
		if labels[k] != v {
			t.Errorf("PodDisruptionBudget selects %s=%v, pods have %v", k, v, labels[k])
		}
	}
	if get(t, pdb, "spec", "maxUnavailable") != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable %v, want 1", get(t, pdb, "spec", "maxUnavailable"))
	}
}

func TestCompose(t *testing.T) {
	d := docs(t, "compose.yaml")[0]
	services := get(t, d, "services").(map[string]any)
	for _, s := range []string{"postgres", "seq1", "seq2", "seq3", "prometheus", "grafana"} {
		if services[s] == nil {
			t.Errorf("no service %s", s)
		}
	}
	drain := server.Config{}.WithDefaults().DrainTimeout
	for _, name := range []string{"seq1", "seq2", "seq3"} {
		s := services[name]
		// The anchor's fields are merged in by the YAML decoder.
		test := get(t, s, "healthcheck", "test").([]any)
		if len(test) < 3 || test[0] != "CMD" || test[1] != "/sequencer" || test[2] != "health" {
			t.Errorf("%s: health check %v, want the image's own `sequencer health` (no shell in the image)", name, test)
		}
		if !slices.Contains(test, any("http://127.0.0.1:7070/readyz")) {
			t.Errorf("%s: health check %v does not probe /readyz", name, test)
		}
		grace, err := time.ParseDuration(get(t, s, "stop_grace_period").(string))
		if err != nil || grace <= drain {
			t.Errorf("%s: stop_grace_period %v (%v), want above the drain timeout %v", name, grace, err, drain)
		}
		if get(t, s, "depends_on", "postgres", "condition") != "service_healthy" {
			t.Errorf("%s: does not wait for a healthy PostgreSQL", name)
		}
		cmd := get(t, s, "command").([]any)
		if cmd[0] != "serve" || !slices.Contains(cmd, any("--cluster-listen")) || !slices.Contains(cmd, any(name)) {
			t.Errorf("%s: command %v, want serve in cluster mode with node id %s", name, cmd, name)
		}
	}
	// Prometheus scrapes exactly the three nodes.
	prom := docs(t, "prometheus/prometheus.yml")[0]
	targets := get(t, prom, "scrape_configs", 0, "static_configs", 0, "targets").([]any)
	if len(targets) != 3 {
		t.Errorf("Prometheus targets %v", targets)
	}
	for i, tg := range targets {
		if tg != "seq"+strconv.Itoa(i+1)+":7070" {
			t.Errorf("Prometheus target %v is not a compose node", tg)
		}
	}
}

func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("systemd/sequencer.service")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys[k] = append(keys[k], v)
		}
	}
	for k, want := range map[string]string{
		"DynamicUser": "yes", "ProtectSystem": "strict", "Restart": "on-failure", "NoNewPrivileges": "yes",
		"StateDirectory": "sequencer", "ProtectHome": "yes", "PrivateTmp": "yes", "CapabilityBoundingSet": "",
		"KillSignal": "SIGTERM",
	} {
		if !slices.Contains(keys[k], want) {
			t.Errorf("%s=%v, want %q", k, keys[k], want)
		}
	}
	stop, err := strconv.Atoi(keys["TimeoutStopSec"][0])
	drain := server.Config{}.WithDefaults().DrainTimeout
	if err != nil || time.Duration(stop)*time.Second <= drain {
		t.Errorf("TimeoutStopSec=%v, want above the drain timeout %v", keys["TimeoutStopSec"], drain)
	}
	if !strings.Contains(keys["Environment"][0], "SEQUENCER_STORE=/var/lib/sequencer") {
		t.Errorf("the default store is not the StateDirectory: %v", keys["Environment"])
	}
}

// dashboardQueries returns every PromQL expression of the dashboard with its
// variables replaced by values a plain Prometheus query accepts.
func dashboardQueries(t *testing.T, rateInterval string) map[string]string {
	t.Helper()
	b, err := os.ReadFile("grafana/sequencer.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct {
				Expr, RefID string
			}
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	r := strings.NewReplacer("$__rate_interval", rateInterval, "$instance", ".*")
	out := map[string]string{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q: empty expr", p.Title)
			}
			out[p.Title+" / "+tg.RefID] = r.Replace(tg.Expr)
		}
	}
	return out
}

func TestDashboardParses(t *testing.T) {
	q := dashboardQueries(t, "1m")
	if len(q) < 10 {
		t.Fatalf("%d queries in the dashboard", len(q))
	}
	for name, expr := range q {
		if strings.Contains(expr, "$") {
			t.Errorf("%s: unreplaced variable in %q", name, expr)
		}
	}
}

var metricName = regexp.MustCompile(`\b(sequencer_[a-z_]+|process_[a-z_]+|go_[a-z_]+)`)

// alertExprs returns the alert rules' expressions by alert name.
func alertExprs(t *testing.T) map[string]string {
	d := docs(t, "prometheus/alerts.yaml")[0]
	out := map[string]string{}
	for _, g := range get(t, d, "groups").([]any) {
		for _, r := range get(t, g, "rules").([]any) {
			out[get(t, r, "alert").(string)] = get(t, r, "expr").(string)
		}
	}
	want := []string{"SequencerWorkerLeaseLost", "SequencerPartitionLeasesLost", "SequencerReadinessFlapping",
		"SequencerCommitLatencyHigh", "SequencerResourceExhausted", "SequencerHeadMismatch", "SequencerHeadRegression",
		"SequencerPendingNearLimit"}
	for _, w := range want {
		if out[w] == "" {
			t.Errorf("no alert %s", w)
		}
	}
	return out
}

func TestAlertRulesParse(t *testing.T) { alertExprs(t) }
