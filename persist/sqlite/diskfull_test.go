package sqlite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/tmpfs"
	"github.com/sequencer-im/sequencer/persist"
)

// A store on a file system that fills up: the commit that finds no space
// fails retryably and says why (code unavailable, "store out of disk space",
// nothing written), Ping reports it meanwhile, a checkpoint fails without
// harm (the -wal file keeps every commit), reads go on; once space is back
// the same store commits again, without a restart. Closed on a full file
// system (its last checkpoint cannot run) and reopened once space is back,
// it has every committed row and the file is intact.
func TestDiskFull(t *testing.T) {
	dir := tmpfs.Mount(t, 8<<20)
	path := filepath.Join(dir, "sequencer.db")
	s, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	first, closed := s, false
	t.Cleanup(func() {
		if !closed {
			first.Close()
		}
	})
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ballast := filepath.Join(dir, "ballast")
	tmpfs.Fill(t, ballast, tmpfs.Free(t, dir)-512<<10)

	var failed error
	var batch []persist.ConvBatch
	for seq := uint64(1); seq < 2000 && failed == nil; seq++ {
		batch = manyRows("full", 50, seq, seq<<20)
		failed = s.Commit(ctx, batch)
	}
	if failed == nil {
		t.Fatal("2000 commits of 50 rows fitted in 512 KiB")
	}
	if code := sequencer.ErrorCode(failed); code != sequencer.CodeUnavailable {
		t.Fatalf("commit on a full disk: code %s (%v), want unavailable", code, failed)
	}
	var se *sequencer.Error
	if !errors.As(failed, &se) || se.Msg != errDiskFull.Msg {
		t.Fatalf("commit on a full disk says %v; want the domain reason %q first", failed, errDiskFull.Msg)
	}
	if persist.OutcomeOf(failed) != persist.NotLanded {
		t.Fatalf("commit on a full disk: outcome %v, want not landed: %v", persist.OutcomeOf(failed), failed)
	}
	seq := batch[0].Messages[0].Seq
	heads := func(s *Store, want uint64) {
		t.Helper()
		for _, b := range batch {
			if head, err := s.LoadHead(ctx, b.ConvID); err != nil || head != want {
				t.Fatalf("%s: head %d (%v), want %d", b.ConvID, head, err, want)
			}
		}
	}
	heads(s, seq-1) // nothing of the failed commit
	if err := s.Ping(ctx); err == nil || !errors.Is(err, errDiskFull) {
		t.Fatalf("Ping on a full disk = %v, want the disk-full error", err)
	}
	// A checkpoint needs the database file to grow: it fails, and changes
	// nothing.
	var busy, logged, moved int
	if err := s.w.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logged, &moved); !isDiskFull(err) {
		t.Fatalf("checkpoint on the full file system: %v (%d of %d frames), want SQLITE_FULL", err, moved, logged)
	}
	heads(s, seq-1)

	tmpfs.Remove(t, ballast)
	if err := s.Commit(ctx, batch); err != nil {
		t.Fatalf("the same commit once space is back: %v", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping once a commit succeeded again: %v", err)
	}
	heads(s, seq)

	// Full again, then closed: the last checkpoint cannot run, the -wal
	// file stays, and a reopen once space is back recovers from it.
	tmpfs.Fill(t, ballast, tmpfs.Free(t, dir))
	closed = true
	if err := s.Close(); err != nil {
		t.Logf("Close on a full file system: %v", err)
	}
	tmpfs.Remove(t, ballast)
	s = openAt(t, path)
	heads(s, seq)
	var check string
	if err := s.r.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check: %q %v", check, err)
	}
}

