package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sequencer-im/sequencer/persist"
)

// TestOutboxStatementsPlanWithTheirArrays: the advance and the sweep name
// their conversations twice (a join on unnest and conv_id = ANY, which
// lets Citus route them). In a plan made for the arrays at hand the ANY is
// a hashed lookup; in PostgreSQL's generic plan of a prepared statement,
// which it takes after five executions on a connection, it is a linear
// scan of the array for every outbox row: 0.5-1.3 s instead of 15 ms for
// 7,000 conversations, with commits waiting on the locked rows meanwhile.
// Every execution must be planned with its arguments (pg_prepared_statements
// counts the plans of each statement on the connection).
func TestOutboxStatementsPlanWithTheirArrays(t *testing.T) {
	ctx := context.Background()
	s, _ := newStoreWith(t, Options{MaxConns: 1}) // every call on one connection
	const convs = 2000
	ids := make([]string, convs)
	parts := make([]int64, convs)
	for i := range ids {
		ids[i], parts[i] = fmt.Sprintf("plan-%05d", i), int64(i%64)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO feed_outbox (part, conv_id, published)
		SELECT * FROM unnest($1::int8[], $2::text[], array_fill(0::int8, array[$3::int]))`, parts, ids, convs); err != nil {
		t.Fatal(err)
	}
	const calls = 8
	for k := 1; k <= calls; k++ {
		moves := make([]persist.OutboxMove, convs)
		keys := make([]persist.OutboxKey, convs)
		for i := range moves {
			moves[i] = persist.OutboxMove{Partition: uint32(parts[i]), ConvID: ids[i], To: uint64(k)}
			keys[i] = persist.OutboxKey{Partition: uint32(parts[i]), ConvID: ids[i]}
		}
		if err := s.OutboxAdvance(ctx, moves); err != nil {
			t.Fatalf("advance %d: %v", k, err)
		}
		// The conversations have no head rows: the sweep deletes nothing.
		if err := s.OutboxSweep(ctx, keys); err != nil {
			t.Fatalf("sweep %d: %v", k, err)
		}
	}
	var raised int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM feed_outbox WHERE published = $1`, calls).Scan(&raised); err != nil {
		t.Fatal(err)
	}
	if raised != convs {
		t.Fatalf("%d of %d rows raised to %d", raised, convs, calls)
	}

	rows, err := s.pool.Query(ctx, `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := map[string]string{OutboxLockSQL: "lock", OutboxRaiseSQL: "raise", OutboxSweepSQL: "sweep"}
	seen := map[string]bool{}
	for rows.Next() {
		var stmt string
		var generic, custom int64
		if err := rows.Scan(&stmt, &generic, &custom); err != nil {
			t.Fatal(err)
		}
		name, ok := want[strings.TrimSpace(stmt)]
		if !ok {
			continue
		}
		seen[name] = true
		t.Logf("%s: %d generic plans, %d custom plans", name, generic, custom)
		if generic != 0 || custom != calls {
			t.Errorf("%s: %d generic and %d custom plans in %d executions; want every one planned with its arrays", name, generic, custom, calls)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range want {
		if !seen[name] {
			t.Errorf("the %s statement was not prepared on the connection", name)
		}
	}
}
