package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"
)

// NodeSummary is one node's part of the cluster page (GET
// /console/api/node): its samples, the events it saw and the sends it
// received per conversation over the hot window.
type NodeSummary struct {
	Node       string            `json:"node"`
	At         time.Time         `json:"at"`
	IntervalMs int64             `json:"intervalMs"`
	Samples    []Sample          `json:"samples"`
	Events     []Event           `json:"events"`
	HotSecs    float64           `json:"hotSecs"`   // seconds the counts cover
	HotCounts  map[string]uint64 `json:"hotCounts"` // sends received per conversation (its busiest maxHotReport); omitted without the token
	// HotPartitionCounts is sends received per partition (all of them,
	// not only the busiest conversations'); empty on a single node.
	HotPartitionCounts map[uint32]uint64 `json:"hotPartitionCounts"`
}

// maxHotReport bounds the conversations a node reports for the cluster's
// hot tables.
const maxHotReport = 100

// ClusterNode is one member on the cluster page.
type ClusterNode struct {
	NodeID     string       `json:"nodeId"`
	APIAddr    string       `json:"apiAddr"`
	ConsoleURL string       `json:"consoleUrl,omitempty"` // its own console
	Self       bool         `json:"self,omitempty"`
	Leaving    bool         `json:"leaving,omitempty"`
	Reachable  bool         `json:"reachable"`
	Error      string       `json:"error,omitempty"` // why its summary is missing
	Summary    *NodeSummary `json:"summary,omitempty"`
}

// peerTimeout bounds one peer's answer to the cluster page.
const peerTimeout = 1500 * time.Millisecond

func (c *Console) summary() *NodeSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &NodeSummary{Node: c.cfg.NodeID, At: time.Now().UTC(), IntervalMs: c.cfg.SampleEvery.Milliseconds(),
		Samples: append([]Sample{}, c.samples...), Events: append([]Event{}, c.obs.events...),
		HotSecs: float64(len(c.hot.window)) * c.cfg.SampleEvery.Seconds()}
	sums := c.hot.sums()
	s.HotPartitionCounts = map[uint32]uint64{}
	if c.cfg.PartitionOf != nil {
		for k, v := range sums {
			if p, ok := c.cfg.PartitionOf(k); ok {
				s.HotPartitionCounts[p] += v
			}
		}
	}
	if len(sums) > maxHotReport {
		keep := make(map[string]uint64, maxHotReport)
		all := make([]HotConv, 0, len(sums))
		for k, v := range sums {
			all = append(all, HotConv{ConvID: k, SendsPerSec: float64(v)})
		}
		sort.Slice(all, func(i, j int) bool { return all[i].SendsPerSec > all[j].SendsPerSec })
		for _, h := range all[:maxHotReport] {
			keep[h.ConvID] = sums[h.ConvID]
		}
		sums = keep
	}
	s.HotCounts = sums
	return s
}

func (c *Console) node(w http.ResponseWriter, r *http.Request) {
	s := c.summary()
	if !c.authorized(r) {
		s.HotCounts = nil // conversation ids: what the API's token protects
	}
	writeJSON(w, http.StatusOK, s)
}

// authorized reports whether r may see conversation ids (Config.Authorize).
func (c *Console) authorized(r *http.Request) bool {
	return c.cfg.Authorize == nil || c.cfg.Authorize(r)
}

// cluster answers every member's summary, gathered from their consoles
// over HTTP at their API addresses (this node's from memory), the merged
// events and the cluster's hot conversations and partitions.
func (c *Console) cluster(w http.ResponseWriter, r *http.Request) {
	members := c.cfg.Cluster.Members()
	sort.Slice(members, func(i, j int) bool { return members[i].NodeID < members[j].NodeID })
	nodes := make([]ClusterNode, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		n := ClusterNode{NodeID: m.NodeID, APIAddr: m.APIAddr, Self: m.Self, Leaving: m.Leaving}
		if m.APIAddr != "" {
			n.ConsoleURL = c.cfg.PeerScheme + "://" + m.APIAddr + "/console/"
		}
		nodes[i] = n
		if m.Self || m.NodeID == c.cfg.NodeID {
			nodes[i].Reachable, nodes[i].Summary = true, c.summary()
			continue
		}
		if m.APIAddr == "" {
			nodes[i].Error = "no API address advertised"
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := c.fetchPeer(r.Context(), m.APIAddr, r.Header.Get("Authorization"))
			if err != nil {
				nodes[i].Error = err.Error()
				return
			}
			nodes[i].Reachable, nodes[i].Summary = true, s
		}()
	}
	wg.Wait()
	var lists [][]Event
	sums := map[string]uint64{}
	perPart := map[uint32]uint64{}
	secs := 0.0
	for _, n := range nodes {
		if n.Summary == nil {
			continue
		}
		lists = append(lists, n.Summary.Events)
		for k, v := range n.Summary.HotCounts {
			sums[k] += v
		}
		for p, v := range n.Summary.HotPartitionCounts {
			perPart[p] += v
		}
		secs = max(secs, n.Summary.HotSecs)
	}
	if secs == 0 {
		secs = 1
	}
	hotConvs := topConvs(sums, secs, c.cfg.PartitionOf)
	if !c.authorized(r) {
		hotConvs = nil
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"node": c.cfg.NodeID, "at": time.Now().UTC(), "nodes": nodes, "events": nonNil(mergeEvents(lists...)),
		"hotSecs": secs, "hotConversations": hotConvs, "hotConversationsNeedToken": !c.authorized(r),
		"hotPartitions": topPartitions(perPart, secs),
	})
}

// fetchPeer asks the member at addr for its summary, passing on the
// caller's bearer token (a cluster shares its tokens) for its hot
// conversations.
func (c *Console) fetchPeer(ctx context.Context, addr, authorization string) (*NodeSummary, error) {
	ctx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.cfg.PeerScheme+"://"+addr+"/console/api/node", nil)
	if err != nil {
		return nil, err
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := c.cfg.PeerClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("unreachable: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("its console answered HTTP %d (an older version, or the console is on --admin-listen)", resp.StatusCode)
	}
	var s NodeSummary
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 8<<20)).Decode(&s); err != nil {
		return nil, fmt.Errorf("its answer: %w", err)
	}
	return &s, nil
}
