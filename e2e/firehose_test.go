package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sequencer-im/sequencer/internal/natstest"
	"github.com/sequencer-im/sequencer/persist/citustest"
	"github.com/sequencer-im/sequencer/persist/mysqltest"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
	"github.com/sequencer-im/sequencer/ring"
)

// streamCount is the number of messages the stream holds.
func streamCount(t *testing.T, url, stream string) uint64 {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		return 0
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return 0
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// headsVia sums the heads of convs as a node answers them.
func headsVia(t *testing.T, nodes *nodeSet, convs []string) (uint64, bool) {
	var sum uint64
	for i, c := range convs {
		addrs := nodes.all()
		cl := sequencerv1connect.NewSequencerServiceClient(http.DefaultClient, "http://"+addrs[i%len(addrs)], connect.WithProtoJSON())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := cl.GetHead(ctx, connect.NewRequest(&sequencerv1.GetHeadRequest{ConvId: c}))
		cancel()
		if err != nil {
			return 0, false
		}
		sum += r.Msg.GetHeadSeq()
	}
	return sum, true
}

// waitStreamHoldsAll waits until the stream holds as many messages as the
// conversations' heads add up to (the check that follows compares them one
// by one). When it does not within 2 minutes the test fails with where the
// stream and each node's publisher stand, and goes on to that check, so a
// failure says whether messages were lost or only not yet published.
func waitStreamHoldsAll(t *testing.T, url, stream string, nodes *nodeSet, convs []string) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(120 * time.Second)
	var sum, count uint64
	var headsOK bool
	for time.Now().Before(deadline) {
		sum, headsOK = headsVia(t, nodes, convs)
		count = streamCount(t, url, stream)
		if headsOK && count >= sum {
			t.Logf("the stream held every stored message (%d) %s after the writers stopped", sum, time.Since(start).Round(100*time.Millisecond))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "after 2m0s the stream holds %d messages, the heads add up to %d (all heads read: %v)", count, sum, headsOK)
	for _, a := range nodes.all() {
		fmt.Fprintf(&b, "\n  %s:", a)
		for _, m := range []string{"sequencer_feed_publishing", "sequencer_feed_lag_messages", "sequencer_feed_lag_seconds",
			"sequencer_feed_published_total", "sequencer_feed_publish_errors_total", "sequencer_feed_store_errors_total",
			"sequencer_feed_skipped_total"} {
			fmt.Fprintf(&b, " %s=%g", strings.TrimPrefix(m, "sequencer_feed_"), metricValue(t, a, m))
		}
	}
	t.Error(b.String())
}

// checkStream reads the stream back in full and compares it with the
// store: per conversation the same messages in seq order, each once, none
// that is not stored, each on its partition's subject; and the stream's
// count equals the store's.
func checkStream(t *testing.T, url, stream, spec string, convs []string, partitions int) {
	t.Helper()
	st := openStore(t, spec)
	ctx := context.Background()
	stored := map[string][]natstest.Stored{}
	total := 0
	for _, c := range convs {
		ms, err := st.ReadRange(ctx, c, 0, 1_000_000)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			stored[c] = append(stored[c], natstest.Stored{Seq: m.Seq, MsgID: m.MsgID})
		}
		total += len(ms)
	}
	recs := natstest.ReadAll(t, url, stream)
	subject := func(c string) string { return fmt.Sprintf("sequencer.%d", ring.PartitionOf(c, partitions)) }
	if diff := natstest.Equal(recs, stored, subject); diff != "" {
		t.Fatal(diff)
	}
	if len(recs) != total {
		t.Fatalf("the stream holds %d messages, the store %d", len(recs), total)
	}
	t.Logf("stream equals store: %d messages of %d conversations", total, len(convs))
}

