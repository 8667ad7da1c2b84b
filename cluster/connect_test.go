package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// echoHandler answers a forwarded item with seq = len(conv_id) and msg_id =
// from_uid, a failure for conv "fail", waits for its context for conv
// "slow", refuses batches from node "refuse-me", and counts wake-ups
// (answering conv "wakes" with the count) and forwarded batches.
type echoHandler struct {
	wakes   atomic.Int64
	batches atomic.Int64
}

func (h *echoHandler) HandleForward(ctx context.Context, b *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
	h.batches.Add(1)
	if b.FromNode == "refuse-me" {
		return nil, &RefusedError{Msg: "not a member"}
	}
	reply := &clusterv1.ForwardBatchReply{NodeId: "echo"}
	for _, req := range b.Items {
		var r *clusterv1.ForwardReply
		switch req.ConvId {
		case "fail":
			r = encodeReply(sequencer.SendResult{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrOwnershipMoving, "partition 3 moving"))
		case "slow":
			<-ctx.Done()
			r = encodeReply(sequencer.SendResult{}, ctx.Err())
		case "wakes":
			r = encodeReply(sequencer.SendResult{Seq: uint64(h.wakes.Load())}, nil)
		default:
			r = encodeReply(sequencer.SendResult{MsgID: req.FromUid, Seq: uint64(len(req.ConvId)), ServerAt: time.UnixMilli(1700000000123).UTC()}, nil)
		}
		reply.Results = append(reply.Results, r)
	}
	return reply, nil
}

func (h *echoHandler) HandleWake(peer string, w *clusterv1.WakeRequest) { h.wakes.Add(1) }

