// Package console is the node's read-only web console: a page (embedded
// HTML, JS and CSS, no build step, nothing fetched from the internet) and
// the small JSON API it polls, under /console/:
//
//	GET /console/                     the page
//	GET /console/api/members          members with heartbeat age
//	GET /console/api/partitions       every partition's owner and epoch
//	GET /console/api/metrics          commits/s, acked messages/s, send latency over the last minutes
//	GET /console/api/node             this node's part of the cluster page: its samples (rates,
//	                                  latency, pending sends and bytes with their limits, actors,
//	                                  forwards, 4xx/5xx, pool), the events it saw, its sends per
//	                                  conversation over the last minute
//	GET /console/api/cluster          every member's /console/api/node (fetched from its API
//	                                  address), the events merged, the hot conversations and
//	                                  partitions of the whole cluster
//	GET /console/api/workers          on a distributed store (Citus): its workers, the shards
//	                                  this node routes to each, and whether this node reaches them
//	GET /console/api/firehose         on a node with --feed-nats: its firehose backlog (firehose.go)
//	GET /console/api/conversation?conv_id=ID[&limit=N][&uid=UID]
//	                                  head and the last N messages' ids and times (never bodies),
//	                                  and with uid that user's read position and unread count;
//	                                  needs the API's bearer token when the node has tokens
//	GET /console/api/tail?conv_id=ID&after_seq=N
//	                                  server-sent events: the conversation's messages above N as
//	                                  the lookup shows them, stored then live (the change feed;
//	                                  tail.go); the same token
//
// It reads through small interfaces (ClusterView, Reader, a Prometheus
// Gatherer), so it depends on no other package of the node, and it never
// writes anything. Its memory is all it keeps: samples, events (events.go)
// and send counts (hot.go) are lost when the node stops; the cluster page
// gathers the other members' from their consoles.
package console

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sequencer-im/sequencer"
)

//go:embed assets
var assets embed.FS

// Member is one cluster member as the serving node sees it.
type Member struct {
	NodeID         string `json:"nodeId"`
	APIAddr        string `json:"apiAddr"`
	ClusterAddr    string `json:"clusterAddr,omitempty"`
	Leaving        bool   `json:"leaving,omitempty"`
	Self           bool   `json:"self,omitempty"`
	HeartbeatAgeMs int64  `json:"heartbeatAgeMs"`    // since its last heartbeat reached the store
	Version        string `json:"version,omitempty"` // the build the member runs
}

// Partition is one partition's lease as the serving node sees it.
type Partition struct {
	Owner     string `json:"owner"`               // node id; "" when free or its holder is gone
	Epoch     uint64 `json:"epoch,string"`        // lease epoch (0: never taken)
	RingOwner string `json:"ringOwner,omitempty"` // where the ring puts it
}

// ClusterView is what the node knows of its cluster.
type ClusterView interface {
	Members() []Member
	// Partitions is indexed by partition; empty on a single node (it owns
	// every conversation).
	Partitions() []Partition
	// Version is the membership version the answers come from.
	Version() uint64
}

// Reader reads committed conversations (persist.Store satisfies it).
type Reader interface {
	LoadHead(ctx context.Context, convID string) (uint64, error)
	ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error)
}

// Worker is one worker of a distributed store (Citus) as the serving node
// sees it.
type Worker struct {
	Addr      string `json:"addr"`      // host:port
	Shards    int    `json:"shards"`    // shards this node routes to it (0: none yet, e.g. just added)
	Reachable bool   `json:"reachable"` // a ping from this node answered
}

// Workers lists a distributed store's workers, each pinged within ctx.
type Workers interface {
	Workers(ctx context.Context) ([]Worker, error)
}

// ReadPositions answers users' read states (persist.ReadPositions satisfies
// it).
type ReadPositions interface {
	ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]sequencer.ReadState, error)
}

