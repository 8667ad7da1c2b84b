package e2e

import (
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer/persist/pgtest"
)

// docs/API.md, "Command line": nodes sharing a database must agree on
// --partitions, a --node-id held by a live member is not taken over, and a
// node without --cluster-listen does not serve a cluster's database: each
// refuses to start with exit 1 and one clear reason, and the running node
// keeps serving.
func TestClusterConfigMismatchRefusesToStart(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	first := startNode(t, "first", "--store", dsn, "--cluster-listen", freeAddr(t), "--node-id", "n1")

	code, out := runOnce(t, "serve", "--listen", freeAddr(t), "--store", dsn, "--cluster-listen", freeAddr(t),
		"--node-id", "n2", "--partitions", "31")
	if code != 1 || !strings.Contains(out, "partition count") {
		t.Fatalf("a node with --partitions 31 beside a live 271: exit %d, output:\n%s", code, out)
	}

	code, out = runOnce(t, "serve", "--listen", freeAddr(t), "--store", dsn, "--cluster-listen", freeAddr(t),
		"--node-id", "n1")
	if code != 1 || !strings.Contains(out, "held by a live member") {
		t.Fatalf("a second process with the live --node-id n1: exit %d, output:\n%s", code, out)
	}

	// A node without --cluster-listen on the cluster's database would say
	// it owns every conversation while every commit of it is fenced:
	// refused, naming the flag.
	code, out = runOnce(t, "serve", "--listen", freeAddr(t), "--store", dsn)
	if code != 1 || !strings.Contains(out, "--cluster-listen") || !strings.Contains(out, "n1") {
		t.Fatalf("a node without --cluster-listen on a cluster's database: exit %d, output:\n%s", code, out)
	}

	// The first node was neither disturbed nor superseded.
	if status, raw := postJSON(t, first.Addr, "Send", item("g:cfg", "1", "k", "aGk=")); status != 200 {
		t.Fatalf("the running node after the refused starts: %d %s", status, raw)
	}
	select {
	case <-first.done:
		t.Fatalf("the running node exited: %v\n%s", first.exit, first.Output())
	default:
	}
}
