package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/persist/mysqltest"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// The MySQL store in the fault cases the PostgreSQL store passes: kill -9
// of the node runs on every store (eachStore); here the database restart
// under load and the frozen owner (zombie) in a 3-node cluster.

// TestMySQLRestartedMidLoad stops the node's MariaDB server under load:
// sends fail fast with unavailable, nothing hangs, and once the server is
// back sends succeed and every acked message is stored, contiguously.
func TestMySQLRestartedMidLoad(t *testing.T) {
	srv := mysqltest.StartServer(t)
	url := mysqltest.NewDatabaseOn(t, srv.URL())
	n := startNode(t, "node", "--store", url)
	convs := convNames(100)
	l := &load{convs: convs, clients: 64, led: newLedger(),
		clientFor: func(int) sequencerv1connect.SequencerServiceClient { return n.grpcClient() }}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { l.run(ctx, t, stop); close(done) }()
	waitFor(t, 60*time.Second, "200 acks before stopping MariaDB", func() bool { return l.led.count() >= 200 })

	srv.Kill() // a crash: InnoDB recovers from its redo log at the next start
	c := n.grpcClient()
	for i := 0; i < 10; i++ {
		start := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := send(rctx, c, convs[i], 9, fmt.Sprintf("down-%d", i), nil)
		rcancel()
		took := time.Since(start)
		if err == nil {
			t.Fatalf("send %d succeeded with MariaDB down", i)
		}
		if code := connect.CodeOf(err); code != connect.CodeUnavailable {
			t.Fatalf("send %d with MariaDB down: code %v (%v), want unavailable", i, code, err)
		}
		if took > 10*time.Second {
			t.Fatalf("send %d took %v to fail", i, took)
		}
	}
	if err := srv.Start(); err != nil {
		t.Fatalf("restart MariaDB: %v", err)
	}
	waitFor(t, 60*time.Second, "a send to succeed after MariaDB is back", func() bool {
		_, err := send(ctx, c, convs[0], 9, "down-0", nil)
		return err == nil
	})
	before := l.led.count()
	waitFor(t, 60*time.Second, "load to make progress after MariaDB is back", func() bool { return l.led.count() >= before+200 })
	close(stop)
	<-done
	if l.errs.Load() != 0 {
		t.Fatalf("%d sends failed for good", l.errs.Load())
	}
	if err := n.term(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	l.led.verify(t, openStore(t, url), convs)
	t.Logf("load retried %d times across the crash", l.retries.Load())
}

// TestMySQLClusterZombie is TestClusterZombie on MariaDB: a node frozen
// past its lease steps down when it resumes, and none of its pending
// commits lands behind the new owners.
func TestMySQLClusterZombie(t *testing.T) { clusterZombie(t, mysqltest.NewDatabase(t), nil, false) }

// A node on MySQL exposes the store's redo counter and its pools on
// /metrics, and `sequencer migrate` reports the schema applied.
func TestMySQLNodeMetricsAndMigrate(t *testing.T) {
	url := mysqltest.NewDatabase(t)
	out, err := exec.Command(binPath, "migrate", "--store", url).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "migrated mysql://") {
		t.Fatalf("migrate: %v %s", err, out)
	}
	n := startNode(t, "node", "--store", url)
	if _, err := send(context.Background(), n.grpcClient(), "g:m", 1, "m1", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	code, body := httpGetBody(t, "http://"+n.Addr+"/metrics")
	for _, want := range []string{"sequencer_store_commit_retries_total 0", `sequencer_store_pool_max_conns{pool="commit"}`} {
		if code != 200 || !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %s (%d)", want, code)
		}
	}
}

func httpGetBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
