// Package tmpfs gives tests a small file system of their own to fill: a
// tmpfs mounted on a fresh directory (the disk-full tests of persist/sqlite
// and e2e). It never touches a mount it did not make.
package tmpfs

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// RequiredEnv set (as .ci/run does), or CI=true, makes Mount fail the test,
// not skip it, when no tmpfs can be mounted.
const RequiredEnv = "SEQUENCER_TEST_DISKFULL_REQUIRED"

// Mount mounts a tmpfs of size bytes on a fresh directory and unmounts it
// when the test ends. Mounting needs root (CAP_SYS_ADMIN): where it fails,
// the test is skipped with the reason, or fails under CI=true or
// RequiredEnv.
func Mount(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("tmpfs: cannot mount a %d-byte tmpfs on %s (needs root): %v %s", size, dir, err, strings.TrimSpace(string(out)))
		if os.Getenv("CI") == "true" || os.Getenv(RequiredEnv) != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	// Registered after TempDir's cleanup, so it runs first (cleanups run
	// last in, first out): the directory is removed once unmounted.
	t.Cleanup(func() {
		out, err := exec.Command("umount", dir).CombinedOutput()
		if err == nil {
			return
		}
		// Something still holds a file there: detach it anyway, and say so.
		t.Errorf("tmpfs: umount %s: %v %s", dir, err, strings.TrimSpace(string(out)))
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("tmpfs: umount -l %s: %v %s", dir, err, strings.TrimSpace(string(out)))
		}
	})
	return dir
}

// Free is what the file system holding dir has left for an unprivileged
// writer, in bytes.
func Free(t testing.TB, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// Fill writes a file of n bytes at path (a ballast that a test removes to
// free the space again).
func Fill(t testing.TB, path string, n int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := f.Write(buf[:k]); err != nil {
			f.Close()
			t.Fatalf("tmpfs: ballast %s: %v", path, err)
		}
		n -= k
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// Remove removes the ballast at path.
func Remove(t testing.TB, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}
