//go:build unix

package sqlite

import (
	"errors"
	"os"
	"syscall"
)

var errWouldBlock = syscall.EWOULDBLOCK

// tryLock takes flock(LOCK_EX|LOCK_NB) on f: per open file description, so
// two Opens in one process exclude each other as two processes do.
func tryLock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
