package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	sequencerv1 "github.com/sequencer-im/sequencer/proto/sequencer/v1"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

func init() {
	registerEngine(EngineSpec{
		Key: "e", Name: "sequencer serve, HTTP/2",
		About: "Send RPC to a running 'sequencer serve' (--target) over HTTP/2 cleartext (gRPC or Connect): engine a plus the API and the network",
		Open:  openRemote,
	})
}

// remoteEngine drives a running `sequencer serve` through its public API,
// and reads the server's own /metrics for batch sizes and memory.
type remoteEngine struct {
	base   string
	http   *http.Client
	client sequencerv1connect.SequencerServiceClient
}

// readyWait bounds how long opening engine e waits for the target's /readyz.
const readyWait = 15 * time.Second

func openRemote(ctx context.Context, env Env) (Engine, error) {
	if env.Target == "" {
		return nil, errors.New("engine e needs --target")
	}
	base := strings.TrimRight(env.Target, "/")
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protocols, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}
	hc := &http.Client{Transport: tr}
	var opts []connect.ClientOption
	if env.Protocol == "grpc" {
		opts = append(opts, connect.WithGRPC())
	}
	e := &remoteEngine{base: base, http: hc, client: sequencerv1connect.NewSequencerServiceClient(hc, base, opts...)}
	if err := e.waitReady(ctx); err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	return e, nil
}

func (e *remoteEngine) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(readyWait)
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("target %s: %w", e.base, err)
		}
		resp, err := e.http.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /readyz: %s", resp.Status)
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("target %s not ready after %s: %w", e.base, readyWait, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("target %s not ready: %w (last: %v)", e.base, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (e *remoteEngine) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	resp, err := e.client.Send(ctx, connect.NewRequest(&sequencerv1.SendRequest{
		ConvId: req.ConvID, FromUid: req.FromUID, ClientMsgId: req.ClientMsgID, MsgType: int32(req.MsgType), Body: req.Body,
	}))
	if err != nil {
		return sequencer.SendResult{}, err
	}
	m := resp.Msg
	return sequencer.SendResult{MsgID: m.GetMsgId(), Seq: m.GetSeq(), ServerAt: m.GetServerAt().AsTime(), Duplicate: m.GetDuplicate()}, nil
}

// Batches reads the server's commit histograms: sequencer_commit_batch_messages
// (_count commits, _sum messages) and sequencer_commit_seconds_sum.
func (e *remoteEngine) Batches(ctx context.Context) (BatchStats, error) {
	m, err := e.scrape(ctx)
	if err != nil {
		return BatchStats{}, err
	}
	c, ok1 := m["sequencer_commit_batch_messages_count"]
	s, ok2 := m["sequencer_commit_batch_messages_sum"]
	if !ok1 || !ok2 {
		return BatchStats{}, errors.New("target /metrics has no sequencer_commit_batch_messages")
	}
	return BatchStats{Commits: uint64(c), Messages: uint64(s), CommitSeconds: m["sequencer_commit_seconds_sum"]}, nil
}

// LiveConversations reads the server's live conversation actors.
func (e *remoteEngine) LiveConversations(ctx context.Context) (int, error) {
	m, err := e.scrape(ctx)
	if err != nil {
		return 0, err
	}
	v, ok := m["sequencer_conversation_actors"]
	if !ok {
		return 0, errors.New("target /metrics has no sequencer_conversation_actors")
	}
	return int(v), nil
}

// Memory reads the server's RSS and Go heap from its /metrics.
func (e *remoteEngine) Memory(ctx context.Context) (uint64, uint64, error) {
	m, err := e.scrape(ctx)
	if err != nil {
		return 0, 0, err
	}
	return uint64(m["process_resident_memory_bytes"]), uint64(m["go_memstats_heap_alloc_bytes"]), nil
}

// scrape reads the target's Prometheus text exposition: metric name -> the
// sum of its series.
func (e *remoteEngine) scrape(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s/metrics: %w", e.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s/metrics: %s", e.base, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics sums each metric's samples in the Prometheus text format.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			j := strings.LastIndexByte(rest, '}')
			if j < 0 {
				continue
			}
			rest = rest[j+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		out[name] += v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

func (e *remoteEngine) Close() error {
	e.http.CloseIdleConnections()
	return nil
}

// selfServeBin returns this executable when it is the sequencer binary (so
// `sequencer bench` can start `sequencer serve` for engine e), else "".
func selfServeBin() string {
	exe, err := os.Executable()
	if err != nil || filepath.Base(exe) != "sequencer" {
		return ""
	}
	return exe
}

// servedSpec turns engine e into "start ServeBin on a fresh schema per
// scenario, then drive it over HTTP/2": the same database, fresh tables, as
// every other engine.
func servedSpec(s EngineSpec) EngineSpec {
	s.NeedsSchema = true
	s.About += "; the bench starts the server on a fresh schema of the run's database for each scenario"
	s.Open = openServed
	return s
}

// servedEngine is engine e on a server process the bench started.
type servedEngine struct {
	*remoteEngine
	cmd  *exec.Cmd
	logs *tailBuffer
	done chan error
}

// serveStopWait bounds the server's graceful stop (SIGTERM) before SIGKILL.
const serveStopWait = time.Minute

func openServed(ctx context.Context, env Env) (Engine, error) {
	logs := &tailBuffer{max: 8 << 10}
	migrate := exec.CommandContext(ctx, env.ServeBin, "migrate", "--store", env.DSN)
	migrate.Stdout, migrate.Stderr = logs, logs
	if err := migrate.Run(); err != nil {
		return nil, fmt.Errorf("%s migrate: %w\n%s", env.ServeBin, err, logs.String())
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"serve", "--listen", addr, "--store", env.DSN, "--log-level", "warn"}
	if env.Passivate > 0 {
		args = append(args, "--passivate-after", env.Passivate.String())
	}
	cmd := exec.Command(env.ServeBin, args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s serve: %w", env.ServeBin, err)
	}
	e := &servedEngine{cmd: cmd, logs: logs, done: make(chan error, 1)}
	go func() { e.done <- cmd.Wait() }()
	env.Target = "http://" + addr
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// A server that exits at once fails the open without waiting for
		// the ready deadline.
		select {
		case err := <-e.done:
			e.done <- err
			cancel()
		case <-rctx.Done():
		}
	}()
	remote, err := openRemote(rctx, env)
	if err != nil {
		_ = e.stop()
		return nil, fmt.Errorf("%s serve: %w\nserver output:\n%s", env.ServeBin, err, logs.String())
	}
	e.remoteEngine = remote.(*remoteEngine)
	return e, nil
}

func (e *servedEngine) stop() error {
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-e.done:
		e.done <- err
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			return err
		}
		if err != nil {
			return fmt.Errorf("server exited: %w\n%s", err, e.logs.String())
		}
		return nil
	case <-time.After(serveStopWait):
		_ = e.cmd.Process.Kill()
		<-e.done
		return fmt.Errorf("server did not stop within %s of SIGTERM; killed", serveStopWait)
	}
}

func (e *servedEngine) Close() error {
	if e.remoteEngine != nil {
		_ = e.remoteEngine.Close()
	}
	return e.stop()
}

// freeAddr returns a 127.0.0.1 address with a port free right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr, nil
}

// tailBuffer keeps the last max bytes written to it (a child's output).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
