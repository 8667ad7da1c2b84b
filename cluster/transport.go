package cluster

import (
	"context"
	"errors"

	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// ProtocolVersion is the inter-node protocol this build speaks (2: connect-go
// ClusterService with batched forwards; 3: a forwarded item may be an edit
// or a recall, ForwardItem.kind, which a version-2 owner would store as a
// plain message). A node refuses to join live members that speak another
// version (membership.ErrIncompatible).
const ProtocolVersion = 3

// Handler is what a node serves to the other nodes.
type Handler interface {
	// HandleForward handles a batch of sends forwarded by another node
	// (locally, or a failure per item; a live member's items are never
	// forwarded again). It answers one result per item, or an error
	// refusing the whole batch (it names no sender): then nothing was
	// stored.
	HandleForward(ctx context.Context, req *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error)
	// HandleWake asks the node to read the membership table now. peer names
	// the connection it came from (for rate limiting).
	HandleWake(peer string, w *clusterv1.WakeRequest)
}

// Transport carries messages between nodes. The default is connect-go over
// HTTP/2 (NewConnectTransport); simulations use an in-memory one.
type Transport interface {
	// Start serves h and returns the address the transport bound (host:port).
	Start(h Handler) (addr string, err error)
	// Forward sends req to the node at addr and waits for its reply, at most
	// until ctx ends. An error means no per-item answer arrived: either the
	// receiver refused the whole batch (a *RefusedError: nothing stored),
	// the request never left this node (an error wrapping ErrNotSent: the
	// connection could not be opened; nothing stored), or the outcome is
	// unknown (the items may or may not have been handled).
	Forward(ctx context.Context, addr string, req *clusterv1.ForwardBatch) (*clusterv1.ForwardBatchReply, error)
	// Wake sends w to the node at addr without waiting (best effort).
	Wake(addr string, w *clusterv1.WakeRequest)
	// Close stops serving and releases the listener.
	Close() error
}

// Prober is a Transport that can check a peer's link (optional): Probe asks
// the node at addr for any answer over the link that forwards use, and
// fails when none comes before ctx ends. The forwarder probes the link of a
// batch that has waited long (ForwardProbeAfter), to tell a slow owner
// (answers the probe) from a link that makes no progress.
type Prober interface {
	Probe(ctx context.Context, addr string) error
}

// ErrNotSent marks a Forward error that proves the request never reached
// the peer (no connection could be opened to it): nothing was stored.
var ErrNotSent = errors.New("not sent: no connection to the peer")

// RefusedError is a receiver's refusal of a whole forwarded batch before it
// looked at any item (the batch names no sender): nothing was stored. It crosses the wire as connect's permission_denied.
type RefusedError struct{ Msg string }

func (e *RefusedError) Error() string { return "forward refused: " + e.Msg }