// Config builds a Console.
type Config struct {
	NodeID  string
	Cluster ClusterView // required
	Reader  Reader      // required
	// Positions answers the lookup's optional uid; nil: a lookup with a uid
	// is refused (501).
	Positions ReadPositions
	Gatherer  prometheus.Gatherer // the node's registry; nil: no metrics
	// Workers, on a distributed store only; nil: the page shows no
	// workers.
	Workers Workers
	// SampleEvery is the metrics sampling interval (default 1s); Keep is
	// how many samples are kept (default 300: five minutes at 1s).
	SampleEvery time.Duration
	Keep        int
	Logger      *slog.Logger
	// Authorize, when set, guards the conversation lookup (message ids,
	// senders and keys: what the API's bearer token protects); a request it
	// refuses is answered 401. Members, partitions and metrics are open,
	// like /metrics on the admin mux.
	Authorize func(*http.Request) bool
	// Sends counts the sends this node's API receives (wrap the API's
	// Sender with it) for the hot conversations; nil: no hot tables.
	Sends *SendCounter
	// PartitionOf maps a conversation to its partition (false on a single
	// node); nil: no hot partitions.
	PartitionOf func(convID string) (uint32, bool)
	// PeerClient fetches the other members' summaries for the cluster
	// page (default: a client with peerTimeout); PeerScheme is "http"
	// (default) or "https", as the members' API addresses are served.
	PeerClient *http.Client
	PeerScheme string
	// Tail streams a conversation for the live view (tail.go); nil: the
	// view does not tail.
	Tail Tailer
}

// Console serves the page and its API. Close stops its sampler.
type Console struct {
	cfg  Config
	mux  *http.ServeMux
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	samples []Sample
	prev    *counters
	obs     observer // events, from successive views
	hot     hot      // sends per conversation, last hotWindow samples
}

// New builds the console and starts sampling the metrics.
func New(cfg Config) *Console {
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = time.Second
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 300
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.PeerClient == nil {
		cfg.PeerClient = &http.Client{Timeout: peerTimeout}
	}
	if cfg.PeerScheme == "" {
		cfg.PeerScheme = "http"
	}
	c := &Console{cfg: cfg, mux: http.NewServeMux(), stop: make(chan struct{}), done: make(chan struct{}), obs: observer{self: cfg.NodeID}}
	static, _ := fs.Sub(assets, "assets")
	c.mux.Handle("GET /console/", http.StripPrefix("/console/", noStore(http.FileServerFS(static))))
	c.mux.HandleFunc("GET /console/api/members", c.members)
	c.mux.HandleFunc("GET /console/api/partitions", c.partitions)
	c.mux.HandleFunc("GET /console/api/metrics", c.metrics)
	c.mux.HandleFunc("GET /console/api/conversation", c.conversation)
	c.mux.HandleFunc("GET /console/api/tail", c.tail) // tail.go
	c.mux.HandleFunc("GET /console/api/workers", c.workers)
	c.mux.HandleFunc("GET /console/api/node", c.node)
	c.mux.HandleFunc("GET /console/api/cluster", c.cluster)
	c.mux.HandleFunc("GET /console", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
	})
	go c.sampleLoop()
	return c
}

// ServeHTTP serves /console/ and below.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.mux.ServeHTTP(w, r) }

// Close stops the sampler.
func (c *Console) Close() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

func noStore(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (c *Console) members(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"node": c.cfg.NodeID, "membershipVersion": strconv.FormatUint(c.cfg.Cluster.Version(), 10),
		"members": nonNil(c.cfg.Cluster.Members()),
	})
}

func (c *Console) partitions(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"node": c.cfg.NodeID, "membershipVersion": strconv.FormatUint(c.cfg.Cluster.Version(), 10),
		"partitions": nonNil(c.cfg.Cluster.Partitions()),
	})
}

// workerTimeout bounds the workers' pings (one that does not answer in
// time is shown unreachable).
const workerTimeout = 2 * time.Second

