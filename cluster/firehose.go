package cluster

import "github.com/sequencer-im/sequencer/ownership"

// HeldPartitions returns the partitions whose lease this node holds now, in
// partition order: the firehose publishes their conversations (package
// firehose polls it). A partition is published by its lease holder only, so
// a new holder resumes from the store's cursor after a handoff or a crash.
func (n *member) HeldPartitions() []uint32 {
	return read(n, func(c *ownership.Core) []uint32 {
		ls := c.HeldLeases()
		out := make([]uint32, len(ls))
		for i, l := range ls {
			out[i] = l.Partition
		}
		return out
	})
}
