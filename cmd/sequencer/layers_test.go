package main

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// layers ranks every package of the module: a package may import only
// packages of a strictly lower rank (docs/ARCHITECTURE.md draws them). A new
// package must be given a rank here, which is the moment to decide where it
// belongs.
var layers = [][]string{
	// 0: leaves: the domain (root), generated code, small helpers.
	{"", "buildinfo", "clock", "internal/conf", "internal/netbuf", "internal/ratelog", "internal/reqid", "internal/storytest", "internal/testcert",
		"internal/testwait", "internal/tmpfs", "internal/tracing", "internal/history", "internal/rapidmutant", "proto/sequencer/v1", "persist/internal/serverproc",
		"persist/mysql/mysqlurl", "internal/natstest",
		"deploy", "e2e", "scripts/gcstall"},
	// 1: interfaces and pure building blocks.
	// proto/cluster/v1 carries proto/sequencer/v1's Message (the feed between nodes).
	{"persist", "ring", "metrics", "persist/pgtest", "persist/citustest", "proto/cluster/v1", "proto/sequencer/v1/sequencerv1connect"},
	// 2: the membership rules, the single-writer core, ids, the embedded store, the MySQL test kit (over pgtest's helpers).
	// The change feed's core and hub (over persist's roles only).
	// The firehose's core and publisher (over persist's outbox and a Sink).
	{"membership", "conv", "idgen", "persist/storetest", "persist/mysqltest", "feed", "firehose", "proto/cluster/v1/clusterv1connect"},
	// 2b: membership.Store over any SQL dialect (the transitions, written once).
	{"membership/sqltable"},
	// 3: the ownership core, group commit, the stores (each decides fences with membership.CheckFences), test kits.
	{"ownership", "commit", "persist/postgres", "persist/mysql", "persist/sqlite", "persist/memstore", "membership/membershiptest"},
	// 3b: the fault-injecting wrapper (over any store, memstore by default); Citus over the PostgreSQL dialect.
	{"persist/faulty", "persist/citus"},
	// 4: the conversations of a node, the cluster shell, the API edge, the SDK, store selection.
	{"actor", "cluster", "api", "client", "console", "persist/open"},
	// 4b: the firehose's NATS sink (the API's Message as payload).
	{"firehose/natssink"},
	// 5: operator commands and the wiring of one node.
	{"admin", "server"},
	// 6: the commands.
	{"cmd/sequencer-bench/internal/bench", "cmd/sequencer"},
	{"cmd/sequencer-bench"},
}

func TestImportsRunDownTheLayers(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = "/usr/local/go/bin/go"
	}
	const mod = "github.com/sequencer-im/sequencer"
	// Only stdout is the listing: on a fresh module cache go list also
	// writes "go: downloading ..." lines, to stderr.
	var stderr strings.Builder
	cmd := exec.Command(gobin, "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", mod+"/...")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s%s", err, out, stderr.String())
	}
	rank := map[string]int{}
	for r, pkgs := range layers {
		for _, p := range pkgs {
			rank[strings.TrimSuffix(mod+"/"+p, "/")] = r
		}
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 30 {
		t.Fatalf("go list listed %d packages", len(lines))
	}
	problems, checked := checkLayers(lines, rank, mod)
	for _, p := range problems {
		t.Error(p)
	}
	if checked < 50 {
		t.Fatalf("only %d imports checked", checked)
	}
	// The check itself sees an upward import when there is one.
	if p, _ := checkLayers([]string{mod + "/conv " + mod + "/actor"}, rank, mod); len(p) != 1 {
		t.Fatalf("an upward import (conv -> actor) gave %q", p)
	}
}

// checkLayers reports every package of lines ("pkg import...") that has no
// rank or imports a package of the module at its rank or above.
func checkLayers(lines []string, rank map[string]int, mod string) (problems []string, checked int) {
	for _, l := range lines {
		f := strings.Fields(l)
		pkg, imports := f[0], f[1:]
		r, ok := rank[pkg]
		if !ok {
			problems = append(problems, pkg+" has no layer: add it to layers in cmd/sequencer/layers_test.go")
			continue
		}
		for _, imp := range imports {
			if imp != mod && !strings.HasPrefix(imp, mod+"/") {
				continue
			}
			checked++
			if ri, ok := rank[imp]; ok && ri >= r {
				problems = append(problems, fmt.Sprintf("%s (layer %d) imports %s (layer %d): imports must run down the layers", pkg, r, imp, ri))
			}
		}
	}
	return problems, checked
}
