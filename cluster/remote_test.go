package cluster

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// echoHandler answers a forwarded send with seq = len(conv_id) and msg_id =
// from_uid, a failure for conv "fail", waits for its context for conv
// "slow", and counts wake-ups (answering conv "wakes" with the count).
type echoHandler struct {
	wakes atomic.Int64
}

func (h *echoHandler) HandleForward(ctx context.Context, req *clusterv1.ForwardSend) *clusterv1.ForwardReply {
	switch req.ConvId {
	case "fail":
		return encodeReply(sequencer.SendResult{}, sequencer.Wrap(sequencer.CodeUnavailable, sequencer.ErrOwnershipMoving, "partition 3 moving"))
	case "slow":
		<-ctx.Done()
		return encodeReply(sequencer.SendResult{}, ctx.Err())
	case "wakes":
		return encodeReply(sequencer.SendResult{Seq: uint64(h.wakes.Load())}, nil)
	}
	return encodeReply(sequencer.SendResult{MsgID: req.FromUid, Seq: uint64(len(req.ConvId)), ServerAt: time.UnixMilli(1700000000123).UTC()}, nil)
}

func (h *echoHandler) HandleWake(*clusterv1.Wake) { h.wakes.Add(1) }

// The test process runs at most one remote, for its whole life (see
// proc_test.go for why).
var (
	parentOnce   sync.Once
	parentRemote *RemoteTransport
	parentErr    error
)

func parentTransport(t *testing.T) *RemoteTransport {
	t.Helper()
	parentOnce.Do(func() {
		parentRemote = NewRemoteTransport(RemoteConfig{Listen: "127.0.0.1:0", Logger: simLogger()})
		_, parentErr = parentRemote.Start(&echoHandler{})
	})
	if parentErr != nil {
		t.Fatal(parentErr)
	}
	return parentRemote
}

func forward(t *testing.T, tr Transport, addr, conv string, from uint64, timeout time.Duration) (sequencer.SendResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	reply, err := tr.Forward(ctx, addr, &clusterv1.ForwardSend{ConvId: conv, FromUid: from})
	if err != nil {
		return sequencer.SendResult{}, err
	}
	return decodeReply(reply)
}

func TestRemoteTransportForwardAndWake(t *testing.T) {
	a := parentTransport(t)
	b := startChild(t, "echo", "echo")
	res, err := forward(t, a, b.addr, "abcd", 42, 10*time.Second)
	if err != nil || res.Seq != 4 || res.MsgID != 42 || !res.ServerAt.Equal(time.UnixMilli(1700000000123)) {
		t.Fatalf("forward result %+v %v", res, err)
	}
	// A failure keeps its code and sentinel across the wire.
	_, err = forward(t, a, b.addr, "fail", 0, 10*time.Second)
	if !errors.Is(err, sequencer.ErrOwnershipMoving) || sequencer.ErrorCode(err) != sequencer.CodeUnavailable || !strings.Contains(err.Error(), "partition 3 moving") {
		t.Fatalf("forwarded failure: %v (code %v)", err, sequencer.ErrorCode(err))
	}
	// Many at once on one connection, each answered to its own request.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := forward(t, a, b.addr, strings.Repeat("x", i+1), uint64(i), 10*time.Second)
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
	a.Wake(b.addr, &clusterv1.Wake{FromNode: "a"})
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := forward(t, a, b.addr, "wakes", 0, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if res.Seq == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("wake never arrived")
		}
	}
	// The child's deadline is the forwarder's: a reply that never comes
	// ends with the caller's context.
	start := time.Now()
	_, err = forward(t, a, b.addr, "slow", 0, 300*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("slow forward: %v after %v", err, time.Since(start))
	}
}

func TestRemoteTransportUnreachableAndRestart(t *testing.T) {
	a := parentTransport(t)
	// Nothing listens: the forward fails by the caller's deadline.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	if _, err := forward(t, a, dead, "x", 0, time.Second); err == nil {
		t.Fatal("forward to a closed port succeeded")
	}
	// A node that crashes and comes back on the same address is reachable
	// again.
	b := startChild(t, "echo", "echo")
	if _, err := forward(t, a, b.addr, "ab", 0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	b.kill()
	if _, err := forward(t, a, b.addr, "ab", 0, time.Second); err == nil {
		t.Fatal("forward to a killed node succeeded")
	}
	startChild(t, "echo-again", "echo", "SEQUENCER_TEST_LISTEN="+b.addr)
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := forward(t, a, b.addr, "abc", 0, 2*time.Second)
		if err == nil && res.Seq == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node restarted on %s never reachable again: %v", b.addr, err)
		}
	}
	// Listening on a taken address is an error, not a panic.
	c := NewRemoteTransport(RemoteConfig{Listen: b.addr, Logger: simLogger()})
	if _, err := c.Start(&echoHandler{}); err == nil {
		t.Fatal("second transport on a taken address started")
	}
}
