package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/netbuf"
)

// fakeReadiness is a node's readiness (the /readyz function) set by hand;
// it counts its calls.
type fakeReadiness struct {
	mu    sync.Mutex
	err   error
	calls atomic.Int64
}

func (f *fakeReadiness) ready() error {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *fakeReadiness) set(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

// The health status is SERVING exactly when readiness holds, for "" and the
// API's service name; NOT_SERVING when not ready and for good from Drain on;
// other names are not_found.
func TestHealthStatusFollowsReadiness(t *testing.T) {
	fr := &fakeReadiness{}
	h := NewHealth(fr.ready)
	check := func(service string) (grpchealth.Status, error) {
		res, err := h.Check(context.Background(), &grpchealth.CheckRequest{Service: service})
		if err != nil {
			return 0, err
		}
		return res.Status, nil
	}
	steps := []struct {
		name  string
		ready error
		drain bool
		want  grpchealth.Status
	}{
		{"ready", nil, false, grpchealth.StatusServing},
		{"store down", sequencer.ErrStoreUnavailable, false, grpchealth.StatusNotServing},
		{"lease lost", sequencer.ErrWorkerLeaseLost, false, grpchealth.StatusNotServing},
		{"ready again", nil, false, grpchealth.StatusServing},
		{"draining while ready", nil, true, grpchealth.StatusNotServing},
		{"draining, readiness flips", sequencer.ErrStoreUnavailable, false, grpchealth.StatusNotServing},
		{"draining, ready", nil, false, grpchealth.StatusNotServing},
	}
	for _, s := range steps {
		fr.set(s.ready)
		if s.drain {
			h.Drain()
			h.Drain() // idempotent
		}
		for _, svc := range []string{"", HealthService} {
			got, err := check(svc)
			if err != nil || got != s.want {
				t.Fatalf("%s: Check(%q) = %v, %v; want %v", s.name, svc, got, err, s.want)
			}
		}
	}
	if _, err := check("grpc.other.v1.Other"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("Check of an unknown service: %v, want not_found", err)
	}
	if _, err := h.Watch(context.Background(), &grpchealth.CheckRequest{Service: "x.Y"}, func() {}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("Watch of an unknown service: %v, want not_found", err)
	}
	if NewHealth(nil).Status() != grpchealth.StatusServing {
		t.Fatal("nil readiness is not SERVING")
	}
}

// toolsServer serves NewAPIMux plus MountGRPCTools over h2c on NewServer
// (its timeouts; change them through srvCfg) and returns its URL.
func toolsServer(t *testing.T, h *Health, edge Edge, srvCfg func(*http.Server)) (string, *http.Server) {
	t.Helper()
	sender := &fakeSender{}
	sender.set(answer(1, 1, false))
	svc := NewService(Config{Sender: sender, Reader: newFakeReader(), Logger: slog.New(slog.DiscardHandler)})
	mux := NewAPIMux(svc, edge)
	MountGRPCTools(mux, svc, h, edge)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ln.Addr().String(), mux)
	if srvCfg != nil {
		srvCfg(srv)
	}
	go srv.Serve(netbuf.Listener(ln))
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), srv
}

// h2cOnly speaks HTTP/2 cleartext only, as gRPC clients do.
func h2cOnly(t *testing.T) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// nextEvent is the next event of a Watch within 10 s.
func nextEvent(t *testing.T, events <-chan grpchealth.WatchEvent) (grpchealth.WatchEvent, bool) {
	t.Helper()
	select {
	case ev, ok := <-events:
		return ev, ok
	case <-time.After(10 * time.Second):
		t.Fatal("no Watch event within 10s")
		return grpchealth.WatchEvent{}, false
	}
}

func wantStatus(t *testing.T, events <-chan grpchealth.WatchEvent, want grpchealth.Status) {
	t.Helper()
	ev, ok := nextEvent(t, events)
	if !ok || ev.Err != nil || ev.Response.Status != want {
		t.Fatalf("Watch event %+v (open %v), want %v", ev, ok, want)
	}
}

// Watch over gRPC on h2c streams every change: SERVING, NOT_SERVING when
// readiness fails (also after the server's write and read timeouts have
// passed: a Watch outlives them), SERVING again, NOT_SERVING at the drain
// and then the stream ends with unavailable, so the HTTP server's graceful
// stop is not held open by it.
func TestHealthWatchStreamsReadyToDraining(t *testing.T) {
	fr := &fakeReadiness{}
	h := NewHealth(fr.ready)
	h.every = 10 * time.Millisecond
	const timeout = 100 * time.Millisecond
	url, srv := toolsServer(t, h, Edge{}, func(s *http.Server) { s.WriteTimeout, s.ReadTimeout = timeout, timeout })
	c := grpchealth.NewClient(h2cOnly(t), url, connect.WithGRPC())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := c.Watch(ctx, &grpchealth.CheckRequest{Service: HealthService})
	wantStatus(t, events, grpchealth.StatusServing)

	// Past the server's timeouts: wait for 30 re-checks (at 10 ms each).
	from := fr.calls.Load()
	deadline := time.Now().Add(10 * time.Second)
	for fr.calls.Load() < from+30 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	fr.set(sequencer.ErrStoreUnavailable)
	wantStatus(t, events, grpchealth.StatusNotServing)
	fr.set(nil)
	wantStatus(t, events, grpchealth.StatusServing)

	h.Drain()
	wantStatus(t, events, grpchealth.StatusNotServing)
	ev, ok := nextEvent(t, events)
	if !ok || connect.CodeOf(ev.Err) != connect.CodeUnavailable {
		t.Fatalf("after the drain's NOT_SERVING: event %+v (open %v), want the stream to end with unavailable", ev, ok)
	}
	if _, ok := nextEvent(t, events); ok {
		t.Fatal("the Watch stream did not end after its error")
	}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		t.Fatalf("graceful stop after the drain: %v", err)
	}
}

