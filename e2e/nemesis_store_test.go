package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sequencer-im/sequencer/persist/citustest"
	"github.com/sequencer-im/sequencer/persist/mysql/mysqlurl"
	"github.com/sequencer-im/sequencer/persist/mysqltest"
)

// nemesisStore is the database of a nemesis cluster and how its nodes
// reach it through their proxies.
type nemesisStore struct {
	dsn    string // the store as the test reads it, directly
	target string // what a node's database proxy forwards to: host:port or unix:PATH
	// nodeDSN is node i's --store (i from 1), dialing the database at addr
	// (its proxy).
	nodeDSN func(i int, addr string) string
	// workers are proxies every node reaches the Citus workers through,
	// their links keyed by the node (citusNemesisStore); nil elsewhere.
	workers []*proxy
}

// pgNemesisStore is PostgreSQL at dsn (a TCP address).
func pgNemesisStore(t *testing.T, dsn string) nemesisStore {
	_, target := proxiedDSN(t, dsn, "127.0.0.1:1")
	return nemesisStore{dsn: dsn, target: target, nodeDSN: func(_ int, addr string) string {
		d, _ := proxiedDSN(t, dsn, addr)
		return d
	}}
}

// mysqlNemesisStore is a new MySQL (MariaDB) database of mysqltest. Its
// server may listen on a unix socket only (root over
// /run/mysqld/mysqld.sock): the proxies then forward to the socket, and
// each node dials its proxy over TCP with the same user (the server sees
// the proxy's connection, from this process's user, on its socket).
func mysqlNemesisStore(t *testing.T) nemesisStore {
	dsn := mysqltest.NewDatabase(t)
	cfg, err := mysqlurl.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	target := cfg.Addr
	if cfg.Net == "unix" {
		target = "unix:" + cfg.Addr
	}
	return nemesisStore{dsn: dsn, target: target, nodeDSN: func(_ int, addr string) string {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Del("socket")
		u.Host, u.RawQuery = addr, q.Encode()
		return u.String()
	}}
}

// citusNemesisStore is a new database of citustest's Citus cluster (a
// coordinator and two workers). A node reaches the coordinator through
// its own proxy, and the workers directly: at the host:port the
// coordinator's pg_dist_node names (its worker-direct commits and
// single-shard reads). So that a database cut of a node cuts those too,
// each worker is registered in this database (citus_update_node) at a
// proxy in front of it, whose links are keyed by the PostgreSQL startup
// message's application_name: node i's --store says application_name=ni,
// which its worker connections copy, and they land on the link of
// nodeSource(i), like its peer links. Every other connection to a worker
// (the coordinator's own, the workers' between themselves, the test's
// store, a node started without the name) has a link no fault touches.
//
// A database cut of node v (dbLinks) therefore cuts every connection
// node v has to any PostgreSQL server of the cluster, and nothing else:
// the coordinator still reaches the workers.
func citusNemesisStore(t *testing.T) nemesisStore {
	db := citustest.NewDatabase(t)
	st := pgNemesisStore(t, db.DSN())
	st.nodeDSN = func(i int, addr string) string {
		d, _ := proxiedDSN(t, db.DSN(), addr)
		u, err := url.Parse(d)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("application_name", fmt.Sprintf("n%d", i))
		u.RawQuery = q.Encode()
		return u.String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, w := range db.Workers {
		p, err := newKeyedProxy("->"+w.Name, w.Addr(), pgStartupKey)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		host, port, _ := net.SplitHostPort(p.Addr())
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(citus_update_node(nodeid, $3, $4::int))::int FROM pg_dist_node
			WHERE nodename = $1 AND nodeport = $2::int`, w.Host, w.Port, host, port).Scan(&n); err != nil || n != 1 {
			t.Fatalf("citus_update_node %s -> %s: %d nodes, %v", w.Addr(), p.Addr(), n, err)
		}
		st.workers = append(st.workers, p)
	}
	// citus_update_node left every worker's metadata out of sync until
	// Citus's maintenance daemon resyncs it; a node's migration before
	// then fails (SQLSTATE 55000, seen in CI).
	if err := db.SyncMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

// pgStartupKey reads a PostgreSQL connection's first message and keys it
// by its application_name: "ni" is nodeSource(i); anything else (another
// name, none, an SSL or GSS request first) is "", a link no fault names.
// It returns what it read, for the proxy to forward first.
func pgStartupKey(c net.Conn) (string, []byte) {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	head := make([]byte, 8)
	if _, err := io.ReadFull(c, head); err != nil {
		return "", nil
	}
	n := int(binary.BigEndian.Uint32(head))
	if binary.BigEndian.Uint32(head[4:]) != 3<<16 || n < 8 || n > 1<<16 {
		return "", head // not a v3 startup message: SSLRequest, GSSENCRequest, CancelRequest
	}
	msg := make([]byte, n)
	copy(msg, head)
	if _, err := io.ReadFull(c, msg[8:]); err != nil {
		return "", msg
	}
	fields := bytes.Split(msg[8:], []byte{0})
	for k := 0; k+1 < len(fields); k += 2 {
		if string(fields[k]) != "application_name" {
			continue
		}
		name := string(fields[k+1])
		if len(name) == 2 && name[0] == 'n' {
			if i, err := strconv.Atoi(name[1:]); err == nil && i >= 1 && i <= len(nemesisSources) {
				return nodeSource(i), msg
			}
		}
	}
	return "", msg
}

// checkWorkerLinks fails the test unless each of the first n nodes has a
// connection open to every Citus worker through the worker proxies (its
// link keyed by its application_name): else a database cut would not cut
// them. A no-op off Citus.
func (c *nemesisCluster) checkWorkerLinks(n int) {
	for _, w := range c.workers {
		for i := 1; i <= n; i++ {
			l := w.from(nodeSource(i))
			l.mu.Lock()
			open := len(l.conns)
			l.mu.Unlock()
			if open == 0 {
				c.t.Fatalf("n%d has no connection open to the Citus worker behind %s: its worker links do not pass the proxies", i, w.name)
			}
		}
	}
}