func newConnect(t *testing.T, listen string, tlsConf *PeerTLS) *ConnectTransport {
	t.Helper()
	tr, err := NewConnectTransport(ConnectConfig{Listen: listen, TLS: tlsConf, Logger: simLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func startEcho(t *testing.T, listen string, tlsConf *PeerTLS) (*ConnectTransport, string, *echoHandler) {
	t.Helper()
	tr := newConnect(t, listen, tlsConf)
	h := &echoHandler{}
	addr, err := tr.Start(h)
	if err != nil {
		t.Fatal(err)
	}
	return tr, addr, h
}

func forward(t *testing.T, tr Transport, addr, conv string, from uint64, timeout time.Duration) (sequencer.SendResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	reply, err := tr.Forward(ctx, addr, &clusterv1.ForwardBatch{Items: []*clusterv1.ForwardItem{{ConvId: conv, FromUid: from}}})
	if err != nil {
		return sequencer.SendResult{}, err
	}
	if len(reply.Results) != 1 {
		t.Fatalf("%d results for 1 item", len(reply.Results))
	}
	r := reply.Results[0]
	r.NodeId = reply.NodeId
	return decodeReply(r)
}

func TestConnectTransportForwardAndWake(t *testing.T) {
	a := newConnect(t, "127.0.0.1:0", nil)
	_, addr, h := startEcho(t, "127.0.0.1:0", nil)
	res, err := forward(t, a, addr, "abcd", 42, 10*time.Second)
	if err != nil || res.Seq != 4 || res.MsgID != 42 || !res.ServerAt.Equal(time.UnixMilli(1700000000123)) {
		t.Fatalf("forward result %+v %v", res, err)
	}
	// A failure keeps its code and sentinel across the wire.
	_, err = forward(t, a, addr, "fail", 0, 10*time.Second)
	if !errors.Is(err, sequencer.ErrOwnershipMoving) || sequencer.ErrorCode(err) != sequencer.CodeUnavailable || !strings.Contains(err.Error(), "partition 3 moving") {
		t.Fatalf("forwarded failure: %v (code %v)", err, sequencer.ErrorCode(err))
	}
	// A refused batch is a *RefusedError (nothing stored), not a transport
	// error.
	_, err = a.Forward(context.Background(), addr, &clusterv1.ForwardBatch{FromNode: "refuse-me", Items: []*clusterv1.ForwardItem{{ConvId: "x"}}})
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("refused batch: %v", err)
	}
	// Many at once, each answered to its own request; one batch answers its
	// items in order.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := forward(t, a, addr, strings.Repeat("x", i+1), uint64(i), 10*time.Second)
			if err == nil && (res.Seq != uint64(i+1) || res.MsgID != uint64(i)) {
				err = errors.New("reply for another request")
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	b := &clusterv1.ForwardBatch{}
	for i := range 10 {
		b.Items = append(b.Items, &clusterv1.ForwardItem{ConvId: strings.Repeat("y", i+1), FromUid: uint64(i)})
	}
	reply, err := a.Forward(context.Background(), addr, b)
	if err != nil || len(reply.Results) != 10 {
		t.Fatalf("batch: %v %v", reply, err)
	}
	for i, r := range reply.Results {
		if r.GetResult().GetSeq() != uint64(i+1) {
			t.Fatalf("batch result %d: %v", i, r)
		}
	}
	a.Wake(addr, &clusterv1.WakeRequest{FromNode: "a"})
	deadline := time.Now().Add(10 * time.Second)
	for h.wakes.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("wake never arrived")
		}
		time.Sleep(5 * time.Millisecond) // polling a condition
	}
	// The receiver's deadline is the forwarder's: a reply that never comes
	// ends with the caller's context.
	start := time.Now()
	_, err = forward(t, a, addr, "slow", 0, 300*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("slow forward: %v after %v", err, time.Since(start))
	}
}

func TestConnectTransportUnreachableAndRestart(t *testing.T) {
	a := newConnect(t, "127.0.0.1:0", nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	if _, err := forward(t, a, dead, "x", 0, time.Second); err == nil {
		t.Fatal("forward to a closed port succeeded")
	}
	// A node that stops and comes back on the same address is reachable
	// again.
	b, addr, _ := startEcho(t, "127.0.0.1:0", nil)
	if _, err := forward(t, a, addr, "ab", 0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := forward(t, a, addr, "ab", 0, time.Second); err == nil {
		t.Fatal("forward to a closed node succeeded")
	}
	startEcho(t, addr, nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := forward(t, a, addr, "abc", 0, 2*time.Second)
		if err == nil && res.Seq == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node restarted on %s never reachable again: %v", addr, err)
		}
	}
	// Listening on a taken address is an error.
	c := newConnect(t, addr, nil)
	if _, err := c.Start(&echoHandler{}); err == nil {
		t.Fatal("second transport on a taken address started")
	}
	// After Close, forwards fail at once.
	a.Close()
	if _, err := forward(t, a, addr, "ab", 0, time.Second); err == nil {
		t.Fatal("forward after Close succeeded")
	}
}

// TestConnectTransportProbe: a probe of a live peer is answered while a
// forward to it is still waiting for its owner (a slow owner is not a dead
// link); a probe into a link that accepts bytes and answers nothing, or to
// a closed port, fails; after Close probes fail at once.
func TestConnectTransportProbe(t *testing.T) {
	a := newConnect(t, "127.0.0.1:0", nil)
	_, addr, _ := startEcho(t, "127.0.0.1:0", nil)
	slow := make(chan error, 1)
	go func() {
		_, err := forward(t, a, addr, "slow", 0, 2*time.Second)
		slow <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Probe(ctx, addr); err != nil {
		t.Fatalf("probe of a live peer with a forward in flight: %v", err)
	}
	select {
	case err := <-slow:
		t.Fatalf("the slow forward ended before its deadline: %v", err)
	default:
	}

	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }() // reads, never answers
			t.Cleanup(func() { c.Close() })
		}
	}()
	hctx, hcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer hcancel()
	if err := a.Probe(hctx, hole.Addr().String()); err == nil {
		t.Fatal("probe into a link that answers nothing succeeded")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	if err := a.Probe(ctx, dead); err == nil {
		t.Fatal("probe of a closed port succeeded")
	}
	a.Close()
	if err := a.Probe(ctx, addr); err == nil {
		t.Fatal("probe after Close succeeded")
	}
	<-slow
}

func TestConnectTransportRefusesPlainNonLoopback(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", ":0", "10.1.2.3:7000", "[::]:0"} {
		if _, err := NewConnectTransport(ConnectConfig{Listen: listen}); err == nil || !strings.Contains(err.Error(), "--cluster-insecure") {
			t.Fatalf("plain transport on %s: %v", listen, err)
		}
		if _, err := NewConnectTransport(ConnectConfig{Listen: listen, Insecure: true}); err != nil {
			t.Fatalf("insecure transport on %s: %v", listen, err)
		}
		cfg := Config{NodeID: "a", Store: membership.NewMem(clock.NewFake(time.Now())), ClusterListen: listen}.WithDefaults()
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Fatalf("cluster config on %s without tls: %v", listen, err)
		}
	}
	for _, listen := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0"} {
		if !IsLoopback(listen) {
			t.Fatalf("%s: not loopback?", listen)
		}
	}
}

