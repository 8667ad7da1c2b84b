package client

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
