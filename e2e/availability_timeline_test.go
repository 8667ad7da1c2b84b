package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
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
			every500ms(s.stop, func() {
				at := now()
				vals, err := scrapeSums(hc, addr)
				s.mu.Lock()
				s.samples[i] = append(s.samples[i], nodeSample{at: at, ok: err == nil, vals: vals})
				s.mu.Unlock()
			})
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

// pgSample is one look at the database server the cluster writes to:
// what could slow every node's commits at once (issue 30: two runs whose
// commits were slow on every node through and after a cut, cause unknown).
type pgSample struct {
	at          time.Duration
	ok          bool
	autovacuum  []string // the autovacuum workers' queries ("autovacuum: VACUUM public.im_message"), with their database
	checkpoints int64    // pg_stat_bgwriter: timed + requested, since the server started
	oldestXact  float64  // seconds: the oldest open transaction of any other backend
	xminAge     int64    // transactions: the oldest backend_xmin's age
	active      int      // backends running a statement (not idle)
}

// pgSampler looks at the database server every 500 ms through dsn.
type pgSampler struct {
	mu      sync.Mutex
	samples []pgSample
	stop    chan struct{}
	done    sync.WaitGroup
}

func startPGSampler(dsn string, now func() time.Duration) *pgSampler {
	s := &pgSampler{stop: make(chan struct{})}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		every500ms(s.stop, func() {
			x := pgSample{at: now()}
			ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
			if conn == nil {
				conn, _ = pgx.Connect(ctx, dsn)
			}
			if conn != nil {
				var av []string
				err := conn.QueryRow(ctx, `SELECT
					coalesce(array_agg(datname || ': ' || query) FILTER (WHERE backend_type = 'autovacuum worker'), '{}'),
					coalesce(extract(epoch FROM max(now() - xact_start) FILTER (WHERE backend_type = 'client backend')), 0)::float8,
					coalesce(max(age(backend_xmin)), 0)::bigint,
					count(*) FILTER (WHERE state = 'active')::int,
					(SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)
					FROM pg_stat_activity WHERE pid <> pg_backend_pid()`).Scan(&av, &x.oldestXact, &x.xminAge, &x.active, &x.checkpoints)
				x.ok, x.autovacuum = err == nil, av
				if err != nil {
					conn.Close(context.Background())
					conn = nil
				}
			}
			cancel()
			s.mu.Lock()
			s.samples = append(s.samples, x)
			s.mu.Unlock()
		})
	}()
	return s
}

func (s *pgSampler) close() {
	close(s.stop)
	s.done.Wait()
}

// at returns the last sample taken at or before t (ok false if none).
func (s *pgSampler) at(t time.Duration) (pgSample, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return lastAt(s.samples, t, func(x pgSample) time.Duration { return x.at })
}

// summary describes the samples taken in [from, to): how many saw an
// autovacuum worker and on what, the longest open transaction, the oldest
// xmin, the checkpoints begun.
func (s *pgSampler) summary(from, to time.Duration) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, withAV := 0, 0
	var oldest float64
	var xmin int64
	seen := map[string]bool{}
	var what []string
	var cp0, cp1 int64 = -1, -1
	for _, x := range s.samples {
		if x.at < from || x.at >= to || !x.ok {
			continue
		}
		n++
		if cp0 < 0 {
			cp0 = x.checkpoints
		}
		cp1 = x.checkpoints
		oldest, xmin = max(oldest, x.oldestXact), max(xmin, x.xminAge)
		if len(x.autovacuum) > 0 {
			withAV++
		}
		for _, a := range x.autovacuum {
			if !seen[a] {
				seen[a] = true
				what = append(what, a)
			}
		}
	}
	if n == 0 {
		return "no sample"
	}
	return fmt.Sprintf("%d samples, autovacuum in %d (%s), oldest xact %.1f s, xmin age up to %d, %d checkpoints begun",
		n, withAV, strings.Join(what, "; "), oldest, xmin, cp1-cp0)
}

