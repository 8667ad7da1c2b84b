package console

import (
	"encoding/json"
	"net/http"
)

// Firehose is this node's firehose state (docs/FEED.md) as the console
// shows it.
type Firehose struct {
	Publishing  bool    `json:"publishing"`
	LagMessages uint64  `json:"lagMessages,string"`
	LagSeconds  float64 `json:"lagSeconds"`
	Published   uint64  `json:"published,string"`
	Errors      uint64  `json:"errors,string"`
	Partitions  int     `json:"partitions"` // partitions this node publishes
	// Behind are the partitions with the largest backlog (at most 10).
	Behind []FirehosePartition `json:"behind"`
}

// FirehosePartition is one partition's backlog.
type FirehosePartition struct {
	Partition uint32 `json:"partition"`
	Messages  uint64 `json:"messages,string"`
}

// ServeFirehose adds GET /console/api/firehose, answered from state (a node
// with --feed-nats calls it once, before serving). Without it the endpoint
// is 404 and the page shows no firehose card.
func (c *Console) ServeFirehose(state func() Firehose) {
	c.mux.HandleFunc("GET /console/api/firehose", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		f := state()
		if f.Behind == nil {
			f.Behind = []FirehosePartition{}
		}
		_ = json.NewEncoder(w).Encode(struct {
			Node string `json:"node"`
			Firehose
		}{c.cfg.NodeID, f})
	})
}
