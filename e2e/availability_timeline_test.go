package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The availability run's timeline (issue 30, point 2: "full rate within 2 s
// of the heal"): while the load runs, every node's /metrics is scraped every
// 500 ms, and each row's report shows, per 500 ms from 1 s before the heal
// to 8 s after it, the acks (by answering node for raw clients), the failed
// attempts, and each node's partitions, pending sends, commits and their
// mean time. It shows which node, and what in it, lags after a heal; the
// figures are a run's, never asserted.

// availGauges are the metrics the sampler keeps (summed over label sets).
var availGauges = []string{
	"sequencer_cluster_partitions_held",
	"sequencer_cluster_partitions_moving",
	"sequencer_pending_sends",
	"sequencer_store_pool_acquired_conns",
	"sequencer_conversation_actors",
	"sequencer_commit_seconds_count",
	"sequencer_commit_seconds_sum",
	"sequencer_cluster_forwards_total",
	"sequencer_store_commit_retries_total",
	"sequencer_commit_queue_batches",
}

// nodeSample is one scrape of one node (ok false: the scrape failed).
type nodeSample struct {
	at   time.Duration
	ok   bool
	vals map[string]float64
}

// metricSampler scrapes every node of a cluster every 500 ms.
type metricSampler struct {
	mu      sync.Mutex
	samples [][]nodeSample // by node index
	stop    chan struct{}
	done    sync.WaitGroup
}

func startMetricSampler(c *nemesisCluster, now func() time.Duration) *metricSampler {
	s := &metricSampler{samples: make([][]nodeSample, len(c.nodes)), stop: make(chan struct{})}
	hc := &http.Client{Timeout: 400 * time.Millisecond}
	for i, p := range c.nodes {
		s.done.Add(1)
		go func(i int, addr string) {
			defer s.done.Done()
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-s.stop:
					return
				case <-tick.C:
				}
				at := now()
				vals, err := scrapeSums(hc, addr)
				s.mu.Lock()
				s.samples[i] = append(s.samples[i], nodeSample{at: at, ok: err == nil, vals: vals})
				s.mu.Unlock()
			}
		}(i, p.Addr)
	}
	return s
}

func (s *metricSampler) close() {
	close(s.stop)
	s.done.Wait()
}

// scrapeSums reads availGauges from a node's /metrics, each summed over its
// label sets.
func scrapeSums(hc *http.Client, addr string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		var name, rest string
		if i := strings.IndexByte(line, '{'); i >= 0 {
			name, rest = line[:i], line[strings.LastIndexByte(line, '}')+1:]
		} else {
			name, rest, _ = strings.Cut(line, " ")
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		for _, g := range availGauges {
			if name == g {
				if v, err := strconv.ParseFloat(f[0], 64); err == nil {
					out[g] += v
				}
			}
		}
	}
	return out, sc.Err()
}

// at returns node i's last sample taken at or before t (ok false if none).
func (s *metricSampler) at(i int, t time.Duration) (nodeSample, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var best nodeSample
	found := false
	for _, x := range s.samples[i] {
		if x.at > t {
			break
		}
		best, found = x, true
	}
	return best, found
}

// timeline writes row's 500 ms buckets from 1 s before the heal t2 to 8 s
// after it.
func (l *availLoad) timeline(b *strings.Builder, s *metricSampler, name string, t1, t2 time.Duration) {
	ops := l.c.led.hist.Ops()
	acks := func(from, to time.Duration) int { return acksBetween(ops, from, to) }
	type nodeCount struct{ acked, failed int }
	l.mu.Lock()
	trace := append([]attemptTrace(nil), l.trace...)
	l.mu.Unlock()
	byNode := func(from, to time.Duration) map[string]nodeCount {
		m := map[string]nodeCount{}
		for _, a := range trace {
			if a.ret < from || a.ret >= to {
				continue
			}
			k := a.node
			if k == "" {
				k = "sdk"
			}
			c := m[k]
			if a.code == "" {
				c.acked++
			} else {
				c.failed++
			}
			m[k] = c
		}
		return m
	}
	var before []string
	for x := t1 - 3*time.Second; x < t1; x += 500 * time.Millisecond {
		before = append(before, strconv.Itoa(acks(x, x+500*time.Millisecond)))
	}
	fmt.Fprintf(b, "\n### %s (%s clients): acks per 500 ms in the 3 s before the cut: %s\n\n", name,
		map[bool]string{true: "raw", false: "SDK"}[l.raw], strings.Join(before, " "))
	b.WriteString("| from heal | acks | by node: acked/failed | per node: partitions held/moving, pending sends, pool conns in use, actors, commits in the 500 ms and their mean, forwards, commit retries |\n|---|---|---|---|\n")
	for x := t2 - time.Second; x < t2+8*time.Second; x += 500 * time.Millisecond {
		nc := byNode(x, x+500*time.Millisecond)
		var parts []string
		for _, k := range []string{"n1", "n2", "n3", "sdk"} {
			if c, ok := nc[k]; ok {
				parts = append(parts, fmt.Sprintf("%s %d/%d", k, c.acked, c.failed))
			}
		}
		var ms []string
		for i := range l.c.nodes {
			cur, ok1 := s.at(i, x+500*time.Millisecond)
			prev, ok0 := s.at(i, x)
			if !ok1 || !cur.ok {
				ms = append(ms, fmt.Sprintf("n%d: no scrape", i+1))
				continue
			}
			v := cur.vals
			commits, mean := 0.0, 0.0
			if ok0 && prev.ok {
				commits = v["sequencer_commit_seconds_count"] - prev.vals["sequencer_commit_seconds_count"]
				if commits > 0 {
					mean = (v["sequencer_commit_seconds_sum"] - prev.vals["sequencer_commit_seconds_sum"]) / commits
				}
			}
			ms = append(ms, fmt.Sprintf("n%d: %.0f/%.0f, %.0f, %.0f, %.0f, %.0f of %.1f ms, %.0f, %.0f", i+1,
				v["sequencer_cluster_partitions_held"], v["sequencer_cluster_partitions_moving"], v["sequencer_pending_sends"],
				v["sequencer_store_pool_acquired_conns"], v["sequencer_conversation_actors"], commits, mean*1000,
				v["sequencer_cluster_forwards_total"], v["sequencer_store_commit_retries_total"]))
		}
		fmt.Fprintf(b, "| %+.1f s | %d | %s | %s |\n", (x - t2).Seconds(), acks(x, x+500*time.Millisecond),
			strings.Join(parts, ", "), strings.Join(ms, "; "))
	}
}

// saveNodeLogs writes every node's output to the artifacts directory as
// availability-<hold>-<kind>-<node>.log.
func saveNodeLogs(c *nemesisCluster, hold time.Duration, kind string) {
	dir := historyArtifacts()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	for _, p := range c.nodes {
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("availability-%v-%s-%s.log", hold, kind, p.name)), []byte(p.Output()), 0o644)
	}
}
