package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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
	"github.com/sequencer-im/sequencer/client"
	"github.com/sequencer-im/sequencer/proto/sequencer/v1/sequencerv1connect"
)

func init() {
	registerEngine(remoteSpec("e", "sequencer serve, SDK unary", false,
		"the Go SDK (client) with batching disabled: one Send RPC per message (gRPC over HTTP/2 cleartext, or --protocol connect) to a 'sequencer serve' on PostgreSQL", newSDKClient(false)))
	registerEngine(remoteSpec("e-json", "sequencer serve, JSON HTTP/1.1", false,
		"a plain net/http client: one POST /sequencer.v1.SequencerService/Send per message, Content-Type application/json, HTTP/1.1 keep-alive connections (the way curl and most web stacks call it), to a 'sequencer serve' on PostgreSQL", newJSONClient))
	registerEngine(remoteSpec("e-batch", "sequencer serve, SDK batching", false,
		"the Go SDK (client) with its default auto-batching: concurrent Sends share SendBatch RPCs (gRPC over HTTP/2 cleartext, or --protocol connect) to a 'sequencer serve' on PostgreSQL", newSDKClient(true)))
	registerEngine(remoteSpec("e-sqlite", "sequencer serve, SDK unary, SQLite", true,
		"engine e on the embedded store: the server runs on --store sqlite:FILE (a fresh file per scenario)", newSDKClient(false)))
	registerEngine(remoteSpec("e-json-sqlite", "sequencer serve, JSON HTTP/1.1, SQLite", true,
		"engine e-json on the embedded store: the server runs on --store sqlite:FILE (a fresh file per scenario)", newJSONClient))
	registerEngine(remoteSpec("e-batch-sqlite", "sequencer serve, SDK batching, SQLite", true,
		"engine e-batch on the embedded store: the server runs on --store sqlite:FILE (a fresh file per scenario)", newSDKClient(true)))
}

// remoteSpec is an engine that drives a 'sequencer serve' through its public
// API with the client newClient makes: against --target, or (the default) a
// server the bench starts per scenario (servedSpec).
func remoteSpec(key, name string, sqlite bool, about string, newClient func(env Env) (Engine, error)) EngineSpec {
	return EngineSpec{Key: key, Name: name, About: about, Remote: true, SQLite: sqlite,
		Open: func(ctx context.Context, env Env) (Engine, error) {
			e, err := openRemote(ctx, env, newClient)
			if err != nil {
				return nil, err
			}
			return e, nil
		}}
}

// remoteEngine drives a running `sequencer serve` through its public API
// with a client (Engine), and reads the server's own /metrics for batch
// sizes, memory and CPU.
type remoteEngine struct {
	Engine
	base string
	http *http.Client // /readyz and /metrics
}

// readyWait bounds how long opening engine e waits for the target's /readyz.
const readyWait = 15 * time.Second

func openRemote(ctx context.Context, env Env, newClient func(env Env) (Engine, error)) (*remoteEngine, error) {
	if env.Target == "" {
		return nil, errors.New("engine e needs --target")
	}
	base := strings.TrimRight(env.Target, "/")
	env.Target = base
	e := &remoteEngine{base: base, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute}}}
	if err := e.waitReady(ctx); err != nil {
		e.http.CloseIdleConnections()
		return nil, err
	}
	c, err := newClient(env)
	if err != nil {
		e.http.CloseIdleConnections()
		return nil, err
	}
	e.Engine = c
	return e, nil
}

// newSDKClient returns engine e's or e-batch's client: the project's Go SDK
// against the one node (DisableRouting: no Route lookups), with batching on
// or off, and one attempt per Send so a failure shows as an error instead of
// being retried away.
func newSDKClient(batching bool) func(env Env) (Engine, error) {
	return func(env Env) (Engine, error) {
		c, err := client.New(sdkConfig(env, batching))
		if err != nil {
			return nil, err
		}
		return sdkClient{c}, nil
	}
}

// sdkConfig is the Go SDK's configuration of the SDK engines: env's target
// and protocol, no routing, one attempt, batching or not.
func sdkConfig(env Env, batching bool) client.Config {
	proto := client.ProtocolGRPC
	if env.Protocol == "connect" {
		proto = client.ProtocolConnect
	}
	return client.Config{
		Addrs: []string{env.Target}, Protocol: proto, DisableRouting: true,
		Retry:    client.RetryPolicy{MaxAttempts: 1},
		Batching: client.BatchPolicy{Disabled: !batching, MaxInFlight: env.BatchesInFlight},
	}
}

type sdkClient struct{ c *client.Client }

func (s sdkClient) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	r, err := s.c.Send(ctx, client.SendRequest{ConvID: req.ConvID, FromUID: req.FromUID, ClientMsgID: req.ClientMsgID, MsgType: req.MsgType, Body: req.Body})
	if err != nil {
		return sequencer.SendResult{}, err
	}
	return sequencer.SendResult{MsgID: r.MsgID, Seq: r.Seq, ServerAt: r.ServerAt, Duplicate: r.Duplicate}, nil
}

func (s sdkClient) Close() error { return s.c.Close() }

// jsonClient is engine e-json: unary Connect JSON over HTTP/1.1 with a plain
// net/http client, as curl or a web stack sends it. Every sender keeps its
// own keep-alive connection (the transport keeps up to jsonMaxIdle idle).
type jsonClient struct {
	url string
	tr  *http.Transport
	hc  *http.Client
}

// jsonMaxIdle bounds the idle keep-alive connections of engine e-json: more
// than any scenario's senders, so no sender has to dial again.
const jsonMaxIdle = 8192

