package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
)

// Result is the measurement of one engine on one scenario.
type Result struct {
	Engine      string           `json:"engine"`
	EngineName  string           `json:"engine_name"`
	Scenario    string           `json:"scenario"`
	Senders     int              `json:"senders"`
	Convs       int              `json:"conversations"`
	Skew        float64          `json:"skew,omitempty"`
	Seconds     float64          `json:"seconds"`
	Messages    int64            `json:"messages"` // successful sends in the measurement
	Errors      int64            `json:"errors"`
	ErrorCodes  map[string]int64 `json:"error_codes,omitempty"`
	ErrorSample string           `json:"error_sample,omitempty"` // the first error seen
	Throughput  float64          `json:"messages_per_second"`
	Latency     LatencySummary   `json:"latency"`
	// MeanBatch is messages per store commit during the measurement (0:
	// the engine does not say).
	MeanBatch float64 `json:"mean_batch,omitempty"`
	// MeanCommitMs is the mean time of one store commit during the
	// measurement, as the engine timed it (0: not known).
	MeanCommitMs float64 `json:"mean_commit_ms,omitempty"`
	// CPUUsPerMsg is the CPU time of the process that sequences (CPUScope
	// says which: the server, or the bench process for an in-process
	// engine) over the measured window, per stored message, in
	// microseconds; CPUSeconds is that CPU time. 0: not measured.
	CPUUsPerMsg float64 `json:"cpu_us_per_msg,omitempty"`
	CPUSeconds  float64 `json:"cpu_seconds,omitempty"`
	CPUScope    string  `json:"cpu_scope,omitempty"`
	// PGCPUUsPerMsg is the CPU of the PostgreSQL servers (every process of
	// each postmaster) per stored message, in microseconds, and
	// PGCPUUsPerMsgBy the same by server ("postgres", or Citus's
	// "coordinator" and "worker HOST:PORT"). 0: not measured.
	PGCPUUsPerMsg   float64            `json:"pg_cpu_us_per_msg,omitempty"`
	PGCPUUsPerMsgBy map[string]float64 `json:"pg_cpu_us_per_msg_by,omitempty"`
	Memory          *MemoryResult      `json:"memory,omitempty"`
	// Feed is what the subscribers of a feed engine (e-sub, e-batch-sub)
	// saw during the measurement.
	Feed *FeedResult `json:"feed,omitempty"`
	// LoadAvg is the machine's 1-minute load average when the run started
	// (the bench shares its machine; a high value explains noise).
	LoadAvg float64 `json:"load_avg_1m"`
	// With --repeat: every measured run's throughput and p99 (in run order),
	// and how many runs failed. The other fields are the median run's.
	RunsThroughput []float64 `json:"runs_messages_per_second,omitempty"`
	RunsP99        []float64 `json:"runs_p99_ms,omitempty"`
	RunsPGCPU      []float64 `json:"runs_pg_cpu_us_per_msg,omitempty"` // PGCPUUsPerMsg of every measured run
	FailedRuns     int       `json:"failed_runs,omitempty"`
	Skipped        string    `json:"skipped,omitempty"`
	Interrupted    bool      `json:"interrupted,omitempty"`
}

// load is one run of a scenario's senders against an engine.
type load struct {
	eng      Engine
	sc       Scenario
	body     []byte
	convPfx  string // conversation ids: convPfx + k
	cmidPfx  string // client_msg_ids: cmidPfx + sender + "-" + n
	seed     uint64
	progress *progress

	lat       *Latency
	ok        atomic.Int64 // measured successes
	completed atomic.Int64 // every answered send, measured or not (progress)
	failed    atomic.Int64 // every failed send (progress)
	issued    atomic.Int64 // sends started (messages and touch-once modes)
	measuring atomic.Bool
	stop      atomic.Bool
	phase     atomic.Int32 // phaseWarmup, phaseMeasure, phaseDrain (progress line)

	errMu     sync.Mutex
	errCodes  map[string]int64
	errSample string
	errs      int64 // measured failures
}

const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseDrain
)

var phaseNames = [...]string{"warmup", "measure", "drain"}

// drainTimeout bounds how long the bench waits for in-flight sends after a
// run's end before canceling them.
const drainTimeout = time.Minute