// testCA is a throwaway certificate authority.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	pem  []byte
}

var serial atomic.Int64

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue makes a node certificate (server and client auth; no names that
// matter: nodes verify the chain only).
func (ca *testCA) issue(t *testing.T, name string) (tls.Certificate, []byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c, certPEM, keyPEM
}

// files writes a node certificate, its key and the CA to dir (for the
// --cluster-tls-* flags); it returns the three paths.
func (ca *testCA) files(t *testing.T, dir, name string) (certFile, keyFile, caFile string) {
	t.Helper()
	_, certPEM, keyPEM := ca.issue(t, name)
	certFile, keyFile, caFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"), filepath.Join(dir, "ca.crt")
	for f, b := range map[string][]byte{certFile: certPEM, keyFile: keyPEM, caFile: ca.pem} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile, caFile
}

func TestConnectTransportMutualTLS(t *testing.T) {
	ca := newTestCA(t, "cluster")
	other := newTestCA(t, "other")
	dir := t.TempDir()
	cf, kf, caf := ca.files(t, dir, "server")
	serverTLS, err := LoadPeerTLS(cf, kf, caf)
	if err != nil {
		t.Fatal(err)
	}
	_, addr, h := startEcho(t, "127.0.0.1:0", serverTLS)

	// A node with a certificate of the cluster CA gets through.
	good, _, _ := ca.issue(t, "good")
	a := newConnect(t, "127.0.0.1:0", NewPeerTLS(good, ca.pool))
	if res, err := forward(t, a, addr, "abc", 1, 10*time.Second); err != nil || res.Seq != 3 {
		t.Fatalf("mutual TLS forward: %+v %v", res, err)
	}
	before := h.batches.Load()

	// Refused at the handshake: no client certificate, a certificate of
	// another CA, or a plain h2c client.
	noCert := NewPeerTLS(good, ca.pool)
	noCert.Client.Certificates = nil
	wrong, _, _ := other.issue(t, "wrong")
	for name, tr := range map[string]*ConnectTransport{
		"no client certificate":   newConnect(t, "127.0.0.1:0", noCert),
		"certificate of other CA": newConnect(t, "127.0.0.1:0", NewPeerTLS(wrong, ca.pool)),
		"plain h2c":               newConnect(t, "127.0.0.1:0", nil),
	} {
		_, err := forward(t, tr, addr, "abc", 1, 5*time.Second)
		var re *RefusedError
		if err == nil || errors.As(err, &re) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: forward %v", name, err)
		}
		t.Logf("%s: refused: %v", name, err)
	}
	// A server whose certificate is from another CA is not dialed through.
	_, rogueAddr, rogue := startEcho(t, "127.0.0.1:0", NewPeerTLS(wrong, other.pool))
	if _, err := forward(t, a, rogueAddr, "abc", 1, 5*time.Second); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("forward to a server of another CA: %v", err)
	}
	if h.batches.Load() != before || rogue.batches.Load() != 0 {
		t.Fatalf("a refused connection reached a handler: %d %d", h.batches.Load()-before, rogue.batches.Load())
	}
}
