package bench

import (
	"bytes"
	"context"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer/persist/mysqltest"
)

// The MySQL engines, in one run on the test MariaDB, each store exactly the
// messages they were given: numbered 1..k in every conversation, no errors.
func TestMySQLEnginesStoreMessages(t *testing.T) {
	admin := mysqltest.AdminURL(t)
	bin := buildSequencer(t)
	report := filepath.Join(t.TempDir(), "m.md")
	engines := []string{"a-mysql", "e-batch-mysql", "b-mysql", "c-mysql"}
	const n = 400
	var stdout, stderr bytes.Buffer
	args := []string{"--engines", strings.Join(engines, ","), "--scenarios", "many", "--messages", "400", "--senders", "8", "--convs", "5",
		"--serve-bin", bin, "--mysql", admin, "--keep", "--progress", "-1s", "--report", report}
	if err := Main(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("Main: %v\nstderr:\n%s", err, stderr.String())
	}
	rep := readReport(t, report)
	if !strings.Contains(rep.Info.MySQL, "innodb_flush_log_at_trx_commit") {
		t.Errorf("the report does not describe the MySQL server: %q", rep.Info.MySQL)
	}
	my := &myBench{admin: admin, runID: rep.Info.RunID}
	for _, e := range engines {
		r, ok := find(rep.Results, e, "many")
		if !ok || r.Messages != n || r.Errors != 0 {
			t.Errorf("%s: %+v; want %d messages, no errors", e, r, n)
		}
		name := "seqbench_" + rep.Info.RunID + "_" + strings.ReplaceAll(e, "-", "_") + "_many"
		my.dbs = append(my.dbs, name)
		u, _ := url.Parse(admin)
		u.Path = "/" + name
		db, err := openMySQL(u.String(), 1)
		if err != nil {
			t.Fatal(err)
		}
		var rows, holes int
		err = db.QueryRow(`SELECT COUNT(*), (SELECT COUNT(*) FROM (SELECT conv_id FROM im_message GROUP BY conv_id
			HAVING MIN(seq) <> 1 OR MAX(seq) <> COUNT(*)) AS h) FROM im_message`).Scan(&rows, &holes)
		db.Close()
		if err != nil || rows != n || holes != 0 {
			t.Errorf("%s: %d rows, %d conversations not numbered 1..k (%v); want %d rows", e, rows, holes, err, n)
		}
	}
	t.Cleanup(func() { _ = my.Drop(context.Background()) })
}
