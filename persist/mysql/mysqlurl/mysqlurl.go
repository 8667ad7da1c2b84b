// Package mysqlurl parses the mysql:// URL form of --store into
// github.com/go-sql-driver/mysql's configuration. It owns that spelling and
// nothing else (no connections).
package mysqlurl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"
)

// Parse turns a mysql:// URL into the driver's configuration:
//
//	mysql://user:pass@host:port/db?param=value
//	mysql://user@localhost/db?socket=/run/mysqld/mysqld.sock
//
// The port defaults to 3306. socket=PATH connects to a unix socket instead
// of host:port. tls (true, false, skip-verify, preferred) and other
// parameters of github.com/go-sql-driver/mysql's DSN are passed on; the
// settings the store relies on (UTC, multi statements, parameter
// interpolation, found rows) are forced.
func Parse(raw string) (*gomysql.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("not a valid mysql:// URL")
	}
	if u.Scheme != "mysql" {
		return nil, fmt.Errorf("scheme %q is not mysql", u.Scheme)
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, errors.New("the URL must name one database: mysql://user:pass@host:port/db")
	}
	q := u.Query()
	socket := q.Get("socket")
	q.Del("socket")
	cfg := gomysql.NewConfig()
	if len(q) > 0 {
		// The driver parses its own parameters (tls, timeouts, ...).
		parsed, err := gomysql.ParseDSN("/" + url.PathEscape(db) + "?" + q.Encode())
		if err != nil {
			return nil, fmt.Errorf("parameters: %v", err)
		}
		cfg = parsed
	}
	cfg.DBName = db
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	if socket != "" {
		cfg.Net, cfg.Addr = "unix", socket
	} else {
		host := u.Hostname()
		if host == "" {
			return nil, errors.New("the URL names no host (use ?socket=PATH for a unix socket)")
		}
		port := u.Port()
		if port == "" {
			port = "3306"
		}
		cfg.Net, cfg.Addr = "tcp", net.JoinHostPort(host, port)
	}
	return cfg, nil
}
