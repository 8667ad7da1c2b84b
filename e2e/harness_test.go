// Package e2e tests the real `sequencer` binary: it is built once per test
// run, started as child processes on random ports, driven over the network
// API, killed and restarted, with network faults injected by TCP proxies
// (nemesis_proxy_test.go). Stores are fresh per test (a temp dir for the
// embedded store, a fresh database via persist/pgtest for PostgreSQL,
// persist/mysqltest for MySQL / MariaDB, persist/citustest for Citus).
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sequencer-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "sequencer")
	build := exec.Command("go", "build", "-o", binPath, "../cmd/sequencer")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building sequencer:", err)
		os.Exit(1)
	}
	code := runWithPG(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// freeAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// proc is one running `sequencer serve`.
type proc struct {
	t      testing.TB
	name   string
	args   []string
	env    []string
	Addr   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	output bytes.Buffer
	done   chan struct{}
	exit   error
}

// startNode starts `sequencer serve --listen ADDR args...` and waits for /readyz.
func startNode(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	return startNodeEnv(t, name, nil, args...)
}

// startNodeEnv is startNode with env added to the process's environment.
func startNodeEnv(t testing.TB, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, args: args, env: env}
	p.start(freeAddr(t))
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- output of %s (last 60 lines) ---\n%s", p.name, lastLines(p.Output(), 60))
		}
	})
	return p
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (p *proc) start(addr string) {
	p.t.Helper()
	if p.Addr != addr {
		// A restart on the same address writes nothing: load goroutines
		// may be reading Addr (the nemesis restarts killed nodes under load).
		p.Addr = addr
	}
	p.cmd = exec.Command(binPath, append([]string{"serve", "--listen", addr}, p.args...)...)
	p.cmd.Env = append(os.Environ(), p.env...)
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	p.done = make(chan struct{})
	if err := p.cmd.Start(); err != nil {
		p.t.Fatalf("%s: start: %v", p.name, err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.output.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
	}()
	go func() {
		p.exit = p.cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	p.waitReady(60 * time.Second)
}

// Output returns what the process printed so far.
func (p *proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.String()
}

func (p *proc) waitReady(d time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			p.t.Fatalf("%s exited before ready: %v\n%s", p.name, p.exit, p.Output())
		default:
		}
		resp, err := http.Get("http://" + p.adminAddr() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.t.Fatalf("%s not ready within %v\n%s", p.name, d, p.Output())
}

// adminAddr is where /readyz is served: --admin-listen's address when the
// node has one (for example when the API port has TLS), else the API's.
func (p *proc) adminAddr() string {
	for i, a := range p.args {
		if a == "--admin-listen" && i+1 < len(p.args) {
			return p.args[i+1]
		}
	}
	return p.Addr
}

// kill sends SIGKILL and waits.
func (p *proc) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// term sends SIGTERM and waits up to d for the exit; it returns the exit error.
func (p *proc) term(d time.Duration) error {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if os.Getenv("E2E_DEBUG_QUIT") != "" {
		select {
		case <-p.done:
			return p.exit
		case <-time.After(8 * time.Second):
			_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		}
	}
	select {
	case <-p.done:
		return p.exit
	case <-time.After(d):
		p.kill()
		return fmt.Errorf("%s did not exit within %v after SIGTERM", p.name, d)
	}
}

// restart starts the process again on the same address.
func (p *proc) restart() {
	p.t.Helper()
	p.kill()
	p.start(p.Addr)
}

// h2cClient speaks HTTP/2 cleartext.
func h2cClient() *http.Client {
	tr := &http.Transport{}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr.Protocols = &protos
	tr.TLSClientConfig = &tls.Config{}
	tr.MaxConnsPerHost = 0
	return &http.Client{Transport: tr}
}

// grpcClient is a gRPC (over h2c) client for p.
func (p *proc) grpcClient() sequencerv1connect.SequencerServiceClient {
	return sequencerv1connect.NewSequencerServiceClient(h2cClient(), "http://"+p.Addr, connect.WithGRPC())
}

// jsonClient is a Connect JSON client (HTTP/1.1) for p.
func (p *proc) jsonClient() sequencerv1connect.SequencerServiceClient {
	return sequencerv1connect.NewSequencerServiceClient(http.DefaultClient, "http://"+p.Addr, connect.WithProtoJSON())
}

// postJSON posts raw JSON like the curl examples of docs/API.md.
func postJSON(t testing.TB, addr, method, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/sequencer.v1.SequencerService/"+method, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func send(ctx context.Context, c sequencerv1connect.SequencerServiceClient, conv string, from uint64, cid string, body []byte) (*sequencerv1.SendResponse, error) {
	resp, err := c.Send(ctx, connect.NewRequest(&sequencerv1.SendRequest{ConvId: conv, FromUid: from, ClientMsgId: cid, Body: body}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// readyz returns /readyz's status and body (status 0 and the error when
// no answer came within 2 s).
func readyz(addr string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func httpGet(url string) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
