package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/mysqltest"
	"github.com/sequencer-im/sequencer/persist/open"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/persist/postgres"
	"github.com/sequencer-im/sequencer/ring"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	mysqltest.Stop()
	os.Exit(code)
}

var ctx = context.Background()

const testPartitions = 31

// migrated returns a fresh, migrated store spec of kind ("postgres" or
// "sqlite") and the store itself (closed at the end).
func migrated(t *testing.T, kind string) (string, persist.Store) {
	t.Helper()
	spec := "sqlite:" + filepath.Join(t.TempDir(), "seq.db")
	switch kind {
	case "postgres":
		spec = pgtest.NewDatabase(t)
	case "mysql":
		spec = mysqltest.NewDatabase(t)
	}
	st, err := open.Store(ctx, spec, open.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return spec, st
}

func openAdmin(t *testing.T, spec string) *Admin {
	t.Helper()
	a, err := Open(ctx, spec, Options{Partitions: testPartitions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func member(id string) membership.Member {
	return membership.Member{NodeID: id, Incarnation: id + "/0001", ClusterAddr: "127.0.0.1:71" + id[1:], APIAddr: "127.0.0.1:70" + id[1:]}
}

// rendered renders v both ways and checks the JSON round-trips.
func rendered(t *testing.T, v Tabler, into any) string {
	t.Helper()
	var tb, js bytes.Buffer
	if err := Render(&tb, v, false); err != nil {
		t.Fatal(err)
	}
	if err := Render(&js, v, true); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js.Bytes(), into); err != nil {
		t.Fatalf("JSON output does not parse: %v\n%s", err, js.String())
	}
	return tb.String()
}

// TestClusterCommands: three members that hold what the ring gives them;
// members, partitions and route show it; drain takes a member out of the
// ring (its partitions moving until it hands off); forget refuses a live
// member without --force, removes an expired one, bumps the version.
func TestClusterCommands(t *testing.T) {
	for _, kind := range []string{"postgres", "mysql"} {
		t.Run(kind, func(t *testing.T) { clusterCommands(t, kind) })
	}
}

func clusterCommands(t *testing.T, kind string) {
	spec, st := migrated(t, kind)
	cs := st.(membership.Provider).Membership()
	var v membership.View
	var err error
	for _, id := range []string{"n1", "n2", "n3"} {
		if v, err = cs.Join(ctx, member(id), time.Minute, false); err != nil {
			t.Fatal(err)
		}
	}
	r, err := ring.New(v.RingNodes(), ring.Config{Partitions: testPartitions})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		ls, err := cs.Acquire(ctx, member(id).Incarnation, v.Version, r.OwnedBy(id))
		if err != nil || len(ls) != len(r.OwnedBy(id)) {
			t.Fatalf("acquire for %s: %v %v", id, ls, err)
		}
	}
	a := openAdmin(t, spec)

	ms, err := a.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var msJSON Members
	table := rendered(t, ms, &msJSON)
	if len(ms.Members) != 3 || msJSON.Version != v.Version || len(msJSON.Members) != 3 {
		t.Fatalf("members: %+v", ms)
	}
	sum := 0
	for _, m := range ms.Members {
		if m.State != "live" || m.Leases != len(r.OwnedBy(m.NodeID)) || m.RingPartitions != m.Leases || m.LeaseLeftMs <= 0 {
			t.Fatalf("member %+v", m)
		}
		sum += m.Leases
	}
	if sum != testPartitions {
		t.Fatalf("members hold %d leases, want %d", sum, testPartitions)
	}
	for _, want := range []string{"NODE", "STATE", "n2", "live", "127.0.0.1:702"} {
		if !strings.Contains(table, want) {
			t.Fatalf("members table lacks %q:\n%s", want, table)
		}
	}

	ps, err := a.Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var psJSON Partitions
	table = rendered(t, ps, &psJSON)
	if len(ps.Partitions) != testPartitions || ps.Moving != 0 || len(psJSON.Partitions) != testPartitions {
		t.Fatalf("partitions: %d rows, %d moving", len(ps.Partitions), ps.Moving)
	}
	for _, p := range ps.Partitions {
		o, _ := r.Owner(p.Partition)
		if p.Owner != o.NodeID || p.RingOwner != o.NodeID || p.Epoch != 1 || !p.OwnerLive || p.Moving {
			t.Fatalf("partition %+v, ring owner %s", p, o.NodeID)
		}
	}
	if !strings.Contains(table, "PARTITION") || !strings.Contains(table, "0 moving") {
		t.Fatalf("partitions table:\n%s", table)
	}

	conv := "g:admin:42"
	rt, err := a.Route(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	owner, p, _ := r.OwnerOf(conv)
	var rtJSON Placement
	rendered(t, rt, &rtJSON)
	if rt.Partition != p || rt.Node != owner.NodeID || rt.LeaseOwner != owner.NodeID || rt.Epoch != 1 || rt.Moving ||
		rt.APIAddr != member(owner.NodeID).APIAddr || rtJSON.Node != owner.NodeID || rt.Partition != ring.PartitionOf(conv, testPartitions) {
		t.Fatalf("route %+v, want %s partition %d", rt, owner.NodeID, p)
	}

	// Drain n2: out of the ring, its leases still held: its partitions move.
	d, err := a.Drain(ctx, "n2", 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Incarnation != member("n2").Incarnation || d.Left || d.Version <= v.Version {
		t.Fatalf("drain: %+v", d)
	}
	ms, _ = a.Members(ctx)
	if m := ms.Members[1]; m.NodeID != "n2" || m.State != "leaving" || m.RingPartitions != 0 || m.Leases == 0 {
		t.Fatalf("drained member: %+v", m)
	}
	ps, _ = a.Partitions(ctx)
	r2, _ := ring.New([]ring.Node{{NodeID: "n1"}, {NodeID: "n3"}}, ring.Config{Partitions: testPartitions})
	want := 0
	for _, p := range ps.Partitions {
		o, _ := r.Owner(p.Partition)
		o2, _ := r2.Owner(p.Partition)
		if o.NodeID != o2.NodeID {
			want++
		}
		if p.Owner == "n2" && !p.Moving || p.RingOwner != o2.NodeID {
			t.Fatalf("after the drain of n2: %+v", p)
		}
	}
	if ps.Moving != want || want < len(r.OwnedBy("n2")) {
		t.Fatalf("%d partitions moving after the drain, want %d (n2 held %d)", ps.Moving, want, len(r.OwnedBy("n2")))
	}
	if _, err := a.Drain(ctx, "nobody", 0); !errors.Is(err, membership.ErrNoSuchMember) {
		t.Fatalf("drain of an unknown node: %v", err)
	}

	// Forget: refused while live, done with --force, version bumped; its
	// partitions now have a dead owner.
	before, _ := cs.View(ctx)
	if _, err := a.Forget(ctx, "n3", false); !errors.Is(err, ErrLive) {
		t.Fatalf("forget of a live member: %v, want ErrLive", err)
	}
	f, err := a.Forget(ctx, "n3", true)
	if err != nil || !f.WasLive || f.Version <= before.Version || f.Incarnation != member("n3").Incarnation {
		t.Fatalf("forget --force: %+v %v", f, err)
	}
	ps, _ = a.Partitions(ctx)
	for _, p := range ps.Partitions {
		if p.Owner == "n3" && (p.OwnerLive || !p.Moving) {
			t.Fatalf("partition of the forgotten n3: %+v", p)
		}
	}
	table = rendered(t, ps, &psJSON)
	if !strings.Contains(table, "n3 (dead)") {
		t.Fatalf("partitions table does not mark n3 dead:\n%s", table)
	}
	if _, err := a.Forget(ctx, "n3", false); !errors.Is(err, membership.ErrNoSuchMember) {
		t.Fatalf("forget twice: %v", err)
	}

	// An expired row (its node died; no heartbeat removed it yet) is shown
	// as expired and forgotten without --force.
	if _, err := cs.Join(ctx, member("n4"), time.Millisecond, false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ms, err = a.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m := ms.Members[len(ms.Members)-1]; m.NodeID == "n4" && m.State == "expired" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n4 not expired: %+v", ms)
		}
		time.Sleep(5 * time.Millisecond)
	}
	before, _ = cs.View(ctx)
	if f, err := a.Forget(ctx, "n4", false); err != nil || f.WasLive || f.Version <= before.Version {
		t.Fatalf("forget of an expired member: %+v %v", f, err)
	}
	if rows, _, _ := cs.Rows(ctx); len(rows) != 2 {
		t.Fatalf("rows after forgetting: %+v", rows)
	}
}

func commitMessages(t *testing.T, st persist.Store, conv string, times ...time.Time) {
	t.Helper()
	b := persist.ConvBatch{ConvID: conv}
	for i, at := range times {
		id := uint64(time.Now().UnixNano())
		b.Messages = append(b.Messages, sequencer.Message{MsgID: id, ConvID: conv, Seq: uint64(i + 1), FromUID: 9, MsgType: 1,
			Body: []byte("b"), ClientMsgID: fmt.Sprintf("%s-%d", conv, i), ServerAt: at})
	}
	if err := st.Commit(ctx, []persist.ConvBatch{b}); err != nil {
		t.Fatal(err)
	}
}

// TestStoreCommands: head, trim, migrate status and backup on both stores.
func TestStoreCommands(t *testing.T) {
	for _, kind := range []string{"postgres", "sqlite", "mysql"} {
		t.Run(kind, func(t *testing.T) {
			spec, st := migrated(t, kind)
			old := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
			recent := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
			commitMessages(t, st, "g:a", old, old, recent)
			commitMessages(t, st, "g:b", old)
			st.Close() // the embedded store admits one process (or opener) at a time
			a := openAdmin(t, spec)

			h, err := a.Head(ctx, "g:a")
			if err != nil || h.Head != 3 || h.FirstStored != 1 || h.Partition != ring.PartitionOf("g:a", testPartitions) {
				t.Fatalf("head: %+v %v", h, err)
			}
			var hJSON Head
			if table := rendered(t, h, &hJSON); !strings.Contains(table, "next seq") || hJSON.Head != 3 {
				t.Fatalf("head table:\n%s", table)
			}
			if h, _ := a.Head(ctx, "g:none"); h.Head != 0 || h.FirstStored != 0 {
				t.Fatalf("head of an unknown conversation: %+v", h)
			}

			tr, err := a.Trim(ctx, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			if err != nil || tr.Deleted != 3 {
				t.Fatalf("trim: %+v %v", tr, err)
			}
			if h, _ := a.Head(ctx, "g:a"); h.Head != 3 || h.FirstStored != 3 {
				t.Fatalf("head after trim: %+v", h)
			}
			if h, _ := a.Head(ctx, "g:b"); h.Head != 1 || h.FirstStored != 0 {
				t.Fatalf("head of an emptied conversation: %+v", h)
			}

			ms, err := a.MigrateStatus(ctx)
			if err != nil || !ms.UpToDate || ms.Applied != ms.Available || ms.Applied == 0 || ms.Store != kind {
				t.Fatalf("migrate status: %+v %v", ms, err)
			}
			var msJSON MigrationStatus
			if table := rendered(t, ms, &msJSON); !strings.Contains(table, "up to date") || !strings.Contains(table, "0001_init") {
				t.Fatalf("migrate status table:\n%s", table)
			}

			if kind == "postgres" {
				if _, err := a.Backup(ctx, filepath.Join(t.TempDir(), "x.db")); err == nil || !strings.Contains(err.Error(), "pg_dump") {
					t.Fatalf("backup of PostgreSQL: %v, want a pointer to pg_dump", err)
				}
				return
			}
			if kind == "mysql" {
				if _, err := a.Backup(ctx, filepath.Join(t.TempDir(), "x.db")); err == nil || !strings.Contains(err.Error(), "mysqldump") {
					t.Fatalf("backup of MySQL: %v, want a pointer to mysqldump", err)
				}
				return
			}
			for _, f := range []func() error{
				func() error { _, err := a.Members(ctx); return err },
				func() error { _, err := a.Partitions(ctx); return err },
				func() error { _, err := a.Route(ctx, "g:a"); return err },
				func() error { _, err := a.Drain(ctx, "n1", 0); return err },
				func() error { _, err := a.Forget(ctx, "n1", true); return err },
			} {
				if err := f(); !errors.Is(err, ErrNoCluster) {
					t.Fatalf("cluster command on the embedded store: %v, want ErrNoCluster", err)
				}
			}
			to := filepath.Join(t.TempDir(), "backup.db")
			b, err := a.Backup(ctx, to)
			if err != nil || b.Bytes == 0 {
				t.Fatalf("backup: %+v %v", b, err)
			}
			// Every message body is in it: only the owner reads it, and
			// nothing is left beside it.
			if fi, err := os.Stat(to); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("backup file mode %v (%v), want 0600", fi.Mode().Perm(), err)
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(to), ".sequencer-backup-*")); len(left) != 0 {
				t.Fatalf("backup left %v behind", left)
			}
			if _, err := a.Backup(ctx, to); err == nil {
				t.Fatal("backup over an existing file did not fail")
			}
			restored := openAdmin(t, "sqlite:"+to)
			if h, _ := restored.Head(ctx, "g:a"); h.Head != 3 || h.FirstStored != 3 {
				t.Fatalf("head in the backup: %+v", h)
			}
		})
	}
}

// TestMigrateStatusPending: a store nobody migrated lists every migration
// pending, and admin never migrates it.
func TestMigrateStatusPending(t *testing.T) {
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			spec := pgtest.NewDatabase(t)
			if kind == "sqlite" {
				spec = "sqlite:" + filepath.Join(t.TempDir(), "empty.db")
				st, err := open.Store(ctx, spec, open.Options{NoMigrate: true})
				if err != nil {
					t.Fatal(err)
				}
				st.Close()
			}
			a := openAdmin(t, spec)
			for range 2 {
				ms, err := a.MigrateStatus(ctx)
				if err != nil || ms.UpToDate || ms.Applied != 0 || len(ms.Migrations) == 0 {
					t.Fatalf("migrate status of an empty store: %+v %v", ms, err)
				}
				for _, m := range ms.Migrations {
					if m.State != "pending" {
						t.Fatalf("migration %+v", m)
					}
				}
			}
		})
	}
}

