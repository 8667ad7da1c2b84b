package sqltable

import (
	"context"
	"database/sql"
	"errors"
)

// TxConn is Conn over a database/sql transaction (any database/sql driver).
type TxConn struct{ Tx *sql.Tx }

var _ Conn = TxConn{}

// Exec implements Conn.
func (c TxConn) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := c.Tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// Query implements Conn.
func (c TxConn) Query(ctx context.Context, q string, args []any, row func(scan func(...any) error) error) error {
	rows, err := c.Tx.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return EachRow(rows.Next, rows.Scan, rows.Err, row)
}

// EachRow calls row for every row of a driver's result (next, scan, err:
// its methods), then returns its error (a Conn's Query).
func EachRow(next func() bool, scan func(...any) error, err func() error, row func(scan func(...any) error) error) error {
	for next() {
		if err := row(scan); err != nil {
			return err
		}
	}
	return err()
}

// Found is a QueryRow's answer for the error of its scan, noRows being the
// driver's error for a query without rows.
func Found(err, noRows error) (bool, error) {
	if errors.Is(err, noRows) {
		return false, nil
	}
	return err == nil, err
}

// QueryRow implements Conn.
func (c TxConn) QueryRow(ctx context.Context, q string, args []any, dst ...any) (bool, error) {
	return Found(c.Tx.QueryRowContext(ctx, q, args...).Scan(dst...), sql.ErrNoRows)
}
