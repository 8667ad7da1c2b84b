package pgtest

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Server is a PostgreSQL server of one test's own, for tests that stop and
// start the database under a running sequencer (a shared server must never be
// stopped). It listens on a random port of 127.0.0.1 and is removed with its
// data when the test ends.
type Server struct {
	mu   sync.Mutex
	bin  string
	dir  string
	data string
	port int
	cur  *localServer
}

// StartServer initdb's and starts a private server. The test fails (never
// skips) if no PostgreSQL binaries are installed.
func StartServer(t testing.TB) *Server {
	t.Helper()
	bin, err := findBinDir()
	if err != nil {
		t.Fatalf("pgtest.StartServer: %v; %s", err, howToGet)
	}
	first, err := startLocal()
	if err != nil {
		t.Fatalf("pgtest.StartServer: %v; %s", err, howToGet)
	}
	s := &Server{bin: bin, dir: first.dir, data: filepath.Join(first.dir, "data"), port: first.port, cur: first}
	t.Cleanup(func() {
		s.Stop()
		os.RemoveAll(s.dir)
	})
	return s
}

// DSN is the admin DSN (database postgres) of the server; it stays valid
// across Stop and Start.
func (s *Server) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Stop shuts the server down (fast shutdown: open connections are cut).
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		s.cur.halt()
		s.cur = nil
	}
}

// Start starts a stopped server again on the same port and data.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		return nil
	}
	cred, err := credential()
	if err != nil {
		return err
	}
	srv, err := runPostmaster(s.bin, s.dir, s.data, cred, s.port)
	if err != nil {
		return err
	}
	s.cur = srv
	return nil
}