// copyFile copies from to to (a crash image of a file in use).
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// crashHead is the head of convID that a recovery finds in a copy of the
// store's files taken now: what a restart after a crash at this moment
// would see.
func crashHead(t *testing.T, path, convID string) uint64 {
	t.Helper()
	img := filepath.Join(t.TempDir(), "sequencer.db")
	copyFile(t, path, img)
	copyFile(t, path+"-wal", img+"-wal")
	s := openAt(t, img)
	defer s.Close()
	h, err := s.LoadHead(context.Background(), convID)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A COMMIT that fails with SQLITE_FULL leaves nothing a recovery finds. One
// that fails after its frames were written (the file system fills between
// the -wal frames and the page the -shm file needs: the -wal file crosses
// 4,062 frames) leaves a whole commit that this process sees rolled back but
// a recovery keeps. Settle must not say "final" until a later
// transaction committed over it; before, it returned nil at once, and the
// re-read it allows answered "not stored" for rows a crash then kept.
func TestPhantomCommitIsSettled(t *testing.T) {
	dir := tmpfs.Mount(t, 24<<20)
	path := filepath.Join(dir, "sequencer.db")
	s := openAt(t, path)
	ctx := context.Background()
	walFrames := func() int64 {
		st, err := os.Stat(path + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return st.Size() / (4096 + 24)
	}
	// Grow the -wal file to a few frames short of 4,062: commits of four
	// rows (about ten frames each), then of one row (a few each).
	seq := uint64(1)
	for ; walFrames() < 4052; seq++ {
		rows := 4
		if walFrames() >= 4036 {
			rows = 1
		}
		if err := s.Commit(ctx, manyRows("grow", rows, seq, seq<<20)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("the -wal file holds %d frames", walFrames())
	if n := walFrames(); n >= 4062 {
		t.Fatalf("the -wal file grew to %d frames, past 4,062, before the test's commit", n)
	}
	// Fill the file system, then give the commit one more page per try:
	// the first that fits its frames but not the -shm page fails after
	// writing them.
	ballast := filepath.Join(dir, "ballast")
	tmpfs.Fill(t, ballast, tmpfs.Free(t, dir))
	st, err := os.Stat(ballast)
	if err != nil {
		t.Fatal(err)
	}
	var conv string
	var failed error
	for k := int64(1); k < 100; k++ {
		if err := os.Truncate(ballast, st.Size()-k*4096); err != nil {
			t.Fatal(err)
		}
		conv = fmt.Sprintf("try%d", k)
		failed = s.Commit(ctx, manyRows(conv, 60, 1, uint64(k)<<30))
		conv += "-0"
		if failed == nil {
			t.Fatalf("a commit crossing 4,062 -wal frames fitted with %d free pages: the file system did not fill between the frames and the -shm page", k)
		}
		if !isDiskFull(failed) {
			break
		}
		// SQLITE_FULL: not written, also for a recovery (the frame
		// whose write failed is at or before the commit frame).
		if persist.OutcomeOf(failed) != persist.NotLanded {
			t.Fatalf("SQLITE_FULL from COMMIT: outcome %v, want not landed (%v)", persist.OutcomeOf(failed), failed)
		}
		if h := crashHead(t, path, conv); h != 0 {
			t.Fatalf("a COMMIT that failed with SQLITE_FULL is in a crash image (%s at head %d)", conv, h)
		}
	}
	if !errors.Is(failed, sequencer.ErrUnknownOutcome) {
		t.Fatalf("no COMMIT failed after its frames (last error %v)", failed)
	}
	if h, _ := s.LoadHead(ctx, conv); h != 0 {
		t.Fatalf("this process sees %s at head %d after the failed COMMIT, want 0", conv, h)
	}
	if h := crashHead(t, path, conv); h != 1 {
		t.Fatalf("a crash image holds %s at head %d: the scenario left no whole commit behind (%v)", conv, h, failed)
	}
	// Settle may succeed at once (its one frame fits where the failed
	// commit's were) or only once space is back; either way, once it
	// returned nil no recovery may find the failed commit.
	if err := s.Settle(ctx); err != nil {
		if !errors.Is(err, sequencer.ErrStoreUnavailable) {
			t.Fatalf("Settle on a full disk: %v, want a retryable store error", err)
		}
		tmpfs.Remove(t, ballast)
		if err := s.Settle(ctx); err != nil {
			t.Fatalf("Settle with space back: %v", err)
		}
	}
	if h := crashHead(t, path, conv); h != 0 {
		t.Fatalf("Settle returned nil while a recovery still finds the failed COMMIT (%s at head %d after a crash)", conv, h)
	}
	if h, _ := s.LoadHead(ctx, conv); h != 0 {
		t.Fatalf("%s at head %d after Settle, want 0", conv, h)
	}
	if err := s.Settle(ctx); err != nil {
		t.Fatalf("a second Settle: %v", err)
	}
}
