package sqlite

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// The writer's -wal writes are gathered in memory; when Commit returns, the
// whole transaction is in the file: the WAL holds whole frames and its last
// one is a commit frame (a database size in its header), as a reader with
// its own file descriptor, or recovery after a crash, needs.
func TestWALHoldsEveryCommitWhenCommitReturns(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	var pageSize int64
	if err := s.w.QueryRowContext(ctx, "PRAGMA page_size").Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	frame := 24 + pageSize
	wal := s.Path() + "-wal"
	last := int64(0)
	for i := range 20 {
		// 1 to about 400 rows: commits of a few frames and of more than
		// the gathering buffer holds.
		n := 1 + i*i
		if err := s.Commit(ctx, manyRows(fmt.Sprintf("c%d", i), n, 1, uint64(1+i*1000))); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(wal)
		if err != nil {
			t.Fatal(err)
		}
		size := int64(len(raw))
		if (size-32)%frame != 0 || size <= last {
			t.Fatalf("commit %d (%d rows): -wal is %d bytes (was %d), not 32 + whole %d-byte frames more than before", i, n, size, last, frame)
		}
		if dbSize := binary.BigEndian.Uint32(raw[size-frame+4:]); dbSize == 0 {
			t.Fatalf("commit %d: the last frame in the -wal file is not a commit frame", i)
		}
		last = size
		walBuf.mu.Lock()
		open := len(walBuf.files)
		walBuf.mu.Unlock()
		if open == 0 {
			t.Fatal("the writer's -wal file is not open through " + walBufVFS)
		}
		// Another connection (the read pool, unix VFS) sees the rows.
		if h, err := s.LoadHead(ctx, fmt.Sprintf("c%d-%d", i, n-1)); err != nil || h != 1 {
			t.Fatalf("commit %d: head read by the pool = %d, %v", i, h, err)
		}
	}
}

// A transaction larger than the page cache writes frames before COMMIT
// (spills) and reads them back; a rolled back one leaves frames the next
// commit overwrites. Both go through the gathering buffer.
func TestWALBufferSpillAndRollback(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	conn, err := s.w.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "PRAGMA cache_size = 20"); err != nil { // pages
		t.Fatal(err)
	}
	conn.Close()
	// Rolled back: a key of a stored row, after many rows were written.
	if err := s.Commit(ctx, manyRows("a", 300, 1, 1)); err != nil {
		t.Fatal(err)
	}
	bad := manyRows("b", 300, 1, 1000)
	bad[299].Messages[0].MsgID = 5 // taken by a-4
	if err := s.Commit(ctx, bad); err == nil {
		t.Fatal("commit reusing a stored msg_id succeeded")
	}
	if err := s.Commit(ctx, manyRows("c", 300, 1, 2000)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openAt(t, s.Path())
	for _, c := range []struct {
		conv string
		head uint64
	}{{"a-0", 1}, {"a-299", 1}, {"b-0", 0}, {"b-299", 0}, {"c-0", 1}, {"c-299", 1}} {
		if h, err := s2.LoadHead(ctx, c.conv); err != nil || h != c.head {
			t.Fatalf("%s: head %d, %v; want %d", c.conv, h, err, c.head)
		}
	}
	var n int
	if err := s2.r.QueryRowContext(ctx, "SELECT count(*) FROM im_message").Scan(&n); err != nil || n != 600 {
		t.Fatalf("%d rows, %v; want 600", n, err)
	}
	var check string
	if err := s2.r.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check: %q, %v", check, err)
	}
}

