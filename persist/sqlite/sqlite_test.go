package sqlite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/persist/storetest"
)

// Test-only hooks for the conformance suite.
var _ storetest.Hooks = (*Store)(nil)

func (s *Store) PutPartitionLeaseForTest(ctx context.Context, f persist.Fence) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO partition_lease (partition, owner, epoch) VALUES (?, ?, ?)
		ON CONFLICT (partition) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch`,
		int64(f.Partition), f.Owner, int64(f.Epoch))
	return err
}

func (s *Store) SetHeadForTest(ctx context.Context, convID string, head uint64) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO conv_head (conv_id, head) VALUES (?, ?)
		ON CONFLICT (conv_id) DO UPDATE SET head = excluded.head`, convID, int64(head))
	return err
}

func openAt(t testing.TB, path string) *Store {
	t.Helper()
	s, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s
}

func newStore(t testing.TB) *Store {
	return openAt(t, filepath.Join(t.TempDir(), "sequencer.db"))
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) persist.Store { return newStore(t) })
}

func TestOpenCreatesDirectoryAndUsesWALFull(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b c", "what?#%", "sequencer.db")
	s := openAt(t, path)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database file not created at %s: %v", path, err)
	}
	ctx := context.Background()
	var mode string
	var sync, busy int
	if err := s.w.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q, %v", mode, err)
	}
	if err := s.w.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil || sync != 2 {
		t.Fatalf("synchronous = %d (want 2 = FULL), %v", sync, err)
	}
	if err := s.w.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil || busy != 5000 {
		t.Fatalf("busy_timeout = %d, %v", busy, err)
	}
	// The writer's performance settings (README "Writer settings").
	for _, p := range []struct {
		pragma string
		want   int
	}{{"temp_store", 2 /* MEMORY */}, {"cache_size", -writerCacheKiB}, {"wal_autocheckpoint", walCheckpointPages}} {
		var got int
		if err := s.w.QueryRowContext(ctx, "PRAGMA "+p.pragma).Scan(&got); err != nil || got != p.want {
			t.Fatalf("%s = %d (want %d), %v", p.pragma, got, p.want, err)
		}
	}
	if s.Path() != path {
		t.Fatalf("Path() = %q, want %q", s.Path(), path)
	}
}

func TestSchemaMirrorsContract(t *testing.T) {
	s := newStore(t)
	var ddl string
	if err := s.r.QueryRow(`SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'im_message'`).Scan(&ddl); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"msg_id", "conv_id", "seq", "from_uid", "msg_type", "body", "client_msg_id", "server_at",
		"PRIMARY KEY (msg_id)", "CONSTRAINT uk_conv_seq    UNIQUE (conv_id, seq)", "CONSTRAINT uk_from_client UNIQUE (from_uid, client_msg_id)"} {
		if !strings.Contains(ddl, want) {
			t.Fatalf("im_message DDL lacks %q:\n%s", want, ddl)
		}
	}
	for _, table := range []string{"conv_head", "worker_lease", "partition_lease", "schema_version", "read_position"} {
		var n int
		if err := s.r.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, table).Scan(&n); err != nil || n != 1 {
			t.Fatalf("table %s: %d, %v", table, n, err)
		}
	}
}

func TestReopenKeepsEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sequencer.db")
	ctx := context.Background()
	s, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b := persist.ConvBatch{ConvID: "c", Messages: []sequencer.Message{{MsgID: 9, ConvID: "c", Seq: 1, FromUID: 1,
		MsgType: 1, Body: []byte("hi"), ClientMsgID: "k", ServerAt: time.UnixMilli(1234567).UTC()}}}
	if err := s.Commit(ctx, []persist.ConvBatch{b}); err != nil {
		t.Fatal(err)
	}
	if err := s.Trim(ctx, "c", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MarkRead(ctx, "c", 5, 1); err != nil {
		t.Fatal(err)
	}
	lease, err := s.AcquireWorker(ctx, "n", time.UnixMilli(1000), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RenewWorker(ctx, lease, 77, time.UnixMilli(2000), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openAt(t, path)
	if h, err := s2.LoadHead(ctx, "c"); err != nil || h != 1 {
		t.Fatalf("head after reopen = %d, %v", h, err)
	}
	if rs, err := s2.ReadStates(ctx, 5, []string{"c"}); err != nil || rs[0].ReadSeq != 1 || rs[0].Head != 1 {
		t.Fatalf("read state after reopen = %+v, %v", rs, err)
	}
	if v, err := s2.SchemaVersion(ctx); err != nil || v < 1 {
		t.Fatalf("schema version %d, %v", v, err)
	}
	if _, err := s2.RenewWorker(ctx, lease, 80, time.UnixMilli(3000), time.Minute); err != nil {
		t.Fatalf("lease lost over a reopen: %v", err)
	}
}

// One process owns the file: a second Open (flock is per open file
// description, so a second Open in this process stands for a second
// process) is refused at once and names the holder; after Close the file
// opens again. The directory Open creates is 0700, the files 0600.
func TestSecondOpenIsRefusedAndNamesTheHolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	path := filepath.Join(dir, "sequencer.db")
	ctx := context.Background()
	s1, err := Open(ctx, path, Options{LockHolder: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, path, Options{LockHolder: "node-b"})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d node node-a", os.Getpid())) {
		t.Fatalf("second open: %v, want ErrLocked naming pid %d node node-a", err, os.Getpid())
	}
	for name, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, path: 0o600, path + "-wal": 0o600, LockFile(path): 0o600} {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, path, Options{LockHolder: "node-b"})
	if err != nil {
		t.Fatalf("open after the holder closed: %v", err)
	}
	defer s2.Close()
	who, _ := os.ReadFile(LockFile(path))
	if !strings.Contains(string(who), "node node-b") {
		t.Fatalf("lock file holds %q, want node-b", who)
	}
}

