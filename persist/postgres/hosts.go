package postgres

import (
	"context"
	"net"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// hostPreference makes new connections of a multi-host DSN
// (postgres://h1,h2/db?target_session_attrs=read-write) try first the host
// the newest connection was made to. pgx tries the hosts in DSN order for
// every new connection; after a failover to h2, a silent h1 (frozen, or cut
// off without a reset) would cost ConnectTimeout on every new connection.
// With the preference it costs that once, until the first connection to h2
// succeeds. The other hosts keep their order after the preferred one, so
// when h2 is lost in turn the others are tried as before.
type hostPreference struct {
	mu   sync.Mutex
	last string              // "ip:port" of the newest established connection
	ips  map[string][]string // host name -> addresses it resolved to last
}

func newHostPreference() *hostPreference {
	return &hostPreference{ips: map[string][]string{}}
}

// lookup wraps a resolver, remembering what each host name resolved to (so a
// connection's remote address can be traced back to a DSN host).
func (h *hostPreference) lookup(next pgconn.LookupFunc) pgconn.LookupFunc {
	return func(ctx context.Context, host string) ([]string, error) {
		addrs, err := next(ctx, host)
		if err == nil {
			h.mu.Lock()
			h.ips[host] = addrs
			h.mu.Unlock()
		}
		return addrs, err
	}
}

// connected records the server address of an established connection.
func (h *hostPreference) connected(c net.Conn) {
	if c == nil {
		return
	}
	a := c.RemoteAddr()
	if a == nil || a.Network() != "tcp" {
		return
	}
	h.mu.Lock()
	h.last = a.String()
	h.mu.Unlock()
}

// order moves the hosts of cfg that match the preferred address to the
// front, keeping the relative order of the rest (and of a host's TLS and
// plain entries).
func (h *hostPreference) order(cfg *pgconn.Config) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == "" || len(cfg.Fallbacks) == 0 {
		return
	}
	all := append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
	var first, rest []*pgconn.FallbackConfig
	for _, f := range all {
		if h.matchesLocked(f) {
			first = append(first, f)
		} else {
			rest = append(rest, f)
		}
	}
	if len(first) == 0 {
		return
	}
	all = append(first, rest...)
	cfg.Host, cfg.Port, cfg.TLSConfig = all[0].Host, all[0].Port, all[0].TLSConfig
	cfg.Fallbacks = all[1:]
}

func (h *hostPreference) matchesLocked(f *pgconn.FallbackConfig) bool {
	port := strconv.Itoa(int(f.Port))
	if net.JoinHostPort(f.Host, port) == h.last {
		return true
	}
	for _, ip := range h.ips[f.Host] {
		if net.JoinHostPort(ip, port) == h.last {
			return true
		}
	}
	return false
}
