package server

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/actor"
	"github.com/sequencer-im/sequencer/api"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/cluster"
	"github.com/sequencer-im/sequencer/commit"
	"github.com/sequencer-im/sequencer/idgen"
	"github.com/sequencer-im/sequencer/internal/conf"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/ring"
)

// Every component's DefaultConfig validates (cluster's once its required
// fields are set: it has no default node id, store or address).
func TestEveryDefaultConfigValidates(t *testing.T) {
	for name, err := range map[string]error{
		"commit":            commit.DefaultConfig().Validate(),
		"actor":             actor.DefaultConfig().Validate(),
		"api":               api.DefaultConfig().Validate(),
		"idgen issuer":      idgen.DefaultIssuerConfig().Validate(),
		"idgen (worker 0)":  idgen.Config{}.Validate(),
		"server":            DefaultConfig().Validate(),
		"server (defaults)": Config{}.WithDefaults().Validate(),
	} {
		if err != nil {
			t.Errorf("%s: DefaultConfig().Validate() = %v", name, err)
		}
	}
	if _, err := ring.New(nil, ring.DefaultConfig()); err != nil {
		t.Errorf("ring: %v", err)
	}
	c := cluster.DefaultConfig()
	err := c.Validate()
	if got := conf.Fields(err); !slices.Equal(got, []string{"NodeID", "Store", "ClusterListen"}) {
		t.Errorf("cluster.DefaultConfig() alone: errors on %v (%v), want only the required NodeID, Store, ClusterListen", got, err)
	}
	c.NodeID, c.Store, c.ClusterListen = "n1", membership.NewMem(clock.NewFake(time.Now())), "127.0.0.1:0"
	if err := c.Validate(); err != nil {
		t.Errorf("cluster: DefaultConfig() with the required fields: %v", err)
	}
}

// The node's defaults are the components' defaults: the parts of
// DefaultConfig that server hands to each component equal the component's
// DefaultConfig field by field (no number is restated in server).
func TestServerDefaultsAreTheComponentsDefaults(t *testing.T) {
	d := DefaultConfig()
	same := func(name string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: server's defaults give\n %+v\nthe component's DefaultConfig is\n %+v", name, got, want)
		}
	}
	same("actor", d.Actors, actor.DefaultConfig())
	same("commit", d.Actors.Commit, commit.DefaultConfig())
	same("api", d.API, api.DefaultConfig())
	same("cluster", d.Cluster, cluster.DefaultConfig())
	same("idgen issuer", d.IDs, idgen.DefaultIssuerConfig())

	// What Start hands each component: its Config plus the node-wide
	// values, nothing restated.
	pc := d.apiConfig()
	same("api (handed over)", pc, api.DefaultConfig())
	cc := d.clusterConfig()
	cc.NodeID = ""
	same("cluster (handed over)", cc, cluster.DefaultConfig())
	lc := d.issuerConfig()
	same("idgen issuer (handed over)", lc, idgen.DefaultIssuerConfig())

	// WithDefaults fills from DefaultConfig and generates only the node id.
	w := Config{}.WithDefaults()
	if w.NodeID == "" {
		t.Fatal("no node id generated")
	}
	w.NodeID = ""
	same("WithDefaults", w, d)
}

