package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// TestPostgresStoppedMidLoad stops the node's PostgreSQL server under load:
// sends fail fast (within 5 s) with unavailable, nothing hangs, and once the
// server is back sends succeed and every invariant holds.
func TestPostgresStoppedMidLoad(t *testing.T) {
	srv := pgtest.StartServer(t)
	n := startNode(t, "node", "--store", srv.DSN())
	convs := convNames(100)
	l := &load{convs: convs, clients: 64, led: newLedger(),
		clientFor: func(int) sequencerv1connect.SequencerServiceClient { return n.grpcClient() }}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { l.run(ctx, t, stop); close(done) }()
	waitFor(t, 60*time.Second, "200 acks before stopping PostgreSQL", func() bool { return l.led.count() >= 200 })

	srv.Stop()
	c := n.grpcClient()
	for i := 0; i < 20; i++ {
		start := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := send(rctx, c, convs[i], 9, fmt.Sprintf("down-%d", i), nil)
		rcancel()
		took := time.Since(start)
		if err == nil {
			t.Fatalf("send %d succeeded with PostgreSQL stopped", i)
		}
		if code := connect.CodeOf(err); code != connect.CodeUnavailable {
			t.Fatalf("send %d with PostgreSQL stopped: code %v (%v), want unavailable", i, code, err)
		}
		if took > 5*time.Second {
			t.Fatalf("send %d took %v to fail, want <= 5s", i, took)
		}
	}
	resp, _ := httpGet("http://" + n.Addr + "/readyz")
	if resp == 200 {
		t.Errorf("/readyz answered 200 with the store down")
	}

	if err := srv.Start(); err != nil {
		t.Fatalf("restart PostgreSQL: %v", err)
	}
	// Sends succeed again, including the ones that failed while it was down.
	waitFor(t, 60*time.Second, "a send to succeed after PostgreSQL is back", func() bool {
		_, err := send(ctx, c, convs[0], 9, "down-0", nil)
		return err == nil
	})
	before := l.led.count()
	waitFor(t, 60*time.Second, "load to make progress after PostgreSQL is back", func() bool { return l.led.count() >= before+200 })
	close(stop)
	<-done
	if l.errs.Load() != 0 {
		t.Fatalf("%d sends failed for good", l.errs.Load())
	}
	if err := n.term(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	l.led.verify(t, openStore(t, srv.DSN()), convs)
	t.Logf("load retried %d times across the outage", l.retries.Load())
}
