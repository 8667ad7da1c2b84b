package actor

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Runs scheduled one after another reuse one worker: the point of the pool
// (a kept goroutine keeps its grown stack).
func TestPoolDispatcherReusesAWorker(t *testing.T) {
	d := newPoolDispatcher(4, 16, 300, time.Hour)
	defer d.close()
	seen := map[string]bool{}
	for range 100 {
		done := make(chan string)
		d.Schedule(func() { done <- goroutineID() })
		seen[<-done] = true
		// The worker is back at the queue before the next run.
		waitFor(t, "the queue empty", func() bool { return len(d.queue) == 0 })
	}
	if len(seen) > 2 || d.workers.Load() > 2 {
		t.Fatalf("100 sequential runs ran on %d goroutines, %d workers: want 1 or 2", len(seen), d.workers.Load())
	}
}

// goroutineID is the calling goroutine's number, from its stack's header
// ("goroutine 42 [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := strings.Fields(string(buf))
	return f[1]
}

// Schedule never blocks, even with every worker busy and the queue full:
// the queued runs wait for a worker, and a run that finds the queue full
// gets a goroutine of its own.
func TestPoolDispatcherScheduleNeverBlocks(t *testing.T) {
	const workers, queue = 2, 3
	d := newPoolDispatcher(workers, queue, 300, time.Hour)
	release := make(chan struct{})
	var ran atomic.Int32
	var wg sync.WaitGroup
	const runs = workers + queue + 5
	wg.Add(runs)
	scheduled := make(chan struct{})
	go func() {
		for range runs {
			d.Schedule(func() {
				defer wg.Done()
				<-release
				ran.Add(1)
			})
		}
		close(scheduled)
	}()
	select {
	case <-scheduled:
	case <-time.After(10 * time.Second):
		t.Fatal("Schedule blocked behind busy workers")
	}
	if n := d.workers.Load(); n > workers {
		t.Fatalf("%d workers, the bound is %d", n, workers)
	}
	close(release)
	wg.Wait()
	if ran.Load() != runs {
		t.Fatalf("ran %d of %d", ran.Load(), runs)
	}
	d.close()
	waitFor(t, "no worker left", func() bool { return d.workers.Load() == 0 })
}

// With one worker, runs go in the order they were scheduled.
func TestPoolDispatcherRunsInOrder(t *testing.T) {
	d := newPoolDispatcher(1, 64, 300, time.Hour)
	defer d.close()
	var mu sync.Mutex
	var got []int
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		d.Schedule(func() {
			defer wg.Done()
			mu.Lock()
			got = append(got, i)
			mu.Unlock()
		})
	}
	wg.Wait()
	for i, v := range got {
		if v != i {
			t.Fatalf("run %d was the %dth scheduled: %v", i, v, got)
		}
	}
}

// close runs what is queued before the workers end, and a run scheduled
// after close still runs.
func TestPoolDispatcherCloseRunsTheQueue(t *testing.T) {
	d := newPoolDispatcher(1, 64, 300, time.Hour)
	block := make(chan struct{})
	var ran atomic.Int32
	d.Schedule(func() { <-block })
	for range 10 {
		d.Schedule(func() { ran.Add(1) })
	}
	d.close()
	close(block)
	waitFor(t, "the queue run, no worker left", func() bool { return ran.Load() == 10 && d.workers.Load() == 0 })
	done := make(chan struct{})
	d.Schedule(func() { close(done) })
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a run scheduled after close never ran")
	}
	waitFor(t, "no worker left", func() bool { return d.workers.Load() == 0 })
}

// A run that waits must not hold up the runs queued behind it: with every
// worker in a run that waits, a rescuer runs the queue.
func TestPoolDispatcherRescuesRunsBehindAWaitingOne(t *testing.T) {
	d := newPoolDispatcher(1, 64, 300, 5*time.Millisecond)
	defer d.close()
	release := make(chan struct{})
	defer close(release)
	d.Schedule(func() { <-release })
	var ran atomic.Int32
	for range 10 {
		d.Schedule(func() { ran.Add(1) })
	}
	waitFor(t, "the runs behind the waiting one", func() bool { return ran.Load() == 10 })
	if d.rescuers.Load() == 0 {
		t.Fatal("the runs ran without a rescuer: the one worker was not waiting")
	}
	if n := d.workers.Load(); n != 1 {
		t.Fatalf("%d workers, the bound is 1", n)
	}
}
