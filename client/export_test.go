package client

import "context"

// QueuedAt returns how many messages wait in the client's queue for the
// node at addr (an entry address as given in Config.Addrs), for tests.
func QueuedAt(c *Client, addr string) int {
	u, _ := baseURL(addr)
	n := c.nodeAt(u)
	if n == nil || n.batch == nil {
		return 0
	}
	n.batch.mu.Lock()
	defer n.batch.mu.Unlock()
	return len(n.batch.queue)
}

// SendOrdered sends req as one of SendMany's items (ordered with the other
// ordered items of its conversation), for tests that need to start ordered
// items one at a time.
func SendOrdered(ctx context.Context, c *Client, req SendRequest) (SendResult, error) {
	return c.send(ctx, req, func() {})
}