func (c *Console) workers(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Workers == nil {
		writeJSON(w, http.StatusOK, map[string]any{"node": c.cfg.NodeID, "distributed": false, "workers": []Worker{}})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), workerTimeout)
	defer cancel()
	ws, err := c.cfg.Workers.Workers(ctx)
	if err != nil {
		c.cfg.Logger.Debug("console: listing workers failed", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "store unavailable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"node": c.cfg.NodeID, "distributed": true, "workers": nonNil(ws)})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// MessageInfo is one message of a conversation lookup: ids and times only.
type MessageInfo struct {
	MsgID       uint64    `json:"msgId,string"`
	Seq         uint64    `json:"seq,string"`
	FromUID     uint64    `json:"fromUid,string"`
	MsgType     int16     `json:"msgType"`
	ClientMsgID string    `json:"clientMsgId"`
	ServerAt    time.Time `json:"serverAt"`
	BodyBytes   int       `json:"bodyBytes"`
	// State says how the message was changed, or what it changes: "edited
	// N×", "recalled", "edit of <msg_id>", "recall of <msg_id>"; empty for
	// an ordinary, unchanged message (docs/API.md, "Edit and Recall").
	State string `json:"state,omitempty"`
}

// messageState is MessageInfo.State of m.
func messageState(m *sequencer.Message) string {
	var parts []string
	switch m.Kind {
	case sequencer.KindEdit, sequencer.KindRecall:
		parts = append(parts, fmt.Sprintf("%s of %d", m.Kind, m.TargetMsgID))
	}
	if m.EditCount > 0 && m.Kind == sequencer.KindMessage {
		parts = append(parts, fmt.Sprintf("edited %d×", m.EditCount))
	}
	if m.Recalled {
		parts = append(parts, "recalled")
	}
	return strings.Join(parts, ", ")
}

// MaxLookup is the most messages a conversation lookup returns.
const MaxLookup = 100

func (c *Console) conversation(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Authorize != nil && !c.cfg.Authorize(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sequencer"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{
			"error": "unauthenticated: this node needs a bearer token (Authorization: Bearer <token>) for conversation lookups",
		})
		return
	}
	conv := r.URL.Query().Get("conv_id")
	if err := sequencer.CheckConvID(conv); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	limit := 20
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "limit: want a positive integer"})
			return
		}
		limit = min(n, MaxLookup)
	}
	var uid uint64
	if s := r.URL.Query().Get("uid"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err == nil {
			err = sequencer.CheckUID(n)
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "uid: want a decimal > 0 and < 2^63"})
			return
		}
		if c.cfg.Positions == nil {
			writeJSON(w, http.StatusNotImplemented, map[string]string{"error": "read positions are not available on this node"})
			return
		}
		uid = n
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	head, err := c.cfg.Reader.LoadHead(ctx, conv)
	if err != nil {
		c.cfg.Logger.Debug("console: conversation lookup failed", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "store unavailable"})
		return
	}
	after := uint64(0)
	if head > uint64(limit) {
		after = head - uint64(limit)
	}
	var msgs []sequencer.Message
	if head > 0 {
		msgs, err = c.cfg.Reader.ReadRange(ctx, conv, after, limit)
		if err != nil {
			c.cfg.Logger.Debug("console: conversation lookup failed", "err", err)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "store unavailable"})
			return
		}
	}
	out := make([]MessageInfo, 0, len(msgs))
	for i := len(msgs) - 1; i >= 0; i-- { // newest first
		m := msgs[i]
		out = append(out, MessageInfo{MsgID: m.MsgID, Seq: m.Seq, FromUID: m.FromUID, MsgType: m.MsgType,
			ClientMsgID: m.ClientMsgID, ServerAt: m.ServerAt, BodyBytes: len(m.Body), State: messageState(&m)})
	}
	ans := map[string]any{"convId": conv, "headSeq": strconv.FormatUint(head, 10), "messages": out}
	if uid != 0 {
		states, err := c.cfg.Positions.ReadStates(ctx, uid, []string{conv})
		if err != nil || len(states) != 1 {
			c.cfg.Logger.Debug("console: read state lookup failed", "err", err)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "store unavailable"})
			return
		}
		st := states[0]
		ans["readState"] = map[string]string{"uid": strconv.FormatUint(uid, 10), "readSeq": strconv.FormatUint(st.ReadSeq, 10),
			"headSeq": strconv.FormatUint(st.Head, 10), "unread": strconv.FormatUint(st.Unread(), 10)}
	}
	writeJSON(w, http.StatusOK, ans)
}