func TestCommitCanceledBeforeIsUnavailable(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := persist.ConvBatch{ConvID: "c", Messages: []sequencer.Message{{MsgID: 1, ConvID: "c", Seq: 1, FromUID: 1,
		MsgType: 1, ClientMsgID: "k"}}}
	err := s.Commit(ctx, []persist.ConvBatch{b})
	if !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("commit with a done context: %v, want ErrStoreUnavailable", err)
	}
	if h, err := s.LoadHead(context.Background(), "c"); err != nil || h != 0 {
		t.Fatalf("head = %d, %v", h, err)
	}
}

func TestClosedStoreIsUnavailable(t *testing.T) {
	s := newStore(t)
	s.Close()
	ctx := context.Background()
	if err := s.Ping(ctx); !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("Ping on a closed store: %v", err)
	}
	if _, err := s.LoadHead(ctx, "c"); !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("LoadHead on a closed store: %v", err)
	}
	b := persist.ConvBatch{ConvID: "c", Messages: []sequencer.Message{{MsgID: 1, ConvID: "c", Seq: 1, FromUID: 1,
		MsgType: 1, ClientMsgID: "k"}}}
	if err := s.Commit(ctx, []persist.ConvBatch{b}); !errors.Is(err, sequencer.ErrStoreUnavailable) {
		t.Fatalf("Commit on a closed store: %v", err)
	}
}

// Commits of every shape of row count (full 200-row chunks, the prepared
// power-of-two tails and their sums) store exactly their rows.
func TestCommitRowCountsAcrossInsertStatements(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	var id uint64
	for i, rows := range []int{1, 2, 3, 7, 127, 128, 129, 199, 200, 201, 255, 399, 400, 455} {
		conv := fmt.Sprintf("rows:%d", i)
		b := persist.ConvBatch{ConvID: conv}
		for j := range rows {
			id++
			b.Messages = append(b.Messages, sequencer.Message{MsgID: id, ConvID: conv, Seq: uint64(j + 1), FromUID: 7,
				MsgType: 1, Body: []byte{byte(j)}, ClientMsgID: fmt.Sprintf("k%d", id), ServerAt: time.UnixMilli(1_700_000_000_000)})
		}
		if err := s.Commit(ctx, []persist.ConvBatch{b}); err != nil {
			t.Fatalf("%d rows: %v", rows, err)
		}
		got, err := s.ReadRange(ctx, conv, 0, 1000)
		if err != nil || len(got) != rows {
			t.Fatalf("%d rows committed, %d read back, %v", rows, len(got), err)
		}
		for j, m := range got {
			if m.Seq != uint64(j+1) || m.MsgID != b.Messages[j].MsgID || m.Body[0] != byte(j) || m.ClientMsgID != b.Messages[j].ClientMsgID {
				t.Fatalf("%d rows: row %d is %+v, want %+v", rows, j, m, b.Messages[j])
			}
		}
		if head, err := s.LoadHead(ctx, conv); err != nil || head != uint64(rows) {
			t.Fatalf("%d rows: head %d, %v", rows, head, err)
		}
	}
	// A conflict in a tail statement is still a conflict of that row.
	dup := persist.ConvBatch{ConvID: "rows:dup"}
	for j := range 131 {
		key := fmt.Sprintf("d%d", j)
		if j == 130 {
			key = "k1" // from_uid 7's first key above: uk_from_client
		}
		dup.Messages = append(dup.Messages, sequencer.Message{MsgID: 1_000_000 + uint64(j), ConvID: "rows:dup", Seq: uint64(j + 1),
			FromUID: 7, MsgType: 1, Body: []byte{1}, ClientMsgID: key, ServerAt: time.UnixMilli(1_700_000_000_000)})
	}
	err := s.Commit(ctx, []persist.ConvBatch{dup})
	var ce *persist.ConflictError
	if !errors.As(err, &ce) || len(ce.Conflicts) != 1 || ce.Conflicts[0].ClientMsgID != "k1" {
		t.Fatalf("commit with a taken key: %v", err)
	}
	if head, _ := s.LoadHead(ctx, "rows:dup"); head != 0 {
		t.Fatalf("refused commit moved the head to %d", head)
	}
	s.insMu.Lock()
	defer s.insMu.Unlock()
	if len(s.ins) != 9 {
		t.Fatalf("%d prepared INSERTs, want 9: the commits above did not use them", len(s.ins))
	}
}

// The store's ping answers while every read connection is taken
// (storetest.PingWithReadsHeld).
func TestPingWithEveryReadConnectionTaken(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "sequencer.db"), Options{ReadConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	storetest.PingWithReadsHeld(t, s, s.r)
}