// String is the sample as the timeline's postgres column shows it.
func (x pgSample) String() string {
	if !x.ok {
		return "no sample"
	}
	av := "none"
	if len(x.autovacuum) > 0 {
		av = strings.Join(x.autovacuum, ", ")
	}
	return fmt.Sprintf("%d active, oldest xact %.1f s, xmin age %d, checkpoints %d, autovacuum: %s",
		x.active, x.oldestXact, x.xminAge, x.checkpoints, av)
}

// at returns node i's last sample taken at or before t (ok false if none).
func (s *metricSampler) at(i int, t time.Duration) (nodeSample, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return lastAt(s.samples[i], t, func(x nodeSample) time.Duration { return x.at })
}

// every500ms calls f every 500 ms until stop is closed.
func every500ms(stop <-chan struct{}, f func()) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		f()
	}
}

// lastAt returns the last of xs (in time order) taken at or before t.
func lastAt[T any](xs []T, t time.Duration, at func(T) time.Duration) (T, bool) {
	var best T
	found := false
	for _, x := range xs {
		if at(x) > t {
			break
		}
		best, found = x, true
	}
	return best, found
}

// timeline writes row's 500 ms buckets from 1 s before the heal t2 to 8 s
// after it.
func (l *availLoad) timeline(b *strings.Builder, s *metricSampler, pg *pgSampler, name string, t1, t2 time.Duration) {
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
	fmt.Fprintf(b, "postgres from the cut to the heal: %s\n\n", pg.summary(t1, t2))
	b.WriteString("| from heal | acks | by node: acked/failed | per node: partitions held/moving, pending sends, pool conns in use, actors, commits in the 500 ms and their mean, forwards, commit retries | postgres at the bucket's end |\n|---|---|---|---|---|\n")
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
		pgs := "no sample"
		if p, ok := pg.at(x + 500*time.Millisecond); ok {
			pgs = p.String()
		}
		fmt.Fprintf(b, "| %+.1f s | %d | %s | %s | %s |\n", (x - t2).Seconds(), acks(x, x+500*time.Millisecond),
			strings.Join(parts, ", "), strings.Join(ms, "; "), pgs)
	}
	failedAfterHeal(b, trace, t2)
}

// failedAfterHeal writes the failed attempts of the 6 s after the heal t2
// (until the next cut) by node and message (numbers masked), most frequent
// first: what a client was told while the cluster came back.
func failedAfterHeal(b *strings.Builder, trace []attemptTrace, t2 time.Duration) {
	type key struct{ node, msg string }
	n := map[key]int{}
	for _, a := range trace {
		if a.code == "" || a.ret < t2 || a.ret >= t2+6*time.Second {
			continue
		}
		k := key{a.node, a.msg}
		if k.node == "" {
			k.node = "sdk"
		}
		n[k]++
	}
	if len(n) == 0 {
		b.WriteString("\nno failed attempt in the 6 s after the heal\n")
		return
	}
	keys := make([]key, 0, len(n))
	for k := range n {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if n[keys[i]] != n[keys[j]] {
			return n[keys[i]] > n[keys[j]]
		}
		return keys[i].node+keys[i].msg < keys[j].node+keys[j].msg
	})
	b.WriteString("\nfailed attempts in the 6 s after the heal, by answering node and message:\n\n")
	for i, k := range keys {
		if i == 12 {
			fmt.Fprintf(b, "- and %d more kinds\n", len(keys)-i)
			break
		}
		fmt.Fprintf(b, "- %d x %s: %s\n", n[k], k.node, k.msg)
	}
}

// digits masks the numbers of an error message, so that messages that
// differ only in a partition, a port or a duration count as one.
var digits = regexp.MustCompile(`[0-9]+(\.[0-9]+)?`)

// traceMsg is err's message with its numbers masked ("" for nil), cut to
// 200 characters.
func traceMsg(err error) string {
	if err == nil {
		return ""
	}
	m := digits.ReplaceAllString(err.Error(), "N")
	if len(m) > 200 {
		m = m[:200] + "..."
	}
	return m
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
