package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

const headRegressions = "sequencer_head_regressions_total"

// TestAsyncStandbyPromotedNeverBackwards loses acked messages the way an
// asynchronous standby does: the standby stops receiving WAL, the node acks
// more messages on the primary, the primary dies, the standby is promoted.
// The store's head of those conversations is now below seqs the node acked.
// The node must refuse sends to them with unavailable (never answer a seq at
// or below one it acked), log an ERROR and count it; other conversations
// keep working. (Without the detection a node answered seq 6 for a
// conversation it had acked up to 9.)
func TestAsyncStandbyPromotedNeverBackwards(t *testing.T) {
	primary, standby, dsn := replicaPair(t, false)
	defer primary.Kill9()
	n := startNode(t, "node", "--store", dsn)
	c := n.grpcClient()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	lost := []string{"lost-0", "lost-1", "lost-2"} // acks after the standby stopped
	kept := []string{"kept-0", "kept-1"}           // acks before only
	acked := map[string]uint64{}                   // highest seq acked per conversation
	sendN := func(conv string, from uint64, k int, tag string) {
		t.Helper()
		for i := 0; i < k; i++ {
			resp, err := send(ctx, c, conv, from, fmt.Sprintf("%s-%s-%d", tag, conv, i), nil)
			if err != nil {
				t.Fatalf("send %s to %s: %v", tag, conv, err)
			}
			if resp.Seq != acked[conv]+1 {
				t.Fatalf("%s: seq %d after %d", conv, resp.Seq, acked[conv])
			}
			acked[conv] = resp.Seq
		}
	}
	for _, conv := range append(append([]string{}, lost...), kept...) {
		sendN(conv, 1, 5, "before")
	}
	// Everything so far is on the standby before it stops.
	var lsn string
	if err := primary.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text", &lsn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the standby to flush the first acks", func() bool {
		var ok bool
		err := primary.QueryRow(ctx, "SELECT coalesce(bool_and(flush_lsn >= '"+lsn+"'::pg_lsn), false) FROM pg_stat_replication", &ok)
		return err == nil && ok
	})
	standby.Stop()
	for _, conv := range lost {
		sendN(conv, 2, 4, "after")
	}
	primary.Kill9()
	if err := standby.Start(); err != nil {
		t.Fatalf("restart the standby: %v", err)
	}
	if err := standby.Promote(); err != nil {
		t.Fatalf("promote: %v\n%s", err, standby.Log())
	}

	// The store did lose the acks (else the test proves nothing).
	st := openStore(t, standby.DSN(replicaDB))
	for _, conv := range lost {
		head, err := st.LoadHead(ctx, conv)
		if err != nil {
			t.Fatal(err)
		}
		if head >= acked[conv] {
			t.Fatalf("%s: store head %d, acked %d: the standby did not lose the last acks", conv, head, acked[conv])
		}
	}

	// Conversations whose acks all survived continue once the node has
	// reconnected to the new primary.
	for _, conv := range kept {
		var resp *sendResult
		waitFor(t, 60*time.Second, "a send to "+conv+" on the new primary", func() bool {
			resp = trySend(ctx, c, conv, 3, "switch-"+conv)
			return resp.err == nil || !retryableCode(resp.err)
		})
		if resp.err != nil {
			t.Fatalf("%s after the switch: %v", conv, resp.err)
		}
		if resp.seq != acked[conv]+1 {
			t.Fatalf("%s after the switch: seq %d, want %d", conv, resp.seq, acked[conv]+1)
		}
	}

	// The lost ones are refused, every time, and never get a seq the node
	// already handed out.
	if !strings.Contains(metricsText(t, n.Addr), headRegressions) {
		t.Fatalf("/metrics has no %s", headRegressions)
	}
	for _, conv := range lost {
		for i := 0; i < 5; i++ {
			r := trySend(ctx, c, conv, 4, fmt.Sprintf("regressed-%s-%d", conv, i))
			switch {
			case r.err == nil:
				t.Fatalf("%s: store head below the acked seq %d, yet a send was answered with seq %d", conv, acked[conv], r.seq)
			case connect.CodeOf(r.err) != connect.CodeUnavailable:
				t.Fatalf("%s: refused with %v, want unavailable", conv, r.err)
			}
		}
	}
	if v := metricValue(t, n.Addr, headRegressions); v < float64(len(lost)) {
		t.Fatalf("%s = %v, want >= %d (one per regressed conversation)", headRegressions, v, len(lost))
	}
	for _, conv := range lost {
		found := false
		for _, line := range strings.Split(n.Output(), "\n") {
			if strings.Contains(line, "level=ERROR") && strings.Contains(line, conv) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("no ERROR log line names %s", conv)
		}
	}
	// Nothing was written below or at the acked seqs.
	for _, conv := range lost {
		head, err := st.LoadHead(ctx, conv)
		if err != nil {
			t.Fatal(err)
		}
		if head >= acked[conv] {
			t.Fatalf("%s: store head moved to %d (acked %d) while refused", conv, head, acked[conv])
		}
	}
}

type sendResult struct {
	seq uint64
	err error
}

func trySend(ctx context.Context, c sequencerv1connect.SequencerServiceClient, conv string, from uint64, cid string) *sendResult {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := send(rctx, c, conv, from, cid, nil)
	if err != nil {
		return &sendResult{err: err}
	}
	return &sendResult{seq: resp.Seq}
}