// Sample is the node's rates and gauges over one sampling interval.
// Latencies are nil when no send finished in the interval (the page draws
// a gap there, not a line); gauges the node does not have (the pool on the
// embedded store, forwards on a single node) are nil too.
type Sample struct {
	At             time.Time `json:"at"`
	CommitsPerSec  float64   `json:"commitsPerSec"`  // store transactions committed (result ok): one holds many messages
	MessagesPerSec float64   `json:"messagesPerSec"` // sends acked as new messages (Send and batch items)
	SendP50Ms      *float64  `json:"sendP50Ms"`      // Send/SendBatch latency, from request received to answer
	SendP99Ms      *float64  `json:"sendP99Ms"`

	PendingSends      *float64 `json:"pendingSends"` // admitted, not yet answered
	PendingSendsLimit *float64 `json:"pendingSendsLimit"`
	PendingBytes      *float64 `json:"pendingBytes"`
	PendingBytesLimit *float64 `json:"pendingBytesLimit"`
	CommitQueue       *float64 `json:"commitQueue"` // batches waiting for a commit worker
	Actors            *float64 `json:"actors"`      // live conversation actors
	PartitionsHeld    *float64 `json:"partitionsHeld"`
	ForwardsPerSec    *float64 `json:"forwardsPerSec"` // sends this node forwarded to their owner
	Req4xxPerSec      float64  `json:"req4xxPerSec"`   // RPCs answered a client error (400, 401, 404, 409, 429, 499)
	Req5xxPerSec      float64  `json:"req5xxPerSec"`   // RPCs answered a server error (500, 501, 503, 504)
	Req429PerSec      float64  `json:"req429PerSec"`   // of those, resource_exhausted
	Req503PerSec      float64  `json:"req503PerSec"`   // and unavailable
	PoolAcquired      *float64 `json:"poolAcquired"`   // PostgreSQL connections in use, every pool
	PoolMax           *float64 `json:"poolMax"`
}

func (c *Console) metrics(w http.ResponseWriter, _ *http.Request) {
	c.mu.Lock()
	s := append([]Sample(nil), c.samples...)
	c.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"node": c.cfg.NodeID, "intervalMs": c.cfg.SampleEvery.Milliseconds(), "samples": s})
}

// counters are the cumulative values and gauges read from the registry at
// one time.
type counters struct {
	at       time.Time
	commits  float64
	acked    float64
	bounds   []float64 // send latency histogram upper bounds (seconds)
	buckets  []float64 // cumulative counts per bound
	count    float64
	forwards *float64
	req4xx   float64
	req5xx   float64
	req429   float64
	req503   float64
	gauges   map[string]*float64 // by metric name (summed over labels)
}

func (c *Console) sampleLoop() {
	defer close(c.done)
	t := time.NewTicker(c.cfg.SampleEvery)
	defer t.Stop()
	c.sample(time.Now())
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.sample(now)
		}
	}
}

