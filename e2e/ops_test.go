package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

// runAdmin runs `sequencer admin args...` and returns its stdout, stderr
// and exit code.
func runAdmin(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binPath, append([]string{"admin"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("admin %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func adminJSON(t *testing.T, into any, args ...string) {
	t.Helper()
	out, errs, code := runAdmin(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("admin %v: exit %d: %s", args, code, errs)
	}
	if err := json.Unmarshal([]byte(out), into); err != nil {
		t.Fatalf("admin %v: %v\n%s", args, err, out)
	}
}

// liveSet is the API addresses clients may pick from; a drained node is
// taken out once it is gone.
type liveSet struct {
	mu    sync.Mutex
	addrs []string
}

func (s *liveSet) pick(rng *rand.Rand) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrs[rng.Intn(len(s.addrs))]
}

func (s *liveSet) remove(a string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.addrs {
		if x == a {
			s.addrs = append(s.addrs[:i], s.addrs[i+1:]...)
			return
		}
	}
}

// TestAdminDrainUnderLoad: three real nodes under load through random
// nodes; `sequencer admin drain n2 --wait` makes n2 leave gracefully: the
// command reports it left, the n2 process exits 0 by itself, its partitions
// are held by the others (nothing moving), and every acked message is
// stored at its seq.
func TestAdminDrainUnderLoad(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	var procs []*proc
	live := &liveSet{}
	for i := 1; i <= 3; i++ {
		p := startNode(t, fmt.Sprintf("n%d", i), clusterArgs(t, dsn, fmt.Sprintf("n%d", i), "2s")...)
		procs = append(procs, p)
		live.addrs = append(live.addrs, p.Addr)
	}
	waitFor(t, 60*time.Second, "every partition held by its ring owner", func() bool {
		var ps struct{ Moving int }
		adminJSON(t, &ps, "partitions", "--store", dsn)
		return ps.Moving == 0
	})
	var ms struct {
		Members []struct {
			NodeID string `json:"node_id"`
			State  string
			Leases int
		}
	}
	adminJSON(t, &ms, "members", "--store", dsn)
	if len(ms.Members) != 3 || ms.Members[1].NodeID != "n2" || ms.Members[1].Leases == 0 {
		t.Fatalf("members before the drain: %+v", ms)
	}

	convs := convNames(120)
	rngs := make([]*rand.Rand, 32)
	for i := range rngs {
		rngs[i] = rand.New(rand.NewSource(int64(7 + i)))
	}
	l := &load{convs: convs, clients: 32, led: newLedger(),
		sendFn: func(ctx context.Context, i int, conv string, from uint64, cid string, body []byte) (uint64, uint64, error) {
			c := sequencerv1connect.NewSequencerServiceClient(http.DefaultClient, "http://"+live.pick(rngs[i]), connect.WithProtoJSON())
			resp, err := send(ctx, c, conv, from, cid, body)
			if err != nil {
				return 0, 0, err
			}
			return resp.MsgId, resp.Seq, nil
		}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { l.run(ctx, t, stop); close(done) }()
	waitFor(t, 60*time.Second, "300 acks before the drain", func() bool { return l.led.count() >= 300 })

	out, errs, code := runAdmin(t, "drain", "n2", "--store", dsn, "--wait", "60s")
	if code != 0 {
		t.Fatalf("admin drain: exit %d: %s%s\n%s", code, out, errs, procs[1].Output())
	}
	t.Logf("admin drain: %s", out)
	select {
	case <-procs[1].done:
	case <-time.After(60 * time.Second):
		t.Fatalf("n2 did not exit after the drain\n%s", procs[1].Output())
	}
	if procs[1].exit != nil {
		t.Fatalf("n2 exit after the drain: %v, want 0\n%s", procs[1].exit, procs[1].Output())
	}
	live.remove(procs[1].Addr)
	n := l.led.count()
	waitFor(t, 60*time.Second, "300 more acks after the drain", func() bool { return l.led.count() >= n+300 })
	close(stop)
	<-done
	if e := l.errs.Load(); e != 0 {
		t.Errorf("%d sends failed for good", e)
	}
	adminJSON(t, &ms, "members", "--store", dsn)
	if len(ms.Members) != 2 || ms.Members[0].NodeID != "n1" || ms.Members[1].NodeID != "n3" {
		t.Fatalf("members after the drain: %+v", ms)
	}
	var ps struct {
		Moving     int
		Partitions []struct{ Owner string }
	}
	adminJSON(t, &ps, "partitions", "--store", dsn)
	for _, p := range ps.Partitions {
		if p.Owner == "n2" {
			t.Fatalf("a partition is still held by n2 after it left: %+v", p)
		}
	}
	if ps.Moving != 0 {
		t.Fatalf("%d partitions moving after the drain settled", ps.Moving)
	}
	l.led.verify(t, openStore(t, dsn), convs)
	for _, p := range []*proc{procs[0], procs[2]} {
		if err := p.term(60 * time.Second); err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
	}
}

// snapshot is the acks recorded so far (the first answer to each key),
// read from the history.
func (l *ledger) snapshot() map[sequencer.ClientKey]ack {
	acks, _, _ := promises(l.hist.Ops())
	out := make(map[sequencer.ClientKey]ack, len(acks))
	for key, p := range acks {
		from, cid, ok := strings.Cut(key, "/")
		uid, err := strconv.ParseUint(from, 10, 64)
		if !ok || err != nil {
			panic(fmt.Sprintf("e2e: history key %q is not from_uid/client_msg_id", key))
		}
		out[sequencer.ClientKey{FromUID: uid, ClientMsgID: cid}] = ack{conv: p.conv, from: uid, cid: cid, msgID: p.msgID, seq: p.seq}
	}
	return out
}

// pgTool finds a PostgreSQL client program (Debian puts the versioned ones
// under /usr/lib/postgresql/N/bin). It fails the test when there is none:
// the backup test must not skip.
func pgTool(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if ms, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name); len(ms) > 0 {
		return ms[len(ms)-1]
	}
	t.Fatalf("%s not found: install PostgreSQL's client programs (apt-get install postgresql-client)", name)
	return ""
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// TestBackupRestoreUnderLoad backs a store up while sends are running
// (pg_dump for PostgreSQL; `sequencer admin backup`, VACUUM INTO, for the
// embedded store), restores it into a fresh database, and starts a node on
// the copy: every message acked before the backup began is there, each
// conversation holds exactly 1..head, a new send in every conversation gets
// head+1, and no new msg_id repeats a restored one (all are greater).
func TestBackupRestoreUnderLoad(t *testing.T) {
	for _, kind := range []string{"postgres", "embedded"} {
		t.Run(kind, func(t *testing.T) {
			var spec, restored string
			var backup, restore func()
			dir := t.TempDir()
			if kind == "postgres" {
				pgDump, pgRestore := pgTool(t, "pg_dump"), pgTool(t, "pg_restore")
				spec, restored = pgtest.NewDatabase(t), pgtest.NewDatabase(t)
				file := filepath.Join(dir, "backup.dump")
				backup = func() { run(t, pgDump, "--format=custom", "--file="+file, "--dbname="+spec) }
				restore = func() { run(t, pgRestore, "--no-owner", "--exit-on-error", "--dbname="+restored, file) }
			} else {
				spec = "sqlite:" + filepath.Join(dir, "live", "sequencer.db")
				file := filepath.Join(dir, "backup.db")
				restored = filepath.Join(dir, "restored") // a directory: the node uses restored/sequencer.db
				backup = func() {
					if out, errs, code := runAdmin(t, "backup", "--store", spec, "--to", file); code != 0 {
						t.Fatalf("admin backup: exit %d: %s%s", code, out, errs)
					}
				}
				restore = func() {
					if err := os.MkdirAll(restored, 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.Rename(file, filepath.Join(restored, "sequencer.db")); err != nil {
						t.Fatal(err)
					}
				}
			}
			convs := convNames(60)
			acked := loadAndBackUp(t, spec, convs, backup)
			restore()
			checkRestored(t, restored, convs, acked)
		})
	}
}

// loadAndBackUp runs a node on spec under load, calls backup while sends are
// running, lets the load go on, stops the node, and returns the acks
// received before the backup started.
func loadAndBackUp(t *testing.T, spec string, convs []string, backup func()) map[sequencer.ClientKey]ack {
	n := startNode(t, "original", "--store", spec)
	l := &load{convs: convs, clients: 16, led: newLedger(),
		clientFor: func(int) sequencerv1connect.SequencerServiceClient { return n.grpcClient() }}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { l.run(ctx, t, stop); close(done) }()
	waitFor(t, 60*time.Second, "300 acks before the backup", func() bool { return l.led.count() >= 300 })
	before := l.led.snapshot()
	backup()
	after := l.led.count()
	waitFor(t, 60*time.Second, "100 acks after the backup", func() bool { return l.led.count() >= after+100 })
	close(stop)
	<-done
	t.Logf("%d acks before the backup started, %d when it ended, %d in all", len(before), after, l.led.count())
	if e := l.errs.Load(); e != 0 {
		t.Fatalf("%d sends failed for good", e)
	}
	if err := n.term(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return before
}

// checkRestored checks the restored store and starts a node on it.
func checkRestored(t *testing.T, spec string, convs []string, acked map[sequencer.ClientKey]ack) {
	ctx := context.Background()
	st := openStore(t, spec)
	heads := map[string]uint64{}
	msgIDs := map[uint64]bool{}
	var maxID uint64
	stored := map[string]map[uint64]sequencer.Message{}
	for _, c := range convs {
		h, err := st.LoadHead(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := st.ReadRange(ctx, c, 0, int(h)+10)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(rows)) != h {
			t.Fatalf("restored %s: head %d but %d rows", c, h, len(rows))
		}
		stored[c] = map[uint64]sequencer.Message{}
		for i, r := range rows {
			if r.Seq != uint64(i+1) {
				t.Fatalf("restored %s: row %d has seq %d", c, i, r.Seq)
			}
			msgIDs[r.MsgID] = true
			maxID = max(maxID, r.MsgID)
			stored[c][r.Seq] = r
		}
		heads[c] = h
	}
	for k, a := range acked {
		if r, ok := stored[a.conv][a.seq]; !ok || r.MsgID != a.msgID || r.ClientMsgID != a.cid {
			t.Fatalf("acked before the backup but not restored: %v at %s seq %d (msg_id %d)", k, a.conv, a.seq, a.msgID)
		}
	}
	// A node on the restored store continues every conversation at head+1
	// with msg_ids never issued before. (It needs the store to itself.)
	st.Close()
	n := startNode(t, "restored", "--store", spec)
	c := n.grpcClient()
	for _, conv := range convs {
		resp, err := send(ctx, c, conv, 4242, "after-restore-"+conv, []byte("r"))
		if err != nil {
			t.Fatalf("send after restore: %v", err)
		}
		if resp.Seq != heads[conv]+1 {
			t.Fatalf("%s after restore: seq %d, want head+1 = %d", conv, resp.Seq, heads[conv]+1)
		}
		if msgIDs[resp.MsgId] || resp.MsgId <= maxID {
			t.Fatalf("%s after restore: msg_id %d repeats or is not above the restored ones (max %d)", conv, resp.MsgId, maxID)
		}
		msgIDs[resp.MsgId] = true
	}
	if err := n.term(30 * time.Second); err != nil {
		t.Fatal(err)
	}
}