// Inside a transaction larger than the page cache, SQLite writes pages to
// the WAL before COMMIT and reads them back (some still in the gathering
// buffer); a rolled back transaction's frames are overwritten by the next.
func TestWALBufferReadsBackSpilledPages(t *testing.T) {
	if err := registerWALBufVFS(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "spill.db")
	db, err := sql.Open("sqlite", "file:"+path+"?vfs="+walBufVFS+"&_pragma=journal_mode(WAL)&_pragma=cache_size(10)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB, w TEXT UNIQUE)"); err != nil {
		t.Fatal(err)
	}
	fill := func(tx *sql.Tx, from, n int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			if _, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (?, ?, ?)", i, []byte(strings.Repeat("v", 300)), fmt.Sprintf("w%07d", i*7919%100003)); err != nil {
				t.Fatal(err)
			}
		}
	}
	sum := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) (n, total int) {
		t.Helper()
		if err := q.QueryRowContext(ctx, "SELECT count(*), coalesce(sum(length(v)), 0) FROM t WHERE w > ''").Scan(&n, &total); err != nil {
			t.Fatal(err)
		}
		return n, total
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	fill(tx, 0, 2000)
	if n, total := sum(tx); n != 2000 || total != 600000 {
		t.Fatalf("inside the transaction: %d rows, %d bytes", n, total)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	fill(tx, 5000, 1500)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n, total := sum(db); n != 1500 || total != 450000 {
		t.Fatalf("after commit: %d rows, %d bytes", n, total)
	}
	var check string
	if err := db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check: %q, %v", check, err)
	}
}

const crashChildEnv = "SEQUENCER_SQLITE_CRASH_CHILD"

// kill -9 of a process committing from several goroutines (group commits,
// gathered WAL writes): after reopening, every commit it acknowledged is
// stored, and every conversation's rows are 1..head.
func TestKill9LosesNoAckedCommit(t *testing.T) {
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(path)
		return
	}
	if testing.Short() {
		t.Skip("starts a child process")
	}
	path := filepath.Join(t.TempDir(), "sequencer.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKill9LosesNoAckedCommit$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := map[string]uint64{} // conversation -> highest acknowledged seq
	rows := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() && rows < 8000 {
		conv, seq, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		n, _ := strconv.ParseUint(seq, 10, 64)
		acked[conv] = max(acked[conv], n)
		rows++
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if rows < 8000 {
		t.Fatalf("the child acknowledged %d rows, then stopped (%v)", rows, sc.Err())
	}
	s := openAt(t, path)
	ctx := context.Background()
	for conv, seq := range acked {
		h, err := s.LoadHead(ctx, conv)
		if err != nil || h < seq {
			t.Fatalf("%s: head %d, %v after kill -9; %d was acknowledged", conv, h, err, seq)
		}
		msgs, err := s.ReadRange(ctx, conv, 0, int(h)+1)
		if err != nil || len(msgs) != int(h) {
			t.Fatalf("%s: %d rows for head %d, %v", conv, len(msgs), h, err)
		}
		for i, m := range msgs {
			if m.Seq != uint64(i+1) || m.ClientMsgID != fmt.Sprintf("%s-%d", conv, m.Seq) {
				t.Fatalf("%s: row %d is %+v", conv, i, m)
			}
		}
	}
	var check string
	if err := s.r.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check: %q, %v", check, err)
	}
	t.Logf("%d acknowledged rows in %d conversations survived", rows, len(acked))
}

// crashChild commits until it is killed: 8 goroutines, each with its own 50
// conversations, 50-row commits; "conv seq" on stdout for every row of a
// commit that returned nil.
func crashChild(path string) {
	ctx := context.Background()
	s, err := Open(ctx, path, Options{})
	if err == nil {
		err = s.Migrate(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var mu sync.Mutex
	w := bufio.NewWriter(os.Stdout)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := uint64(1); ; seq++ {
				bs := make([]persist.ConvBatch, 50)
				for i := range bs {
					conv := fmt.Sprintf("g%d-%d", g, i)
					bs[i] = persist.ConvBatch{ConvID: conv, PrevHead: seq - 1, Messages: []sequencer.Message{{
						MsgID: uint64(g)<<40 | seq<<8 | uint64(i), ConvID: conv, Seq: seq, FromUID: uint64(g + 1),
						MsgType: 1, Body: []byte("x"), ClientMsgID: fmt.Sprintf("%s-%d", conv, seq), ServerAt: time.UnixMilli(1)}}}
				}
				if err := s.Commit(ctx, bs); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				mu.Lock()
				for _, b := range bs {
					fmt.Fprintf(w, "%s %d\n", b.ConvID, seq)
				}
				w.Flush()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}