// outage stops NATS for d while writers go on: sends keep being
// acknowledged, /readyz stays 200 on every node, and the backlog shows in
// sequencer_feed_lag_messages.
func outage(t *testing.T, ns *natstest.Server, nodes *nodeSet, acks *atomic.Int64, d time.Duration) {
	t.Helper()
	ns.Stop()
	from := acks.Load()
	end := time.Now().Add(d)
	sawLag := false
	for time.Now().Before(end) {
		for _, a := range nodes.all() {
			if code, err := httpGet("http://" + a + "/readyz"); err == nil && code != 200 {
				t.Errorf("/readyz of %s answered %d during the NATS outage", a, code)
			}
			if metricValue(t, a, "sequencer_feed_lag_messages") > 0 {
				sawLag = true
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := acks.Load() - from; n < 100 {
		t.Fatalf("only %d sends acknowledged during a %v NATS outage", n, d)
	}
	if !sawLag {
		t.Fatalf("sequencer_feed_lag_messages stayed 0 during the NATS outage")
	}
	t.Logf("NATS outage of %v: %d sends acknowledged meanwhile", d, acks.Load()-from)
	ns.Start()
}

// TestFirehoseEmbedded: one node on the embedded store publishes to NATS
// while writers send; NATS is killed and restarted, the node is killed -9
// and restarted; at the end the stream equals the store.
func TestFirehoseEmbedded(t *testing.T) {
	ns := natstest.Start(t)
	spec := filepath.Join(t.TempDir(), "data")
	n := startNode(t, "n1", "--store", spec, "--feed-nats", ns.URL(), "--feed-create-stream")
	nodes := &nodeSet{}
	nodes.add(n.Addr)
	convs := convNames(40)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fl := &feedLoad{}
	acks := &fl.acks
	stop := make(chan struct{})
	writers := feedWriters(ctx, nodes, convs, 6, 0, fl, stop)
	await := func(what string, k int64) {
		from := acks.Load()
		waitFor(t, 90*time.Second, fmt.Sprintf("%d more acks %s", k, what), func() bool { return acks.Load() >= from+k })
	}
	await("at first", 300)
	outage(t, ns, nodes, acks, 5*time.Second)
	await("after NATS came back", 300)
	t.Log("kill -9 the node")
	n.kill()
	n.start(n.Addr)
	await("after the restart", 300)
	close(stop)
	writers.Wait()
	if len(fl.failed) > 0 {
		t.Fatalf("%d sends failed with a final error, first %+v", len(fl.failed), fl.failed[0])
	}
	waitStreamHoldsAll(t, ns.URL(), "SEQUENCER", nodes, convs)
	n.kill()
	checkStream(t, ns.URL(), "SEQUENCER", spec, convs, ring.DefaultPartitions)
}

// TestFirehoseClusterPostgres: 3 nodes on PostgreSQL publish to NATS under
// load; n1 is killed -9 and restarted, n2 leaves with SIGTERM (its
// partitions hand off), NATS restarts, then NATS is down for 30 s. The
// stream read back in full equals the store.
func TestFirehoseClusterPostgres(t *testing.T) { firehoseCluster(t, pgtest.NewDatabase(t)) }

// TestFirehoseClusterMySQL is TestFirehoseClusterPostgres on MySQL.
func TestFirehoseClusterMySQL(t *testing.T) { firehoseCluster(t, mysqltest.NewDatabase(t)) }

// TestFirehoseClusterCitus is TestFirehoseClusterPostgres on Citus (a
// coordinator and two workers): the outbox rows are written in the commits'
// transactions on the workers' shards (migrations_citus/0008).
func TestFirehoseClusterCitus(t *testing.T) { firehoseCluster(t, citustest.NewDatabase(t).DSN()) }

func firehoseCluster(t *testing.T, dsn string) {
	ns := natstest.Start(t)
	nodes := &nodeSet{}
	var procs []*proc
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("n%d", i)
		p := startNode(t, id, append(clusterArgs(t, dsn, id, "2s"), "--feed-nats", ns.URL(), "--feed-create-stream")...)
		procs = append(procs, p)
		nodes.add(p.Addr)
	}
	convs := convNames(60)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	fl := &feedLoad{}
	acks := &fl.acks
	stop := make(chan struct{})
	writers := feedWriters(ctx, nodes, convs, 6, 0, fl, stop)
	await := func(what string, k int64) {
		from := acks.Load()
		waitFor(t, 90*time.Second, fmt.Sprintf("%d more acks %s", k, what), func() bool { return acks.Load() >= from+k })
	}
	await("at first", 300)
	t.Log("kill -9 n1")
	procs[0].kill()
	await("after kill -9 n1", 300)
	procs[0].start(procs[0].Addr)
	await("after n1 came back", 300)
	t.Log("SIGTERM n2 (handoff)")
	if err := procs[1].term(60 * time.Second); err != nil {
		t.Fatalf("n2 graceful leave: %v", err)
	}
	live := &nodeSet{}
	live.add(procs[0].Addr)
	live.add(procs[2].Addr)
	await("after n2 left", 300)
	t.Log("NATS restart")
	ns.Stop()
	ns.Start()
	await("after the NATS restart", 300)
	outage(t, ns, live, acks, 30*time.Second)
	await("after the NATS outage", 300)
	close(stop)
	writers.Wait()
	if len(fl.failed) > 0 {
		t.Fatalf("%d sends failed with a final error, first %+v", len(fl.failed), fl.failed[0])
	}
	waitStreamHoldsAll(t, ns.URL(), "SEQUENCER", live, convs)
	checkStream(t, ns.URL(), "SEQUENCER", dsn, convs, ring.DefaultPartitions)
}

// TestFirehoseBadFlags: a bad --feed-nats URL, an unreachable server and a
// missing stream without --feed-create-stream are exit 1 with a message
// that says what to do.
func TestFirehoseBadFlags(t *testing.T) {
	ns := natstest.Start(t)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"bad URL", []string{"--feed-nats", "http://127.0.0.1:4222"}, "--feed-nats"},
		{"no server", []string{"--feed-nats", "nats://" + freeAddr(t)}, "cannot connect"},
		{"no stream", []string{"--feed-nats", ns.URL()}, "--feed-create-stream"},
		{"bad format", []string{"--feed-nats", ns.URL(), "--feed-create-stream", "--feed-format", "xml"}, "--feed-format"},
	}
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := append([]string{"serve", "--listen", freeAddr(t), "--store", filepath.Join(t.TempDir(), "data")}, c.args...)
			cmd := exec.Command(binPath, args...)
			out, err := cmd.CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 1 {
				t.Errorf("%s: exit %v, want 1\n%s", c.name, err, out)
				return
			}
			if !strings.Contains(string(out), c.want) {
				t.Errorf("%s: output lacks %q:\n%s", c.name, c.want, out)
			}
		}()
	}
	wg.Wait()
}
