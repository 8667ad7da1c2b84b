package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer/persist/citustest"
)

// Engine a-citus on a real Citus cluster stores exactly the messages it was
// given, and the PostgreSQL CPU is measured on every node: the coordinator
// and both workers (CHECKPOINT ran on each before the run; it would be
// logged if it failed).
func TestCitusEngineMeasuresEveryNode(t *testing.T) {
	db := citustest.NewDatabase(t)
	report := filepath.Join(t.TempDir(), "c.md")
	var stdout, stderr bytes.Buffer
	args := []string{"--engines", "a-citus", "--scenarios", "many", "--messages", "300", "--senders", "8", "--convs", "6",
		"--citus", db.DSN(), "--progress", "-1s", "--report", report}
	if err := Main(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Main: %v\nstderr:\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), "CHECKPOINT") {
		t.Errorf("checkpoint failed:\n%s", stderr.String())
	}
	rep := readReport(t, report)
	r, ok := find(rep.Results, "a-citus", "many")
	if !ok || r.Messages != 300 || r.Errors != 0 {
		t.Fatalf("a-citus: %+v; want 300 messages, no errors", r)
	}
	if _, ok := r.PGCPUUsPerMsgBy["coordinator"]; len(r.PGCPUUsPerMsgBy) != 3 || !ok || r.PGCPUUsPerMsg <= 0 {
		t.Fatalf("PostgreSQL CPU by server %v (total %v): want the coordinator and two workers", r.PGCPUUsPerMsgBy, r.PGCPUUsPerMsg)
	}
	for _, w := range db.Workers {
		if _, ok := r.PGCPUUsPerMsgBy["worker "+w.Addr()]; !ok {
			t.Errorf("no CPU for worker %s in %v", w.Addr(), r.PGCPUUsPerMsgBy)
		}
	}
	md, err := os.ReadFile(report)
	if err != nil || !strings.Contains(string(md), "## PostgreSQL CPU per message") {
		t.Errorf("the report has no PostgreSQL CPU table (%v)", err)
	}
}
