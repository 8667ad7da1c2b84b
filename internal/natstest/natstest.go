// Package natstest starts a private nats-server with JetStream for a test:
// its own store directory and a random port on 127.0.0.1. Without the
// nats-server binary the test is skipped, except under CI (CI=true), where
// it fails: .ci/run installs Debian's nats-server.
package natstest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// Server is one nats-server process; Stop and Start restart it on the same
// port and store directory.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	cmd  *exec.Cmd
}

// Bin returns the nats-server binary, skipping (or failing under CI) when
// there is none.
func Bin(t testing.TB) string {
	t.Helper()
	for _, p := range []string{os.Getenv("NATS_SERVER"), "nats-server", "/usr/sbin/nats-server", "/usr/bin/nats-server"} {
		if p == "" {
			continue
		}
		if b, err := exec.LookPath(p); err == nil {
			return b
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("nats-server not found: .ci/run installs Debian's nats-server package")
	}
	t.Skip("nats-server not found (apt-get install nats-server); CI fails instead of skipping")
	return ""
}

// Start starts a nats-server -js and stops it at the test's end.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, bin: Bin(t), dir: t.TempDir(), port: freePort(t)}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// URL is nats://127.0.0.1:PORT.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

// Start (re)starts the server and waits until it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	if s.cmd != nil {
		return
	}
	cmd := exec.Command(s.bin, "-js", "-sd", s.dir, "-p", strconv.Itoa(s.port), "-a", "127.0.0.1")
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start nats-server: %v", err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("nats-server did not listen on %d: %v", s.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server (SIGKILL: an outage, not a shutdown) and waits.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_, _ = s.cmd.Process.Wait()
	s.cmd = nil
}
