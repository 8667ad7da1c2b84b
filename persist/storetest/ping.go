package storetest

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/persist"
)

// PingWithReadsHeld checks that s.Ping (behind /readyz and the node's
// store watch) answers while every connection of readers, s's read pool,
// is held, as by a burst of backlog reads: the database answers, so the
// store is reachable.
func PingWithReadsHeld(t *testing.T, s persist.Store, readers *sql.DB) {
	t.Helper()
	ctx := context.Background()
	held, err := readers.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if c, err := readers.Conn(short); err == nil {
		c.Close()
		t.Fatal("the read pool still had a free connection (size it 1): the test proves nothing")
	}
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer pcancel()
	if err := s.Ping(pctx); err != nil {
		t.Fatalf("ping with every read connection taken: %v", err)
	}
}
