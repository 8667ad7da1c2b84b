package cluster

import (
	"context"
	"fmt"
	"sync"

	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// MemNetwork is an in-process network for running several cluster nodes in
// one process (tests): each node gets a Transport with a made-up address;
// forwards call the target's handler directly. An address can be cut
// (SetDown) to play a frozen or crashed node.
//
// Simulations use it to step nodes by hand and cut them off; tests of the
// real wire use ConnectTransport (several can share a process).
type MemNetwork struct {
	// IgnoreWakes drops wake-ups instead of delivering them (simulations
	// that step nodes by hand).
	IgnoreWakes bool

	mu       sync.Mutex
	handlers map[string]Handler
	down     map[string]bool
}

// NewMemNetwork returns an empty network.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{handlers: map[string]Handler{}, down: map[string]bool{}}
}

// Transport returns a transport that serves at addr once started.
func (n *MemNetwork) Transport(addr string) Transport { return &memTransport{net: n, addr: addr} }

// SetDown cuts (true) or restores (false) the node at addr: forwards to it
// fail and wake-ups are dropped.
func (n *MemNetwork) SetDown(addr string, down bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down[addr] = down
}

func (n *MemNetwork) lookup(addr string) (Handler, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, ok := n.handlers[addr]
	return h, ok && !n.down[addr]
}

type memTransport struct {
	net  *MemNetwork
	addr string
}

func (t *memTransport) Start(h Handler) (string, error) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	if _, taken := t.net.handlers[t.addr]; taken {
		return "", fmt.Errorf("memnet: address %s in use", t.addr)
	}
	t.net.handlers[t.addr] = h
	return t.addr, nil
}

func (t *memTransport) Forward(ctx context.Context, addr string, req *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error) {
	h, ok := t.net.lookup(addr)
	if !ok {
		return nil, fmt.Errorf("memnet: %s unreachable: %w", addr, ErrNotSent)
	}
	if _, ok := t.net.lookup(t.addr); !ok {
		return nil, fmt.Errorf("memnet: %s is cut off: %w", t.addr, ErrNotSent)
	}
	return h.HandleForward(ctx, req)
}

func (t *memTransport) Wake(addr string, w *clusterv1.WakeRequest) {
	if t.net.IgnoreWakes {
		return
	}
	if h, ok := t.net.lookup(addr); ok {
		go h.HandleWake(t.addr, w)
	}
}

func (t *memTransport) Close() error {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	delete(t.net.handlers, t.addr)
	return nil
}