// Each bad field is rejected by its component's Validate with a message
// naming the component and the field, and by nothing else.
func TestComponentValidateNamesTheBadField(t *testing.T) {
	type tc struct {
		err   error
		field string
	}
	mod := func(c actor.Config, f func(*actor.Config)) actor.Config { f(&c); return c }
	a := actor.DefaultConfig()
	mc := func(f func(*commit.Config)) error { c := commit.DefaultConfig(); f(&c); return c.Validate() }
	ma := func(f func(*actor.Config)) error { return mod(a, f).Validate() }
	mp := func(f func(*api.Config)) error { c := api.DefaultConfig(); f(&c); return c.Validate() }
	ml := func(f func(*idgen.IssuerConfig)) error { c := idgen.DefaultIssuerConfig(); f(&c); return c.Validate() }
	mcl := func(f func(*cluster.Config)) error {
		c := cluster.DefaultConfig()
		c.NodeID, c.Store, c.ClusterListen = "n1", membership.NewMem(clock.NewFake(time.Now())), "127.0.0.1:0"
		f(&c)
		return c.Validate()
	}
	for name, c := range map[string]tc{
		"commit: no workers":         {mc(func(c *commit.Config) { c.Workers = 0 }), "commit: Workers"},
		"commit: negative rows":      {mc(func(c *commit.Config) { c.MaxMessages = -1 }), "commit: MaxMessages"},
		"commit: no timeout":         {mc(func(c *commit.Config) { c.Timeout = 0 }), "commit: Timeout"},
		"actor: no passivation":      {ma(func(c *actor.Config) { c.PassivateAfter = -time.Second }), "actor: PassivateAfter"},
		"actor: per-conv queue":      {ma(func(c *actor.Config) { c.MaxQueuePerConv = 0 }), "actor: MaxQueuePerConv"},
		"actor: pending":             {ma(func(c *actor.Config) { c.MaxPending = -5 }), "actor: MaxPending"},
		"actor: pending bytes":       {ma(func(c *actor.Config) { c.MaxPendingBytes = 0 }), "actor: MaxPendingBytes"},
		"actor: conversations":       {ma(func(c *actor.Config) { c.MaxConversations = 0 }), "actor: MaxConversations"},
		"actor: floors":              {ma(func(c *actor.Config) { c.MaxFloors = -1 }), "actor: MaxFloors"},
		"actor: commit workers":      {ma(func(c *actor.Config) { c.Commit.Workers = 0 }), "actor: Commit.Workers"},
		"actor: batch messages":      {ma(func(c *actor.Config) { c.Commit.MaxMessages = -1 }), "actor: Commit.MaxMessages"},
		"actor: commit timeout":      {ma(func(c *actor.Config) { c.Commit.Timeout = 0 }), "actor: Commit.Timeout"},
		"api: body zero":             {mp(func(c *api.Config) { c.MaxBody = 0 }), "api: MaxBody"},
		"api: body huge":             {mp(func(c *api.Config) { c.MaxBody = 1 << 30 }), "api: MaxBody"},
		"api: batch tiny":            {mp(func(c *api.Config) { c.MaxBatchBytes = 100 }), "api: MaxBatchBytes"},
		"idgen: ttl zero":            {ml(func(c *idgen.IssuerConfig) { c.TTL = 0 }), "idgen: TTL"},
		"idgen: reserve past ttl":    {ml(func(c *idgen.IssuerConfig) { c.ReserveAhead = time.Minute }), "idgen: ReserveAhead"},
		"idgen: negative renew":      {ml(func(c *idgen.IssuerConfig) { c.RenewEvery = -1 }), "idgen: RenewEvery"},
		"idgen: worker id":           {idgen.Config{WorkerID: 1024}.Validate(), "idgen: WorkerID"},
		"cluster: ttl under 2 beats": {mcl(func(c *cluster.Config) { c.MemberTTL = 500 * time.Millisecond }), "cluster: MemberTTL"},
		"cluster: no heartbeat":      {mcl(func(c *cluster.Config) { c.Heartbeat = 0 }), "cluster: Heartbeat"},
		"cluster: handoff":           {mcl(func(c *cluster.Config) { c.HandoffWait = -1 }), "cluster: HandoffWait"},
		"cluster: forward":           {mcl(func(c *cluster.Config) { c.ForwardTimeout = 0 }), "cluster: ForwardTimeout"},
		"cluster: stop":              {mcl(func(c *cluster.Config) { c.StopTimeout = 0 }), "cluster: StopTimeout"},
		"cluster: body":              {mcl(func(c *cluster.Config) { c.MaxBody = -1 }), "cluster: MaxBody"},
		"cluster: ring":              {mcl(func(c *cluster.Config) { c.Ring.Partitions = -1 }), "cluster: Ring"},
		"cluster: node id slash":     {mcl(func(c *cluster.Config) { c.NodeID = "a/b" }), "cluster: NodeID"},
		"cluster: plain non-loopback": {mcl(func(c *cluster.Config) { c.ClusterListen = "10.1.2.3:7171" }),
			"cluster: ClusterListen"},
	} {
		if c.err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if fs := conf.Fields(c.err); len(fs) != 1 {
			t.Errorf("%s: %d errors %v (%v), want one", name, len(fs), fs, c.err)
		}
		if !strings.HasPrefix(c.err.Error(), c.field+" ") && !strings.HasPrefix(c.err.Error(), c.field+":") {
			t.Errorf("%s: %q does not start with %q", name, c.err, c.field)
		}
	}
}

