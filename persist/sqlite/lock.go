package sqlite

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// The database file is owned by one process: Open takes an exclusive,
// non-blocking lock on PATH.lock (beside the database file) and writes the
// holder (pid, node id, start time) into it; Close releases it. A second
// Open on the same file fails at once with ErrLocked, naming the holder. The
// kernel drops the lock when the process dies (kill -9 included), so a stale
// lock file never blocks a restart.

// ErrLocked is the error of Open when another process (or another Store in
// this process) holds the database file.
var ErrLocked = errors.New("sqlite: the database is in use")

// LockFile is the lock's file name for a database file.
func LockFile(dbPath string) string { return dbPath + ".lock" }

type dirLock struct{ f *os.File }

// lockDB takes the lock of dbPath for holder (a node id; may be empty).
func lockDB(dbPath, holder string) (*dirLock, error) {
	name := LockFile(dbPath)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlite: lock %s: %w", name, err)
	}
	if err := tryLock(f); err != nil {
		who, _ := os.ReadFile(name)
		f.Close()
		if errors.Is(err, errWouldBlock) {
			desc := strings.TrimSpace(string(who))
			if desc == "" {
				desc = "unknown holder"
			}
			return nil, fmt.Errorf("%w: %s is locked by %s; stop that process or use another --store", ErrLocked, name, desc)
		}
		return nil, fmt.Errorf("sqlite: lock %s: %w", name, err)
	}
	_ = f.Chmod(0o600)
	if holder == "" {
		holder = "-"
	}
	info := fmt.Sprintf("pid %d node %s since %s\n", os.Getpid(), holder, time.Now().UTC().Format(time.RFC3339))
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(info), 0)
		_ = f.Sync()
	}
	return &dirLock{f: f}, nil
}

// release drops the lock (the file stays: removing it would race with a
// process about to lock it).
func (l *dirLock) release() error {
	if l == nil || l.f == nil {
		return nil
	}
	_ = l.f.Truncate(0)
	err := l.f.Close() // closing the descriptor releases the flock
	l.f = nil
	return err
}