func newJSONClient(env Env) (Engine, error) {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	tr := &http.Transport{
		Protocols: &protocols, MaxIdleConns: jsonMaxIdle, MaxIdleConnsPerHost: jsonMaxIdle, IdleConnTimeout: 90 * time.Second,
		DisableCompression: true, // curl does not ask for gzip either
	}
	return &jsonClient{url: env.Target + sequencerv1connect.SequencerServiceSendProcedure, tr: tr, hc: &http.Client{Transport: tr}}, nil
}

// jsonSendRequest and jsonSendResponse are SendRequest and SendResponse in
// the protobuf JSON mapping (camelCase names, 64-bit integers as strings in
// answers, bytes as base64).
type jsonSendRequest struct {
	ConvID      string `json:"convId"`
	FromUID     uint64 `json:"fromUid"`
	ClientMsgID string `json:"clientMsgId"`
	MsgType     int16  `json:"msgType,omitempty"`
	Body        []byte `json:"body,omitempty"`
}

type jsonSendResponse struct {
	MsgID     uint64    `json:"msgId,string"`
	Seq       uint64    `json:"seq,string"`
	ServerAt  time.Time `json:"serverAt"`
	Duplicate bool      `json:"duplicate"`
}

// jsonError is a Connect error body: {"code": "...", "message": "..."}.
type jsonError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// jsonMaxAnswer bounds the answer body the client reads.
const jsonMaxAnswer = 1 << 20

func (j *jsonClient) Send(ctx context.Context, req sequencer.SendRequest) (sequencer.SendResult, error) {
	body, err := json.Marshal(jsonSendRequest{ConvID: req.ConvID, FromUID: req.FromUID, ClientMsgID: req.ClientMsgID, MsgType: req.MsgType, Body: req.Body})
	if err != nil {
		return sequencer.SendResult{}, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, j.url, bytes.NewReader(body))
	if err != nil {
		return sequencer.SendResult{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := j.hc.Do(hreq)
	if err != nil {
		return sequencer.SendResult{}, err
	}
	defer resp.Body.Close()
	// Read to the end so the connection goes back to the pool.
	answer, err := io.ReadAll(io.LimitReader(resp.Body, jsonMaxAnswer))
	if err != nil {
		return sequencer.SendResult{}, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var je jsonError
		if json.Unmarshal(answer, &je) != nil || je.Code == "" {
			return sequencer.SendResult{}, fmt.Errorf("POST %s: %s: %.200s", j.url, resp.Status, answer)
		}
		var code connect.Code
		if code.UnmarshalText([]byte(je.Code)) != nil {
			code = connect.CodeUnknown
		}
		return sequencer.SendResult{}, connect.NewError(code, errors.New(je.Message))
	}
	var out jsonSendResponse
	if err := json.Unmarshal(answer, &out); err != nil {
		return sequencer.SendResult{}, fmt.Errorf("decode answer %.200q: %w", answer, err)
	}
	return sequencer.SendResult{MsgID: out.MsgID, Seq: out.Seq, ServerAt: out.ServerAt, Duplicate: out.Duplicate}, nil
}

func (j *jsonClient) Close() error {
	j.tr.CloseIdleConnections()
	return nil
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

// CPUSeconds is the server's process_cpu_seconds_total (its own read of
// /proc/self/stat), for a --target server whose process the bench cannot see.
func (e *remoteEngine) CPUSeconds(ctx context.Context) (float64, error) {
	m, err := e.scrape(ctx)
	if err != nil {
		return 0, err
	}
	v, ok := m["process_cpu_seconds_total"]
	if !ok {
		return 0, errors.New("target /metrics has no process_cpu_seconds_total")
	}
	return v, nil
}

func (e *remoteEngine) CPUScope() string { return cpuScopeServerMetrics }

func (e *remoteEngine) Close() error {
	var err error
	if e.Engine != nil {
		err = e.Engine.Close()
	}
	e.http.CloseIdleConnections()
	return err
}

// selfServeBin returns the sequencer binary beside this executable (make
// build puts sequencer and sequencer-bench into bin/), so the bench can start
// `sequencer serve` for the e engines; "" when there is none.
func selfServeBin() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(exe), "sequencer")
	if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return ""
	}
	return p
}

// servedSpec turns a remote engine into "start ServeBin on a fresh store per
// scenario, then drive it through the API": a fresh schema of the run's
// database (fresh tables, as every other engine), or a fresh SQLite file.
func servedSpec(s EngineSpec) EngineSpec {
	s.NeedsSchema = !s.SQLite && !s.MySQL
	if s.NeedsSchema {
		s.About += "; the bench starts the server on a fresh schema of the run's database for each scenario"
	}
	open := s.Open
	s.Open = func(ctx context.Context, env Env) (Engine, error) { return openServed(ctx, env, open) }
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

func openServed(ctx context.Context, env Env, open func(context.Context, Env) (Engine, error)) (Engine, error) {
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
	if env.KeepReadPositions {
		args = append(args, "--send-marks-read=false")
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
	remote, err := open(rctx, env)
	if err != nil {
		_ = e.stop()
		return nil, fmt.Errorf("%s serve: %w\nserver output:\n%s", env.ServeBin, err, logs.String())
	}
	e.remoteEngine = remote.(*remoteEngine)
	return e, nil
}

// CPUSeconds is the server process's utime+stime from /proc/PID/stat: the
// server's CPU alone, not the bench's.
func (e *servedEngine) CPUSeconds(context.Context) (float64, error) {
	return procCPUSeconds(e.cmd.Process.Pid)
}

func (e *servedEngine) CPUScope() string { return cpuScopeServer }

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