func TestOpenRefusesMissingEmbeddedStore(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nothing", "seq.db")
	if _, err := Open(ctx, "sqlite:"+p, Options{}); err == nil {
		t.Fatal("admin opened (created) a store that did not exist")
	}
}

// TestDrainWait: drain --wait returns once the node removed its row, and
// says so when the node id came back as a new incarnation (not drained).
func TestDrainWait(t *testing.T) {
	spec, st := migrated(t, "postgres")
	cs := st.(*postgres.Store).Cluster()
	a := openAdmin(t, spec)
	// node plays a node that leaves when it sees its row marked leaving, or
	// (inc2 set) is restarted by a supervisor as incarnation inc2.
	node := func(m membership.Member, inc2 string) chan error {
		done := make(chan error, 1)
		go func() {
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				v, err := cs.Heartbeat(ctx, m.NodeID, m.Incarnation, time.Minute)
				if err != nil {
					done <- err
					return
				}
				if me, _ := v.Member(m.NodeID); me.Leaving {
					if inc2 == "" {
						done <- cs.Remove(ctx, m.NodeID, m.Incarnation)
						return
					}
					// A restarted process takes the row over in one step.
					m2 := m
					m2.Incarnation = inc2
					_, err := cs.Join(ctx, m2, time.Minute, true)
					done <- err
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			done <- errors.New("no drain request seen")
		}()
		return done
	}
	m := member("n5")
	if _, err := cs.Join(ctx, m, time.Minute, false); err != nil {
		t.Fatal(err)
	}
	done := node(m, "")
	d, err := a.Drain(ctx, "n5", 20*time.Second)
	if err != nil || !d.Left || d.Rejoined != "" {
		t.Fatalf("drain --wait: %+v %v", d, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Join(ctx, m, time.Minute, false); err != nil {
		t.Fatal(err)
	}
	done = node(m, "n5/0002")
	d, err = a.Drain(ctx, "n5", 20*time.Second)
	if err != nil || !d.Left || d.Rejoined != "n5/0002" {
		t.Fatalf("drain --wait of a node that came back: %+v %v", d, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var js Drained
	if table := rendered(t, d, &js); !strings.Contains(table, "not drained") || js.Rejoined != "n5/0002" {
		t.Fatalf("drain output:\n%s", table)
	}
}
