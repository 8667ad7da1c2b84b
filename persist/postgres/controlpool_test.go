package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer/cluster/membership"
)

// Commits and reads that take every connection of the main pool cannot
// starve the worker-id lease or the membership heartbeat: those run on the
// control pool.
func TestControlPoolNotStarvedByReads(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	lease, err := s.AcquireWorker(ctx, "node-a", time.Now(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cs := s.Cluster()
	m := membership.Member{NodeID: "a", Incarnation: "a/1", ClusterAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2"}
	if _, err := cs.Join(ctx, m, 10*time.Second, false); err != nil {
		t.Fatal(err)
	}
	// Hold every connection of the main pool, as a read burst would.
	var held []interface{ Release() }
	for range s.pool.Config().MaxConns {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := s.pool.Acquire(short); err == nil {
		t.Fatal("the main pool had a free connection: the test proves nothing")
	}
	ctx2, cancel2 := context.WithTimeout(ctx, 3*time.Second)
	defer cancel2()
	if _, err := cs.Heartbeat(ctx2, m.NodeID, m.Incarnation, 10*time.Second); err != nil {
		t.Fatalf("heartbeat with the main pool exhausted: %v", err)
	}
	if _, err := s.RenewWorker(ctx2, lease, time.Now().UnixMilli()+5000, time.Now(), 10*time.Second); err != nil {
		t.Fatalf("worker lease renewal with the main pool exhausted: %v", err)
	}
}
