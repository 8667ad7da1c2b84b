package server

import (
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/cluster"
)

func TestConfigDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.Listen != "127.0.0.1:7070" || c.Store != "./data" || c.NodeID == "" || c.API.MaxBody != 65536 ||
		c.Cluster.MemberTTL != 1500*time.Millisecond || c.Cluster.Heartbeat != 250*time.Millisecond || c.Cluster.Ring.Partitions != 271 {
		t.Fatalf("defaults: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults must validate: %v", err)
	}
	if a, b := (Config{}).WithDefaults().NodeID, (Config{}).WithDefaults().NodeID; a == b {
		t.Fatalf("generated node ids repeat: %s", a)
	}
}

func TestConfigValidation(t *testing.T) {
	for name, tc := range map[string]struct {
		mod  func(*Config)
		want string
	}{
		"plain cluster port on all interfaces": {func(c *Config) { c.Store = "postgres://h/x"; c.Cluster.ClusterListen = "0.0.0.0:7171" }, "cluster-insecure"},
		"cluster tls incomplete": {func(c *Config) {
			c.Store, c.Cluster.ClusterListen, c.Cluster.TLSCertFile = "postgres://h/x", "10.0.0.1:7171", "node.pem"
		}, "go together"},
		"bad listen":           {func(c *Config) { c.Listen = "nope" }, "listen"},
		"cluster on embedded":  {func(c *Config) { c.Cluster.ClusterListen = "127.0.0.1:7171" }, "PostgreSQL"},
		"ttl under 2 beats":    {func(c *Config) { c.Cluster.MemberTTL = 2 * time.Second; c.Cluster.Heartbeat = time.Second }, "member-ttl"},
		"negative workers":     {func(c *Config) { c.Actors.Commit.Workers = -1 }, "commit-workers"},
		"body too large":       {func(c *Config) { c.API.MaxBody = 1 << 30 }, "max-body"},
		"node id too long":     {func(c *Config) { c.NodeID = strings.Repeat("n", 65) }, "node-id"},
		"negative drain bound": {func(c *Config) { c.DrainTimeout = -time.Second }, "drain-timeout"},
		"retention too short":  {func(c *Config) { c.Retention = 30 * time.Minute }, "retention"},
	} {
		c := Config{}.WithDefaults()
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error about %s", name, err, tc.want)
		}
	}
	ok := Config{Store: "postgres://postgres@127.0.0.1/x", Cluster: cluster.Config{ClusterListen: "127.0.0.1:0"}}.WithDefaults()
	if err := ok.Validate(); err != nil {
		t.Fatalf("cluster on PostgreSQL: %v", err)
	}
	my := Config{Store: "mysql://root@localhost/x?socket=/run/mysqld/mysqld.sock", Cluster: cluster.Config{ClusterListen: "127.0.0.1:0"}}.WithDefaults()
	if err := my.Validate(); err != nil {
		t.Fatalf("cluster on MySQL: %v", err)
	}
	for _, bad := range []string{"mysql://root@/x", "root:pw@tcp(db)/x", "MYSQL://db/x"} {
		if err := (Config{Store: bad}).WithDefaults().Validate(); err == nil || strings.Contains(err.Error(), "pw@") {
			t.Errorf("store %q: %v, want a refusal without the password", bad, err)
		}
	}
	for _, c := range []Config{
		{Store: "postgres://h/x", Cluster: cluster.Config{ClusterListen: "0.0.0.0:7171", Insecure: true}},
		{Store: "postgres://h/x", Cluster: cluster.Config{ClusterListen: "0.0.0.0:7171", TLSCertFile: "a", TLSKeyFile: "b", TLSCAFile: "c"}},
		{Store: "postgres://h/x", Cluster: cluster.Config{ClusterListen: "localhost:7171"}},
	} {
		if err := c.WithDefaults().Validate(); err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
	}
}

func TestRedactHidesPassword(t *testing.T) {
	got := Redact("postgres://u:secret@127.0.0.1:5432/db")
	if strings.Contains(got, "secret") {
		t.Fatalf("Redact leaked the password: %s", got)
	}
	for _, dsn := range []string{"mysql://u:secret@db:3306/x", "u:secret@tcp(db:3306)/x"} {
		if got := Redact(dsn); strings.Contains(got, "secret") {
			t.Fatalf("Redact leaked the password: %s", got)
		}
	}
	if Redact("./data") != "./data" {
		t.Fatal("a path is not a secret")
	}
}
