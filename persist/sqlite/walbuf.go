package sqlite

import (
	"errors"
	"sync"
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// The writer connection opens its file through walBufVFS: SQLite's own unix
// VFS, except that the writes to the -wal file are gathered in memory and
// reach the file in pwrite calls of up to 128 KiB instead of two per page
// (SQLite writes each WAL frame as a 24-byte header and then the page; with
// random index inserts a commit writes about 2.4 frames per row, and those
// small pwrite calls were 20-30% of the writer's CPU).
//
// What SQLite sees is unchanged: every write lands in the file, in order,
// before anything could read it or depend on it being there. The gathered
// bytes are written (flush) before
//   - a sync (xSync): a commit is synced before SQLite publishes it in the
//     WAL index, so what it syncs is the whole transaction;
//   - the end of a commit frame (a frame header with a database size, then
//     its page), so a commit is in the file before it is published even
//     without a sync;
//   - a read, truncate, size query or file control of the -wal file, and its
//     close;
//   - a write that does not continue the gathered bytes (SQLite rewrites a
//     frame of the open transaction in place), or that would not fit.
//
// A crash loses only gathered bytes that no sync has covered: frames of a
// transaction that had not committed, which WAL recovery ignores anyway.
// The database file, the -shm file and every other connection's files go
// through the unix VFS untouched.
const walBufVFS = "sequencer-walbuf"

// walBufSize is the most bytes gathered per -wal file: the most the unix
// VFS writes in one call (its seekAndWrite masks the length with 0x1ffff),
// about 31 frames of 4 KiB pages.
const walBufSize = 0x1ffff

// walFile is the state of one open -wal file.
type walFile struct {
	orig   uintptr // the file's own io_methods (unix)
	buf    uintptr // walBufSize bytes of libc memory
	start  int64   // file offset of buf[0]
	n      int64   // bytes gathered
	commit bool    // the last write was a commit frame's header: flush after its page
}

var walBuf struct {
	once sync.Once
	err  error
	open uintptr // the unix VFS's xOpen

	mu      sync.Mutex
	methods map[uintptr]uintptr  // a file's own io_methods -> ours
	files   map[uintptr]*walFile // open -wal files by sqlite3_file
}

// registerWALBufVFS registers walBufVFS once per process.
func registerWALBufVFS() error {
	walBuf.once.Do(func() {
		tls := libc.NewTLS()
		defer tls.Close()
		unix := sqlite3.Xsqlite3_vfs_find(tls, 0)
		if unix == 0 {
			walBuf.err = errors.New("sqlite: no default VFS")
			return
		}
		name, err := libc.CString(walBufVFS)
		if err != nil {
			walBuf.err = err
			return
		}
		p := libc.Xcalloc(tls, 1, uint64(unsafe.Sizeof(sqlite3.Tsqlite3_vfs{})))
		if p == 0 {
			walBuf.err = errors.New("sqlite: out of memory")
			return
		}
		v := (*sqlite3.Tsqlite3_vfs)(cptr(p))
		*v = *(*sqlite3.Tsqlite3_vfs)(cptr(unix))
		v.FpNext = 0
		v.FzName = name
		walBuf.open = v.FxOpen
		v.FxOpen = cfunc(walBufOpen)
		walBuf.methods = map[uintptr]uintptr{}
		walBuf.files = map[uintptr]*walFile{}
		if rc := sqlite3.Xsqlite3_vfs_register(tls, p, 0); rc != sqlite3.SQLITE_OK {
			walBuf.err = errors.New("sqlite: register VFS " + walBufVFS)
		}
	})
	return walBuf.err
}

// cfunc is the C function pointer of a Go function (as modernc.org/sqlite
// makes them: a pointer to the function value, which lives in read-only
// data). f must be a top-level function, not a closure.
func cfunc[T any](f T) uintptr { return *(*uintptr)(unsafe.Pointer(&struct{ f T }{f})) }

// cptr is the pointer to C memory (libc's, never Go's heap) at p.
func cptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// gofunc is the Go function behind a C function pointer of type T.
func gofunc[T any](p uintptr) T { return *(*T)(unsafe.Pointer(&struct{ uintptr }{p})) }

type (
	xOpenFn     = func(*libc.TLS, uintptr, uintptr, uintptr, int32, uintptr) int32
	xCloseFn    = func(*libc.TLS, uintptr) int32
	xRWFn       = func(*libc.TLS, uintptr, uintptr, int32, int64) int32
	xTruncateFn = func(*libc.TLS, uintptr, int64) int32
	xSyncFn     = func(*libc.TLS, uintptr, int32) int32
	xFileSizeFn = func(*libc.TLS, uintptr, uintptr) int32
	xFileCtrlFn = func(*libc.TLS, uintptr, int32, uintptr) int32
	ioMethods   = sqlite3.Tsqlite3_io_methods
	sqlite3File = sqlite3.Tsqlite3_file
)

func methodsOf(f *walFile) *ioMethods { return (*ioMethods)(cptr(f.orig)) }

// walBufOpen is the VFS's xOpen: the unix xOpen, then, for a -wal file, our
// io_methods in place of its own.
func walBufOpen(tls *libc.TLS, vfs, name, file uintptr, flags int32, outFlags uintptr) int32 {
	rc := gofunc[xOpenFn](walBuf.open)(tls, vfs, name, file, flags, outFlags)
	if rc != sqlite3.SQLITE_OK || flags&sqlite3.SQLITE_OPEN_WAL == 0 {
		return rc
	}
	f := (*sqlite3File)(cptr(file))
	if f.FpMethods == 0 {
		return rc
	}
	buf := libc.Xmalloc(tls, walBufSize)
	if buf == 0 {
		return rc // no buffer: the file stays as unix made it
	}
	walBuf.mu.Lock()
	defer walBuf.mu.Unlock()
	ours, ok := walBuf.methods[f.FpMethods]
	if !ok {
		ours = libc.Xcalloc(tls, 1, uint64(unsafe.Sizeof(ioMethods{})))
		if ours == 0 {
			libc.Xfree(tls, buf)
			return rc
		}
		m := (*ioMethods)(cptr(ours))
		*m = *(*ioMethods)(cptr(f.FpMethods))
		m.FxClose = cfunc(walBufClose)
		m.FxRead = cfunc(walBufRead)
		m.FxWrite = cfunc(walBufWrite)
		m.FxTruncate = cfunc(walBufTruncate)
		m.FxSync = cfunc(walBufSync)
		m.FxFileSize = cfunc(walBufFileSize)
		m.FxFileControl = cfunc(walBufFileControl)
		walBuf.methods[f.FpMethods] = ours
	}
	walBuf.files[file] = &walFile{orig: f.FpMethods, buf: buf}
	f.FpMethods = ours
	return rc
}

func walFileOf(file uintptr) *walFile {
	walBuf.mu.Lock()
	defer walBuf.mu.Unlock()
	return walBuf.files[file]
}

// flush writes the gathered bytes with the file's own xWrite.
func (f *walFile) flush(tls *libc.TLS, file uintptr) int32 {
	f.commit = false
	if f.n == 0 {
		return sqlite3.SQLITE_OK
	}
	n, start := f.n, f.start
	f.n = 0
	return gofunc[xRWFn](methodsOf(f).FxWrite)(tls, file, f.buf, int32(n), start)
}

func walBufWrite(tls *libc.TLS, file, data uintptr, amt int32, off int64) int32 {
	f := walFileOf(file)
	if f.n > 0 && off != f.start+f.n || f.n+int64(amt) > walBufSize {
		if rc := f.flush(tls, file); rc != sqlite3.SQLITE_OK {
			return rc
		}
	}
	if int64(amt) > walBufSize {
		return gofunc[xRWFn](methodsOf(f).FxWrite)(tls, file, data, amt, off)
	}
	if f.n == 0 {
		f.start = off
	}
	copy(unsafe.Slice((*byte)(cptr(f.buf+uintptr(f.n))), amt), unsafe.Slice((*byte)(cptr(data)), amt))
	f.n += int64(amt)
	if f.commit {
		return f.flush(tls, file) // the commit frame's page: the transaction is whole
	}
	// A frame header (24 bytes after the 32-byte WAL header) whose second
	// word, the database size, is not zero starts a commit frame.
	if amt == 24 && off >= 32 {
		h := unsafe.Slice((*byte)(cptr(data)), 8)
		f.commit = h[4]|h[5]|h[6]|h[7] != 0
	}
	return sqlite3.SQLITE_OK
}

func walBufRead(tls *libc.TLS, file, data uintptr, amt int32, off int64) int32 {
	f := walFileOf(file)
	if rc := f.flush(tls, file); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return gofunc[xRWFn](methodsOf(f).FxRead)(tls, file, data, amt, off)
}

func walBufTruncate(tls *libc.TLS, file uintptr, size int64) int32 {
	f := walFileOf(file)
	if rc := f.flush(tls, file); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return gofunc[xTruncateFn](methodsOf(f).FxTruncate)(tls, file, size)
}

func walBufSync(tls *libc.TLS, file uintptr, flags int32) int32 {
	f := walFileOf(file)
	if rc := f.flush(tls, file); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return gofunc[xSyncFn](methodsOf(f).FxSync)(tls, file, flags)
}

func walBufFileSize(tls *libc.TLS, file, size uintptr) int32 {
	f := walFileOf(file)
	if rc := f.flush(tls, file); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return gofunc[xFileSizeFn](methodsOf(f).FxFileSize)(tls, file, size)
}

func walBufFileControl(tls *libc.TLS, file uintptr, op int32, arg uintptr) int32 {
	f := walFileOf(file)
	if rc := f.flush(tls, file); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return gofunc[xFileCtrlFn](methodsOf(f).FxFileControl)(tls, file, op, arg)
}

func walBufClose(tls *libc.TLS, file uintptr) int32 {
	f := walFileOf(file)
	rc := f.flush(tls, file)
	orig := f.orig
	walBuf.mu.Lock()
	delete(walBuf.files, file)
	walBuf.mu.Unlock()
	libc.Xfree(tls, f.buf)
	(*sqlite3File)(cptr(file)).FpMethods = orig
	if rc2 := gofunc[xCloseFn]((*ioMethods)(cptr(orig)).FxClose)(tls, file); rc == sqlite3.SQLITE_OK {
		rc = rc2
	}
	return rc
}
