package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
)

// TestFeedNemesis: 3 nodes behind the nemesis proxies (one PostgreSQL), a
// resuming subscriber homed on every node (gRPC, Connect, Connect JSON)
// following 48 conversations, writers on random nodes, two of which give
// up on a send at its first error. Meanwhile, in turn:
//   - n1's links to its peers are blackholed for longer than the
//     membership TTL, then healed (the peer feed streams to and from n1
//     stall and are cut);
//   - n2's link to the database is blackholed as long (its lease lapses:
//     its partitions hand off, and back after the heal; the test checks
//     the membership moved);
//   - n3 is kill -9'ed and started again once its lease expired (its
//     partitions fail over and come back; its subscriber resumes
//     elsewhere, and a new one is homed on it after the restart);
//   - a fourth node joins (partitions hand off to it), gets a subscriber
//     of its own, and leaves with SIGTERM (a drain: they hand off again).
//
// Each subscriber's sequence, after its resumes (at any node, from its
// last seqs), equals the stored one for every conversation, and no
// subscriber ever received a message that is not stored (checkDelivered).
// About 60 s.
func TestFeedNemesis(t *testing.T) {
	feedNemesis(t, pgNemesisStore(t, pgtest.NewDatabase(t)))
}

// TestFeedNemesisMySQL is TestFeedNemesis on MySQL (MariaDB); the proxies
// forward to its unix socket when it has no TCP address
// (mysqlNemesisStore).
func TestFeedNemesisMySQL(t *testing.T) { feedNemesis(t, mysqlNemesisStore(t)) }

// TestFeedNemesisCitus is TestFeedNemesis on Citus (a coordinator and two
// workers). n2's database cut cuts its links to the coordinator and to
// both workers (its worker-direct commits and reads), not the
// coordinator's own links to the workers (citusNemesisStore).
func TestFeedNemesisCitus(t *testing.T) { feedNemesis(t, citusNemesisStore(t)) }

func feedNemesis(t *testing.T, st nemesisStore) {
	c := startNemesisClusterOn(t, st, 3, false)
	nodes := &nodeSet{}
	for _, p := range c.nodes {
		nodes.add(p.Addr)
	}
	convs := c.convs[:48]
	r := startFeedRun(t, nodes, convs, 6, 2, 4*time.Minute, threeSubs(nodes, convs)...)
	const hold = 4 * time.Second // twice the membership TTL
	r.await("before the faults", 200)
	c.checkWorkerLinks(3)
	faults := append(append([]nemesisFault(nil), nemesisFaults...), processFaults...)
	for _, f := range []struct {
		name string
		v    int
		// lapses: the victim's membership lease lapses (it is cut from
		// the database, or dead, for twice the TTL), so the membership
		// version another node routes by moves: the fault took.
		lapses bool
	}{{"peers-blackhole", 0, false}, {"db-blackhole", 1, true}, {"kill-9", 2, true}} {
		i := slices.IndexFunc(faults, func(nf nemesisFault) bool { return nf.name == f.name })
		if i < 0 {
			t.Fatalf("no fault %s", f.name)
		}
		observer := c.nodes[(f.v+1)%len(c.nodes)]
		version := metricValue(t, observer.Addr, "sequencer_cluster_membership_version")
		t.Logf("fault %s on %s", f.name, c.nodes[f.v].name)
		c.inject(faults[i], f.v)
		time.Sleep(hold) // the fault lasts this long
		c.heal()
		c.healProcesses()
		c.waitHealed("after " + f.name)
		if v := metricValue(t, observer.Addr, "sequencer_cluster_membership_version"); f.lapses && v <= version {
			t.Errorf("%s on %s: %s's membership version is still %v: the victim's lease did not lapse", f.name, c.nodes[f.v].name, observer.name, v)
		}
		r.await("after "+f.name, 200)
	}
	r.add(newFeedSub("sub@n3 after its restart (connect)", 2, nodes, convs, h2cClient()))
	t.Log("n4 joins")
	n4 := startNode(t, "n4", clusterArgs(t, c.dsn, "n4", nemesisTTL)...)
	nodes.add(n4.Addr)
	r.add(newFeedSub("sub@n4 (grpc)", 3, nodes, convs, h2cClient(), connect.WithGRPC()))
	r.await("with n4", 200)
	t.Log("SIGTERM n4 (drain)")
	if err := n4.term(60 * time.Second); err != nil {
		t.Fatalf("n4 graceful leave: %v\n%s", err, n4.Output())
	}
	r.await("after n4 left", 200)
	r.stopWriters()
	checkFeed(t, c.dsn, convs, r.subs, r.fl)
	r.stopSubs()
	// The feed's metrics tell the same story: every node delivered, its
	// links to both peers are up again, and the links to n4 ended.
	for _, p := range c.nodes {
		if metricValue(t, p.Addr, "sequencer_feed_delivered_messages_total") == 0 {
			t.Errorf("%s: sequencer_feed_delivered_messages_total is 0", p.name)
		}
		waitFor(t, 30*time.Second, p.name+"'s 2 peer feed links up", func() bool {
			return metricValue(t, p.Addr, "sequencer_feed_peer_links") == 2 && metricValue(t, p.Addr, "sequencer_feed_peer_links_up") == 2
		})
		if metricValue(t, p.Addr, "sequencer_feed_peer_stream_ends_total") == 0 {
			t.Errorf("%s: sequencer_feed_peer_stream_ends_total is 0 after a peer left", p.name)
		}
	}
}

