package pgtest

import (
	"bytes"
	"context"
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

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer/persist/internal/serverproc"
)

// Node is one PostgreSQL server of a replicated set of a test's own: a
// primary (StartPrimary) or a streaming standby of one (Node.StartStandby).
// It listens on a random port of 127.0.0.1; its directory is removed when
// the test ends. Tests use it to lose a primary (Kill9) and promote a standby
// (Promote) under a running sequencer.
type Node struct {
	t     testing.TB
	mu    sync.Mutex
	bin   string
	cred  *syscall.Credential
	dir   string
	data  string
	port  int
	extra []string
	cur   *localServer
	// stopped: processes FreezeAll stopped (Thaw and Stop resume them).
	stopped []int
}

// StartPrimary initdb's and starts a server that accepts streaming
// replication (initdb's trust rules already allow replication connections
// from 127.0.0.1). settings are more server settings ("name=value", e.g.
// "synchronous_standby_names=*"). The test fails (never skips) if no
// PostgreSQL binaries are installed.
func StartPrimary(t testing.TB, settings ...string) *Node {
	t.Helper()
	n := newNode(t)
	initdb := exec.Command(filepath.Join(n.bin, "initdb"), "-D", n.data, "-U", "postgres",
		"--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir = n.dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: n.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("pgtest.StartPrimary: initdb: %v: %s", err, serverproc.LastLines(out, 10))
	}
	n.extra = append([]string{"wal_level=replica", "max_wal_senders=10", "wal_keep_size=256MB"}, settings...)
	n.startFresh()
	return n
}

// StartStandby takes a base backup of n (pg_basebackup -R, WAL streamed) and
// starts it as a hot standby streaming from n. settings are more server
// settings of the standby.
func (n *Node) StartStandby(t testing.TB, settings ...string) *Node {
	t.Helper()
	s := newNode(t)
	bb := exec.Command(filepath.Join(s.bin, "pg_basebackup"), "-D", s.data, "-R", "-X", "stream",
		"--no-sync", "-c", "fast", "-h", "127.0.0.1", "-p", fmt.Sprint(n.Port()), "-U", "postgres")
	bb.Dir = s.dir
	bb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := bb.CombinedOutput(); err != nil {
		t.Fatalf("pgtest.StartStandby: pg_basebackup: %v: %s", err, serverproc.LastLines(out, 10))
	}
	s.extra = append([]string{"hot_standby=on", "wal_level=replica", "max_wal_senders=10"}, settings...)
	s.startFresh()
	return s
}

func newNode(t testing.TB) *Node {
	t.Helper()
	bin, err := findBinDir()
	if err != nil {
		t.Fatalf("pgtest: %v; %s", err, howToGet)
	}
	if !isExec(filepath.Join(bin, "pg_basebackup")) || !isExec(filepath.Join(bin, "pg_ctl")) {
		t.Fatalf("pgtest: %s has no pg_basebackup or pg_ctl; %s", bin, howToGet)
	}
	cred, err := credential()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	dir, err := os.MkdirTemp("", "sequencer-pgrepl-")
	if err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			t.Fatal(err)
		}
	}
	n := &Node{t: t, bin: bin, cred: cred, dir: dir, data: filepath.Join(dir, "data")}
	t.Cleanup(func() {
		n.Stop()
		os.RemoveAll(dir)
	})
	return n
}

// startFresh starts the server on a free port (a few attempts: a free port
// can be taken between the check and the bind).
func (n *Node) startFresh() {
	n.t.Helper()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := serverproc.FreePort()
		if err != nil {
			n.t.Fatal(err)
		}
		srv, err := runPostmaster(n.bin, n.dir, n.data, n.cred, port, n.extra...)
		if err == nil {
			n.mu.Lock()
			n.port, n.cur = port, srv
			n.mu.Unlock()
			return
		}
		lastErr = err
	}
	n.t.Fatalf("pgtest: start server: %v", lastErr)
}

// Port is the server's port on 127.0.0.1; it stays the same across Stop,
// Kill9 and Start.
func (n *Node) Port() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.port
}

// Host is "127.0.0.1:PORT", for multi-host DSNs.
func (n *Node) Host() string { return fmt.Sprintf("127.0.0.1:%d", n.Port()) }

// DSN is a DSN of database db on this server alone.
func (n *Node) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", n.Host(), db)
}