// runLoad drives sc's senders against eng and measures them. In duration
// mode the first sc.Warmup is unmeasured; in messages and touch-once modes
// every send is measured. onMeasure, if set, is called when the measurement
// starts and ends (to read counters on the same boundaries).
func (l *load) run(ctx context.Context, onMeasure func(start bool)) (time.Duration, bool) {
	l.lat = NewLatency()
	l.errCodes = map[string]int64{}
	sendCtx, cancelSends := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelSends()

	var wg sync.WaitGroup
	done := make(chan struct{})
	counted := l.sc.Messages > 0 || l.sc.TouchOnce
	if counted || l.sc.Warmup <= 0 {
		if onMeasure != nil {
			onMeasure(true)
		}
		l.measuring.Store(true)
		l.phase.Store(phaseMeasure)
	}
	start := time.Now()
	for i := range l.sc.Senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.sender(sendCtx, i)
		}()
	}
	go func() { wg.Wait(); close(done) }()
	if l.progress != nil {
		l.progress.start(l, start)
		defer l.progress.finish()
	}

	interrupted := false
	var measureStart, measureEnd time.Time
	if counted {
		measureStart = start
		select {
		case <-done:
		case <-ctx.Done():
			interrupted = true
		}
		measureEnd = time.Now()
	} else {
		measureStart = start
		if l.sc.Warmup > 0 {
			select {
			case <-time.After(l.sc.Warmup):
			case <-ctx.Done():
				interrupted = true
			case <-done:
			}
			if onMeasure != nil {
				onMeasure(true)
			}
			measureStart = time.Now()
			l.measuring.Store(true)
			l.phase.Store(phaseMeasure)
		}
		if !interrupted {
			select {
			case <-time.After(l.sc.Duration):
			case <-ctx.Done():
				interrupted = true
			case <-done:
			}
		}
		measureEnd = time.Now()
	}
	l.measuring.Store(false)
	l.phase.Store(phaseDrain)
	l.stop.Store(true)
	if onMeasure != nil {
		onMeasure(false)
	}
	select {
	case <-done:
	case <-time.After(drainTimeout):
		cancelSends()
		<-done
	}
	return measureEnd.Sub(measureStart), interrupted
}

func (l *load) sender(ctx context.Context, i int) {
	picker := newConvPicker(l.sc, l.seed+uint64(i)*7919)
	uid := uint64(i + 1)
	cmid := l.cmidPfx + strconv.Itoa(i) + "-"
	for n := 1; !l.stop.Load(); n++ {
		var k int
		switch {
		case l.sc.TouchOnce:
			k = int(l.issued.Add(1)) - 1
			if k >= l.sc.Convs {
				return
			}
		case l.sc.Messages > 0:
			if l.issued.Add(1) > l.sc.Messages {
				return
			}
			k = picker.next()
		default:
			k = picker.next()
		}
		req := sequencer.SendRequest{
			ConvID:      convID(l.convPfx, k),
			FromUID:     uid,
			ClientMsgID: cmid + strconv.Itoa(n),
			MsgType:     sequencer.DefaultMsgType,
			Body:        l.body,
		}
		t0 := time.Now()
		_, err := l.eng.Send(ctx, req)
		d := time.Since(t0)
		l.completed.Add(1)
		if err != nil {
			l.failed.Add(1)
		}
		if !l.measuring.Load() {
			continue
		}
		if err != nil {
			l.recordError(err)
			continue
		}
		l.ok.Add(1)
		l.lat.Record(i, d)
	}
}

func (l *load) recordError(err error) {
	code := errorCode(err)
	l.errMu.Lock()
	l.errs++
	l.errCodes[code]++
	if l.errSample == "" {
		l.errSample = err.Error()
	}
	l.errMu.Unlock()
}

// errorCode names an error's class for the report: the domain or RPC code
// when there is one.
func errorCode(err error) string {
	var ce *connect.Error
	var se *sequencer.Error
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.As(err, &ce):
		return ce.Code().String()
	case errors.As(err, &se):
		return se.Code.String()
	}
	return "error"
}

// progress prints a live line (messages/s, errors) while a load runs.
type progress struct {
	w        io.Writer
	tty      bool
	interval time.Duration
	label    string

	stopc chan struct{}
	wg    sync.WaitGroup
}

func (p *progress) start(l *load, t0 time.Time) {
	p.stopc = make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(p.interval)
		defer t.Stop()
		last, lastAt := int64(0), t0
		for {
			select {
			case <-p.stopc:
				if p.tty {
					fmt.Fprint(p.w, "\r\033[K")
				}
				return
			case now := <-t.C:
				c := l.completed.Load()
				rate := float64(c-last) / now.Sub(lastAt).Seconds()
				last, lastAt = c, now
				phase := phaseNames[l.phase.Load()]
				line := fmt.Sprintf("%-24s %6.1fs %-7s %10s msg/s  sent %s  errors %s",
					p.label, now.Sub(t0).Seconds(), phase, fmtInt(int64(rate)), fmtInt(c), fmtInt(l.failed.Load()))
				if p.tty {
					fmt.Fprint(p.w, "\r\033[K"+line)
				} else {
					fmt.Fprintln(p.w, line)
				}
			}
		}
	}()
}

func (p *progress) finish() {
	close(p.stopc)
	p.wg.Wait()
}