// TestFeedEmbeddedKill: one node on the embedded store, a resuming
// subscriber, writers; the node is kill -9'ed twice and started again on
// the same data directory. The subscriber, resuming from its last seqs,
// ends with exactly the stored sequence of every conversation (read from
// the data directory once the node stopped), and never received a message
// that is not stored. About 15 s.
func TestFeedEmbeddedKill(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	n := startNode(t, "node", "--store", dir)
	nodes := &nodeSet{}
	nodes.add(n.Addr)
	convs := convNames(16)
	r := startFeedRun(t, nodes, convs, 4, 1, 3*time.Minute,
		newFeedSub("sub (grpc)", 0, nodes, convs, h2cClient(), connect.WithGRPC()),
		newFeedSub("sub (connect json)", 0, nodes, convs, http.DefaultClient, connect.WithProtoJSON()))
	r.await("before the crash", 200)
	for i := 1; i <= 2; i++ {
		t.Logf("kill -9 (%d)", i)
		n.kill()
		n.start(n.Addr)
		r.await(fmt.Sprintf("after restart %d", i), 200)
	}
	r.stopWriters()
	// The embedded store is the node's alone while it runs: wait for the
	// subscribers at the heads the node answers, stop it, then read the
	// data directory.
	c := n.grpcClient()
	for _, conv := range convs {
		h, err := c.GetHead(r.ctx, connect.NewRequest(&sequencerv1.GetHeadRequest{ConvId: conv}))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range r.subs {
			waitFor(t, 60*time.Second, s.name+" at the head of "+conv, func() bool { return s.last(conv) >= h.Msg.GetHeadSeq() })
		}
	}
	r.stopSubs()
	if err := n.term(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	checkFeedStore(t, openStore(t, dir), convs, r.subs, r.fl)
}

// errRecorder is a testing.TB that records Errorf instead of failing.
type errRecorder struct {
	testing.TB
	errs []string
}

func (r *errRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *errRecorder) Logf(string, ...any) {}

// TestCheckDeliveredCatches: the checker of the chaos tests fails on each
// way a feed could show what is not stored: a seq above the head, another
// message at a stored seq, another body, and a failed send delivered
// while not stored; and passes a duplicate of a stored row.
func TestCheckDeliveredCatches(t *testing.T) {
	stored := map[string][]sequencer.Message{"c": {{ConvID: "c", Seq: 1, MsgID: 10, Body: []byte("a")}, {ConvID: "c", Seq: 2, MsgID: 11, Body: []byte("b")}}}
	for _, tc := range []struct {
		name string
		seen delivered
		want int
	}{
		{"stored", delivered{conv: "c", seq: 2, msgID: 11, body: "b"}, 0},
		{"above the head", delivered{conv: "c", seq: 3, msgID: 12, body: "x"}, 2}, // and the failed send "x" delivered
		{"another msg_id", delivered{conv: "c", seq: 1, msgID: 99, body: "a"}, 1},
		{"another body", delivered{conv: "c", seq: 1, msgID: 10, body: "x"}, 2},
		{"unfollowed conversation", delivered{conv: "d", seq: 1, msgID: 10, body: "a"}, 1},
	} {
		sub := &feedSub{name: "s", seen: []delivered{{conv: "c", seq: 1, msgID: 10, body: "a"}, tc.seen}}
		fl := &feedLoad{failed: []failedSend{{conv: "c", body: "x", err: "unavailable"}}}
		r := &errRecorder{TB: t}
		checkDelivered(r, stored, []*feedSub{sub}, fl)
		if len(r.errs) != tc.want {
			t.Errorf("%s: %d errors %q, want %d", tc.name, len(r.errs), r.errs, tc.want)
		}
	}
}