// Every numeric setting of the node, set to 0 or a negative value, is
// refused by Validate with one error naming its flag (Start fills zeros
// with WithDefaults first; `serve --max-pending 0` is an error).
func TestServerValidateNamesTheFlag(t *testing.T) {
	for flag, set := range map[string]func(*Config, int){
		"max-body":            func(c *Config, v int) { c.API.MaxBody = v },
		"max-batch-bytes":     func(c *Config, v int) { c.API.MaxBatchBytes = v },
		"passivate-after":     func(c *Config, v int) { c.Actors.PassivateAfter = time.Duration(v) },
		"commit-workers":      func(c *Config, v int) { c.Actors.Commit.Workers = v },
		"max-batch-messages":  func(c *Config, v int) { c.Actors.Commit.MaxMessages = v },
		"max-queue-per-conv":  func(c *Config, v int) { c.Actors.MaxQueuePerConv = v },
		"max-pending":         func(c *Config, v int) { c.Actors.MaxPending = v },
		"max-pending-bytes":   func(c *Config, v int) { c.Actors.MaxPendingBytes = int64(v) },
		"max-conversations":   func(c *Config, v int) { c.Actors.MaxConversations = v },
		"store-conns":         func(c *Config, v int) { c.StoreConns = v },
		"store-control-conns": func(c *Config, v int) { c.StoreControlConns = v },
		"commit-timeout":      func(c *Config, v int) { c.Actors.Commit.Timeout = time.Duration(v) },
		"worker-lease-ttl":    func(c *Config, v int) { c.IDs.TTL = time.Duration(v) },
		"drain-timeout":       func(c *Config, v int) { c.DrainTimeout = time.Duration(v) },
		"member-ttl":          func(c *Config, v int) { c.Cluster.MemberTTL = time.Duration(v) },
		"heartbeat":           func(c *Config, v int) { c.Cluster.Heartbeat = time.Duration(v) },
		"partitions":          func(c *Config, v int) { c.Cluster.Ring.Partitions = v },
		"handoff-wait":        func(c *Config, v int) { c.Cluster.HandoffWait = time.Duration(v) },
		"RetentionEvery":      func(c *Config, v int) { c.RetentionEvery = time.Duration(v) },
		"retention":           func(c *Config, v int) { c.Retention = time.Duration(v) },
	} {
		for _, v := range []int{0, -1} {
			if flag == "retention" && v == 0 {
				continue // 0 keeps everything
			}
			c := DefaultConfig()
			set(&c, v)
			err := c.Validate()
			if err == nil {
				t.Errorf("%s %d: accepted", flag, v)
				continue
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, flag+" ") || strings.Contains(msg, "\n") {
				// A heartbeat of 0 also breaks nothing else: the TTL rule
				// needs a positive heartbeat.
				t.Errorf("%s %d: %q, want one error starting with the flag", flag, v, msg)
			}
		}
	}
	c := DefaultConfig()
	c.StoreCommitConns = -1 // 0 means one per commit worker
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "store-commit-conns -1") {
		t.Errorf("store-commit-conns -1: %v", err)
	}
	c = DefaultConfig()
	c.Cluster.MemberTTL, c.Cluster.Heartbeat = 2*time.Second, time.Second
	if err := c.Validate(); err == nil || err.Error() != "member-ttl 2s: must exceed twice heartbeat (1s)" {
		t.Errorf("ttl vs heartbeat: %v", err)
	}
	c = DefaultConfig()
	c.Cluster.Ring.Partitions = ring.MaxPartitions + 1
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "partitions ") {
		t.Errorf("too many partitions: %v", err)
	}
	c = DefaultConfig()
	c.Store, c.Cluster.ClusterListen, c.NodeID = "postgres://h/x", "127.0.0.1:0", "a/b"
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "node-id ") {
		t.Errorf("cluster node id with '/': %v", err)
	}
}

type noStore struct{ persist.Store } // never called: the config is refused first

type noIDs struct{}

func (noIDs) NextID() (uint64, error) { return 0, nil }

// The constructors fill a zero field from DefaultConfig and refuse a
// negative one (it used to be read as the default) with the field's name.
func TestConstructorsRefuseNegativeFields(t *testing.T) {
	w, err := commit.New(commit.Config{Store: noStore{}})
	if err != nil {
		t.Fatalf("commit.New with zero fields: %v", err)
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := commit.New(commit.Config{Store: noStore{}, MaxMessages: -1}); err == nil ||
		!strings.Contains(err.Error(), "commit: MaxMessages -1") {
		t.Errorf("commit.New(MaxMessages -1): %v", err)
	}
	if _, err := actor.NewConversations(actor.Config{Store: noStore{}, IDs: noIDs{}, MaxPending: -1}); err == nil ||
		!strings.Contains(err.Error(), "actor: MaxPending -1") {
		t.Errorf("actor.NewConversations(MaxPending -1): %v", err)
	}
	if _, err := actor.NewConversations(actor.Config{Store: noStore{}, IDs: noIDs{}, Commit: commit.Config{Timeout: -time.Second}}); err == nil ||
		!strings.Contains(err.Error(), "actor: Commit.Timeout -1s") {
		t.Errorf("actor.NewConversations(CommitTimeout -1s): %v", err)
	}
	if _, err := idgen.New(idgen.Config{WorkerID: -1}); err == nil || !strings.Contains(err.Error(), "idgen: WorkerID -1") {
		t.Errorf("idgen.New(WorkerID -1): %v", err)
	}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "api: MaxBody -1") {
				t.Errorf("api.NewService(MaxBody -1): recovered %v, want a panic naming MaxBody", r)
			}
		}()
		api.NewService(api.Config{Sender: noSender{}, Reader: noStore{}, MaxBody: -1})
	}()
}

type noSender struct{ api.Sender }
