package cluster

import (
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/ownership"
)

// HeldLeases returns the partition leases this node holds now, in
// partition order, each with its epoch (bumped by every acquisition): the
// firehose publishes their conversations (package firehose polls it, and
// takes a new epoch for a new holding even when it never saw the partition
// go). A partition is published by its lease holder only, so a new holder
// resumes from the store's cursor after a handoff or a crash.
func (n *member) HeldLeases() []membership.PartitionLease {
	return read(n, func(c *ownership.Core) []membership.PartitionLease { return c.HeldLeases() })
}