// Kill9 loses the server the way a crashed machine does: SIGKILL to the
// postmaster and to every process it forked (its backends, WAL sender and
// writer), so no orphaned backend can finish a transaction afterwards.
// PostgreSQL puts each child in a session of its own (setsid), so a signal
// to the postmaster's process group would reach the postmaster alone: the
// children are found by their parent pid, with the postmaster stopped first
// so it forks no more. It returns when the postmaster is gone.
func (n *Node) Kill9() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cur == nil || n.cur.proc.Cmd.Process == nil {
		return
	}
	pid := n.cur.proc.Cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	for _, c := range childrenOf(pid) {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	<-n.cur.proc.Done
	n.cur = nil
	n.stopped = nil
}

// childrenOf lists the pids whose parent is pid (from /proc).
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 2 && f[1] == strconv.Itoa(pid) {
			out = append(out, c)
		}
	}
	return out
}

// Stop shuts the server down (fast shutdown), keeping its data. A frozen
// server is resumed first, so it can shut down.
func (n *Node) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cur != nil {
		n.thawLocked()
		n.cur.halt()
		n.cur = nil
	}
}

// Start starts a stopped server again on the same port and data.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cur != nil {
		return nil
	}
	srv, err := runPostmaster(n.bin, n.dir, n.data, n.cred, n.port, n.extra...)
	if err != nil {
		return err
	}
	n.cur = srv
	return nil
}

// Promote ends recovery on a standby (pg_ctl promote) and waits until it
// accepts writes.
func (n *Node) Promote() error {
	cmd := exec.Command(filepath.Join(n.bin, "pg_ctl"), "promote", "-w", "-t", "60", "-D", n.data)
	cmd.Dir = n.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: n.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl promote: %v: %s", err, serverproc.LastLines(out, 10))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		var inRecovery bool
		err := n.QueryRow(ctx, "SELECT pg_is_in_recovery()", &inRecovery)
		if err == nil && !inRecovery {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still in recovery after promote (last error: %v)", err)
		case <-time.After(20 * time.Millisecond): // polling a condition with a deadline
		}
	}
}

// Exec runs sql on database postgres of this server.
func (n *Node) Exec(ctx context.Context, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, n.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// QueryRow runs sql (no arguments) on database postgres of this server and
// scans its one row into dst.
func (n *Node) QueryRow(ctx context.Context, sql string, dst ...any) error {
	conn, err := pgx.Connect(ctx, n.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dst...)
}

// WaitStreaming waits until standbys standbys stream from this primary
// (pg_stat_replication rows in state streaming).
func (n *Node) WaitStreaming(ctx context.Context, standbys int) error {
	for {
		var c int
		err := n.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'", &c)
		if err == nil && c >= standbys {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d standbys streaming, want %d (last error: %v)", c, standbys, err)
		case <-time.After(20 * time.Millisecond): // polling a condition with a deadline
		}
	}
}

// Log is the server's log so far (for failure messages).
func (n *Node) Log() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	matches, _ := filepath.Glob(filepath.Join(n.dir, "postgres-*.log"))
	var out []byte
	for _, m := range matches {
		b, _ := os.ReadFile(m)
		out = append(out, b...)
	}
	return serverproc.LastLines(out, 40)
}

// Freeze stops the postmaster (SIGSTOP): the port still accepts TCP
// connections (the kernel queues them) but no new session starts. The
// sessions already established keep running (each backend is a process of
// its own session), with the old primary's data: they answer reads, and
// with a synchronous standby gone their commits wait forever. That is an
// old primary after a switch whose listener is cut off but whose clients
// still reach it: the case where a client must not keep reading from it.
// Thaw or Kill9 ends it.
func (n *Node) Freeze() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cur != nil && n.cur.proc.Cmd.Process != nil {
		pid := n.cur.proc.Cmd.Process.Pid
		_ = syscall.Kill(pid, syscall.SIGSTOP)
		n.stopped = append(n.stopped, pid)
	}
}

// FreezeAll stops the postmaster and every process it forked (SIGSTOP), as
// a paused VM or a host cut off without resets: connections and new dials
// hang, nothing answers. Thaw or Kill9 ends it.
func (n *Node) FreezeAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cur != nil && n.cur.proc.Cmd.Process != nil {
		pid := n.cur.proc.Cmd.Process.Pid
		_ = syscall.Kill(pid, syscall.SIGSTOP) // forks no more
		n.stopped = append(n.stopped, pid)
		for _, c := range childrenOf(pid) {
			_ = syscall.Kill(c, syscall.SIGSTOP)
			n.stopped = append(n.stopped, c)
		}
	}
}

// Thaw resumes what Freeze or FreezeAll stopped (SIGCONT).
func (n *Node) Thaw() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.thawLocked()
}

func (n *Node) thawLocked() {
	for _, pid := range n.stopped {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	n.stopped = nil
}
