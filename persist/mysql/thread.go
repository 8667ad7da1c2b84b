package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// A commit is one round trip (commit.go), so it cannot read its server
// thread id (CONNECTION_ID()) before COMMIT may run: if the connection is
// lost in that round trip, the id is needed to settle the outcome
// (settle.go). So every connection of the commit pool reads its id once,
// when it opens, and carries it.

// driverConn is what go-sql-driver's connection implements and
// database/sql uses; threadConn forwards all of it.
type driverConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
	driver.NamedValueChecker
}

// threadConn is a driver connection and its server thread id.
type threadConn struct {
	driverConn
	thread uint64
}

// threadConnector opens threadConns.
type threadConnector struct{ driver.Connector }

func (c threadConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	full, ok := dc.(driverConn)
	if !ok {
		dc.Close()
		return nil, fmt.Errorf("mysql: the driver's connection %T lacks a method database/sql uses", dc)
	}
	thread, err := connectionID(ctx, full)
	if err != nil {
		dc.Close()
		return nil, err
	}
	return &threadConn{driverConn: full, thread: thread}, nil
}

func connectionID(ctx context.Context, c driver.QueryerContext) (uint64, error) {
	rows, err := c.QueryContext(ctx, "SELECT CONNECTION_ID()", nil)
	if err != nil {
		return 0, fmt.Errorf("mysql: read the connection's thread id: %w", err)
	}
	defer rows.Close()
	v := make([]driver.Value, 1)
	if err := rows.Next(v); err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("no row")
		}
		return 0, fmt.Errorf("mysql: read the connection's thread id: %w", err)
	}
	switch x := v[0].(type) {
	case int64:
		return uint64(x), nil
	case uint64:
		return x, nil
	case []byte:
		return strconv.ParseUint(string(x), 10, 64)
	}
	return 0, fmt.Errorf("mysql: the connection's thread id is a %T", v[0])
}

// threadOf returns the server thread id of a commit-pool connection.
func threadOf(conn *sql.Conn) (uint64, error) {
	var thread uint64
	err := conn.Raw(func(dc any) error {
		tc, ok := dc.(*threadConn)
		if !ok {
			return fmt.Errorf("mysql: a commit connection without its thread id (%T)", dc)
		}
		thread = tc.thread
		return nil
	})
	return thread, err
}