// A Watch open while the node is already not ready gets NOT_SERVING first;
// at the drain (no change to send) the stream ends with unavailable.
func TestHealthWatchEndsAtDrainWithoutChange(t *testing.T) {
	fr := &fakeReadiness{err: sequencer.ErrStoreUnavailable}
	h := NewHealth(fr.ready)
	url, _ := toolsServer(t, h, Edge{}, nil)
	c := grpchealth.NewClient(h2cOnly(t), url, connect.WithGRPC())
	events := c.Watch(context.Background(), &grpchealth.CheckRequest{})
	wantStatus(t, events, grpchealth.StatusNotServing)
	h.Drain()
	ev, ok := nextEvent(t, events)
	if !ok || connect.CodeOf(ev.Err) != connect.CodeUnavailable {
		t.Fatalf("event %+v (open %v), want unavailable", ev, ok)
	}
}

// rawReflection sends one list_services request to a reflection service
// (path) as a gRPC client over h2c would, and returns the gRPC status and
// the response messages.
func rawReflection(t *testing.T, client *http.Client, url, path, token string) (string, []byte) {
	t.Helper()
	msg := protowire.AppendTag(nil, 7, protowire.BytesType) // list_services = "*"
	msg = protowire.AppendString(msg, "*")
	frame := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(msg)))
	frame = append(frame, msg...)
	req, err := http.NewRequest(http.MethodPost, url+path, bytes.NewReader(frame))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.ProtoMajor != 2 {
		t.Fatalf("%s: answered over %s, want HTTP/2", path, res.Proto)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	status := res.Trailer.Get("Grpc-Status")
	if status == "" {
		status = res.Header.Get("Grpc-Status") // trailers-only answer
	}
	return status, body
}

// Reflection (v1 and v1alpha) lists the API's services and is behind the
// bearer token when tokens are on; health is not.
func TestReflectionBehindTokenHealthNot(t *testing.T) {
	tk, err := LoadTokens(writeTokens(t, t.TempDir(), "tools-token\n"))
	if err != nil {
		t.Fatal(err)
	}
	fr := &fakeReadiness{}
	url, _ := toolsServer(t, NewHealth(fr.ready), Edge{Tokens: tk}, nil)
	client := h2cOnly(t)
	for _, svc := range []string{grpcreflect.ReflectV1ServiceName, grpcreflect.ReflectV1AlphaServiceName} {
		path := "/" + svc + "/ServerReflectionInfo"
		if st, _ := rawReflection(t, client, url, path, ""); st != "16" {
			t.Fatalf("%s without a token: grpc-status %q, want 16 (unauthenticated)", svc, st)
		}
		if st, _ := rawReflection(t, client, url, path, "wrong"); st != "16" {
			t.Fatalf("%s with a wrong token: grpc-status %q, want 16", svc, st)
		}
		st, body := rawReflection(t, client, url, path, "tools-token")
		if st != "0" {
			t.Fatalf("%s with the token: grpc-status %q", svc, st)
		}
		for _, want := range reflectedServices {
			if !bytes.Contains(body, []byte(want)) {
				t.Fatalf("%s lists no %s: %q", svc, want, body)
			}
		}
	}

	// The Connect project's client (v1) with the token describes the API.
	rc := grpcreflect.NewClient(client, url, connect.WithGRPC())
	stream := rc.NewStream(context.Background(), grpcreflect.WithRequestHeaders(http.Header{"Authorization": {"Bearer tools-token"}}))
	files, err := stream.FileContainingSymbol(HealthService)
	if err != nil || len(files) == 0 || !strings.HasPrefix(files[0].GetName(), "sequencer/v1/") {
		t.Fatalf("FileContainingSymbol(%s): %v, %v", HealthService, files, err)
	}
	stream.Close()
	noTok := rc.NewStream(context.Background())
	if _, err := noTok.ListServices(); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("ListServices without a token: %v, want unauthenticated", err)
	}
	noTok.Close()

	// Health needs no token, over gRPC and Connect.
	for name, opts := range map[string][]connect.ClientOption{"grpc": {connect.WithGRPC()}, "connect": nil} {
		res, err := grpchealth.NewClient(client, url, opts...).Check(context.Background(), &grpchealth.CheckRequest{})
		if err != nil || res.Status != grpchealth.StatusServing {
			t.Fatalf("%s Check without a token: %+v, %v", name, res, err)
		}
	}
	// Connect's JSON over HTTP/1.1 (curl), no token: grpchealth's enum names.
	res1, err := http.Post(url+"/grpc.health.v1.Health/Check", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res1.Body)
	res1.Body.Close()
	if res1.StatusCode != 200 || strings.TrimSpace(string(b)) != `{"status":"SERVING_STATUS_SERVING"}` {
		t.Fatalf("JSON Check without a token: %d %s", res1.StatusCode, b)
	}
	fr.set(errors.New("down"))
	res, err := grpchealth.NewClient(client, url, connect.WithGRPC()).Check(context.Background(), &grpchealth.CheckRequest{Service: HealthService})
	if err != nil || res.Status != grpchealth.StatusNotServing {
		t.Fatalf("Check while not ready: %+v, %v", res, err)
	}
}