func (c *Console) sample(now time.Time) {
	version, members, parts := c.cfg.Cluster.Version(), c.cfg.Cluster.Members(), c.cfg.Cluster.Partitions()
	var counts map[string]uint32
	if c.cfg.Sends != nil {
		counts = c.cfg.Sends.take()
	}
	c.mu.Lock()
	c.obs.observe(now, version, members, parts)
	if c.cfg.Sends != nil {
		c.hot.add(counts)
	}
	c.mu.Unlock()
	if c.cfg.Gatherer == nil {
		return
	}
	cur, err := read(c.cfg.Gatherer, now)
	if err != nil {
		c.cfg.Logger.Debug("console: reading metrics", "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.prev
	c.prev = cur
	if prev == nil {
		return
	}
	s := rates(prev, cur)
	c.samples = append(c.samples, s)
	if len(c.samples) > c.cfg.Keep {
		c.samples = append(c.samples[:0], c.samples[len(c.samples)-c.cfg.Keep:]...)
	}
}

// read gathers the counters the console plots.
func read(g prometheus.Gatherer, now time.Time) (*counters, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, err
	}
	c := &counters{at: now, gauges: map[string]*float64{}}
	for _, mf := range mfs {
		switch name := mf.GetName(); name {
		case "sequencer_commit_seconds":
			for _, m := range mf.GetMetric() {
				if label(m, "result") == "ok" {
					c.commits += float64(m.GetHistogram().GetSampleCount())
				}
			}
		case "sequencer_sends_total":
			for _, m := range mf.GetMetric() {
				if label(m, "code") == "ok" {
					c.acked += m.GetCounter().GetValue()
				}
			}
		case "sequencer_send_seconds":
			for _, m := range mf.GetMetric() {
				h := m.GetHistogram()
				if c.bounds == nil {
					for _, b := range h.GetBucket() {
						c.bounds = append(c.bounds, b.GetUpperBound())
					}
					c.buckets = make([]float64, len(c.bounds))
				}
				for i, b := range h.GetBucket() {
					if i < len(c.buckets) {
						c.buckets[i] += float64(b.GetCumulativeCount())
					}
				}
				c.count += float64(h.GetSampleCount())
			}
		case "sequencer_cluster_forwards_total":
			var n float64
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
			c.forwards = &n
		case "sequencer_rpc_requests_total":
			for _, m := range mf.GetMetric() {
				v := m.GetCounter().GetValue()
				switch code := label(m, "code"); code {
				case "ok", "duplicate":
				case "unavailable", "internal", "unknown", "deadline_exceeded", "unimplemented", "data_loss":
					c.req5xx += v
					if code == "unavailable" {
						c.req503 += v
					}
				default:
					c.req4xx += v
					if code == "resource_exhausted" {
						c.req429 += v
					}
				}
			}
		case "sequencer_pending_sends", "sequencer_pending_sends_limit", "sequencer_pending_bytes", "sequencer_pending_bytes_limit",
			"sequencer_commit_queue_batches", "sequencer_conversation_actors", "sequencer_cluster_partitions_held",
			"sequencer_store_pool_acquired_conns", "sequencer_store_pool_max_conns":
			var n float64
			for _, m := range mf.GetMetric() {
				n += m.GetGauge().GetValue()
			}
			c.gauges[name] = &n
		}
	}
	return c, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// rates turns two readings into one Sample.
func rates(a, b *counters) Sample {
	s := Sample{At: b.at}
	secs := b.at.Sub(a.at).Seconds()
	if secs <= 0 {
		return s
	}
	s.CommitsPerSec = math.Max(0, b.commits-a.commits) / secs
	s.MessagesPerSec = math.Max(0, b.acked-a.acked) / secs
	perSec := func(x, y float64) float64 { return math.Max(0, y-x) / secs }
	s.Req4xxPerSec, s.Req5xxPerSec = perSec(a.req4xx, b.req4xx), perSec(a.req5xx, b.req5xx)
	s.Req429PerSec, s.Req503PerSec = perSec(a.req429, b.req429), perSec(a.req503, b.req503)
	if a.forwards != nil && b.forwards != nil {
		f := perSec(*a.forwards, *b.forwards)
		s.ForwardsPerSec = &f
	}
	g := b.gauges
	s.PendingSends, s.PendingSendsLimit = g["sequencer_pending_sends"], g["sequencer_pending_sends_limit"]
	s.PendingBytes, s.PendingBytesLimit = g["sequencer_pending_bytes"], g["sequencer_pending_bytes_limit"]
	s.CommitQueue, s.Actors, s.PartitionsHeld = g["sequencer_commit_queue_batches"], g["sequencer_conversation_actors"], g["sequencer_cluster_partitions_held"]
	s.PoolAcquired, s.PoolMax = g["sequencer_store_pool_acquired_conns"], g["sequencer_store_pool_max_conns"]
	n := b.count - a.count
	if n <= 0 || len(b.bounds) == 0 {
		return s
	}
	delta := make([]float64, len(b.buckets))
	for i := range b.buckets {
		delta[i] = b.buckets[i]
		if i < len(a.buckets) {
			delta[i] -= a.buckets[i]
		}
	}
	p50, p99 := quantile(b.bounds, delta, n, 0.5)*1000, quantile(b.bounds, delta, n, 0.99)*1000
	s.SendP50Ms, s.SendP99Ms = &p50, &p99
	return s
}

// quantile estimates the q-quantile from cumulative bucket counts (linear
// within a bucket, like PromQL's histogram_quantile); past the last bound it
// answers the last bound.
func quantile(bounds, cum []float64, total, q float64) float64 {
	rank := q * total
	lower, below := 0.0, 0.0
	for i, ub := range bounds {
		if cum[i] >= rank {
			in := cum[i] - below
			if in <= 0 {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/in
		}
		lower, below = ub, cum[i]
	}
	return bounds[len(bounds)-1]
}
