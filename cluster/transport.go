package cluster

import (
	"context"

	clusterv1 "github.com/sequencer-im/sequencer/proto/cluster/v1"
)

// Handler is what a node serves to the other nodes.
type Handler interface {
	// HandleForward handles a Send forwarded by another node (locally, or a
	// failure: never forwarded again). It always returns a reply.
	HandleForward(ctx context.Context, req *clusterv1.ForwardSend) *clusterv1.ForwardReply
	// HandleWake asks the node to read the membership table now.
	HandleWake(w *clusterv1.Wake)
}

// Transport carries messages between nodes. The default is protoactor-go
// remote (NewRemoteTransport); simulations use an in-memory one.
type Transport interface {
	// Start serves h and returns the address the transport bound (host:port).
	Start(h Handler) (addr string, err error)
	// Forward sends req to the node at addr and waits for its reply, at most
	// until ctx ends. An error means no reply arrived: the request may or may
	// not have been handled.
	Forward(ctx context.Context, addr string, req *clusterv1.ForwardSend) (*clusterv1.ForwardReply, error)
	// Wake sends w to the node at addr without waiting (best effort).
	Wake(addr string, w *clusterv1.Wake)
	// Close stops serving and releases the listener.
	Close() error
}
