package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/idgen"
	"github.com/sequencer-im/sequencer/persist/pgtest"
	"github.com/sequencer-im/sequencer/persist/postgres"
)

// The real-process tests run every node in a process of its own, as in
// production, so a node can be killed -9 or frozen (SIGSTOP): the test binary
// re-executes itself as a child (TestMain dispatches on envChild). Children
// are built with the same flags, so they run under -race too; a race in a
// child fails the test through its exit code.
const envChild = "SEQUENCER_CLUSTER_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(envChild) {
	case "node":
		runNodeChild()
		return
	}
	pgtest.Main(m)
}

// child is a child process of the test binary. It runs until its stdin is
// closed (or it is killed); its first stdout line "READY <addr>" gives its
// address.
type child struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	addr   string
	mu     sync.Mutex
	stderr bytes.Buffer
	done   chan struct{}
	err    error // exit status, after done
	killed bool
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func startChild(t *testing.T, name, mode string, env ...string) *child {
	t.Helper()
	c := &child{t: t, name: name, done: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(append(os.Environ(), envChild+"="+mode), env...)
	c.cmd.Stderr = lockedWriter{&c.mu, &c.stderr}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- addr
			}
		}
	}()
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.stop()
		if t.Failed() || os.Getenv("SEQUENCER_TEST_CHILD_LOGS") != "" {
			t.Logf("log of child %s:\n%s", name, c.log())
		}
	})
	select {
	case c.addr = <-ready:
	case <-c.done:
		t.Fatalf("child %s exited before ready: %v\n%s", name, c.err, c.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("child %s not ready after 60s\n%s", name, c.log())
	}
	return c
}

func (c *child) log() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

// stop closes stdin (the child leaves or exits) and waits; a child that
// fails (e.g. the race detector fired) fails the test.
func (c *child) stop() {
	c.cmd.Process.Signal(syscall.SIGCONT) // in case a test froze it
	c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
		c.t.Errorf("child %s did not exit after stdin closed\n%s", c.name, c.log())
		return
	}
	if c.err != nil && !c.killed {
		c.t.Errorf("child %s: %v\n%s", c.name, c.err, c.log())
	}
}

// kill ends the child with SIGKILL (a crash).
func (c *child) kill() {
	c.killed = true
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// leaseIDs issues msg_ids from a leased worker id.
type leaseIDs struct{ l *idgen.Issuer }

func (l leaseIDs) NextID() (uint64, error) { return l.l.Next() }

func childLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// sendReply is the node child's JSON answer to /send.
type sendReply struct {
	MsgID     uint64 `json:"msgId,string"`
	Seq       uint64 `json:"seq,string"`
	Duplicate bool   `json:"duplicate"`
	Code      string `json:"code,omitempty"`
	Error     string `json:"error,omitempty"`
}

// runNodeChild runs a whole cluster node the way server/ wires one: the
// PostgreSQL store ($SEQUENCER_TEST_DSN, migrated by the parent), a leased
// worker id, an actor.Conversations that commits through the cluster's fence watch
// and asks it for fences, and the cluster node over the connect transport
// (h2c) on 127.0.0.1:0. A small HTTP API on 127.0.0.1:0 drives it: POST /send, GET
// /ready, GET /route, POST /leave. Closing stdin leaves gracefully.
func runNodeChild() {
	ctx := context.Background()
	log := childLogger()
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
		os.Exit(3)
	}
	id := os.Getenv("SEQUENCER_TEST_NODE")
	log = log.With("node", id)
	store, err := postgres.Open(ctx, os.Getenv("SEQUENCER_TEST_DSN"), postgres.Options{})
	if err != nil {
		fail("open store", err)
	}
	lease, err := idgen.NewIssuer(store, idgen.IssuerConfig{Holder: id})
	if err != nil {
		fail("lease", err)
	}
	if err := lease.Start(ctx); err != nil {
		fail("lease start", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail("listen", err)
	}
	cn, err := New(Config{
		NodeID:        id,
		Store:         store.Cluster(),
		ClusterListen: "127.0.0.1:0",
		APIAddr:       ln.Addr().String(),
		MemberTTL:     2 * time.Second,
		Heartbeat:     300 * time.Millisecond,
		Logger:        log,
	})
	if err != nil {
		fail("cluster config", err)
	}
	an, err := actor.NewConversations(actor.Config{Store: store, IDs: leaseIDs{lease}, Ownership: cn, Logger: log})
	if err != nil {
		fail("actor node", err)
	}
	if err := cn.Start(ctx, an); err != nil {
		fail("cluster start", err)
	}
	var leaveOnce sync.Once
	var leaveErr error
	leave := func() error {
		leaveOnce.Do(func() {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			leaveErr = errors.Join(cn.Leave(lctx), an.Close(lctx), cn.Close(), lease.Close(lctx))
			store.Close()
		})
		return leaveErr
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /send", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ConvID      string `json:"convId"`
			FromUID     uint64 `json:"fromUid,string"`
			ClientMsgID string `json:"clientMsgId"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
		defer cancel()
		res, err := cn.Send(sctx, sequencer.SendRequest{ConvID: req.ConvID, FromUID: req.FromUID, ClientMsgID: req.ClientMsgID, MsgType: 1, Body: []byte("b")})
		out := sendReply{MsgID: res.MsgID, Seq: res.Seq, Duplicate: res.Duplicate}
		if err != nil {
			out = sendReply{Code: sequencer.ErrorCode(err).String(), Error: err.Error()}
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				out.Code = sequencer.CodeUnavailable.String()
			}
		}
		json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {
		if err := cn.Serving(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /route", func(w http.ResponseWriter, r *http.Request) {
		rt, err := cn.Route(r.Context(), r.URL.Query().Get("conv"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		json.NewEncoder(w).Encode(rt)
	})
	mux.HandleFunc("POST /leave", func(w http.ResponseWriter, r *http.Request) {
		if err := leave(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "left")
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	fmt.Printf("READY %s\n", ln.Addr())
	io.Copy(io.Discard, os.Stdin)
	if err := leave(); err != nil {
		fmt.Fprintln(os.Stderr, "leave:", err)
		os.Exit(4)
	}
	srv.Close()
	os.Exit(0)
}
