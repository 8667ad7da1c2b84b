package clock

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"
)

// TestOffsetFileEnv, for tests only, names a file whose content is an offset
// (a Go duration: "5s", "-30s", "0"; an empty or missing file is 0) that a
// node adds to its wall clock, re-read every TestOffsetPoll and written
// with WriteOffset: the e2e tests
// step one node's clock with it (docs/TESTING.md "Clock jumps"). Never set
// it in production; unset, nothing reads it and the node runs on Real.
const TestOffsetFileEnv = "SEQUENCER_TEST_CLOCK_OFFSET_FILE"

// WriteOffset writes content to an offset file at once (a temporary file
// renamed over it), so that a reader never sees it half written.
func WriteOffset(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// TestOffsetPoll is how often a node with TestOffsetFileEnv set re-reads
// the file.
const TestOffsetPoll = 20 * time.Millisecond

// Stepped is the real clock with a wall-clock offset that may change while
// the process runs, as an NTP step (or `date -s`) changes a host's clock.
// Like Go on a stepped host, only the wall reading moves: Now's Unix,
// UnixMilli and Format (what goes into msg_ids, server_at and a database)
// are the host's plus the offset, while its monotonic reading is the host's,
// so durations between two readings (Sub, Before, After, Equal,
// time.Since), sleeps and timers do not see a step. For tests
// (TestOffsetFileEnv); safe for concurrent use.
type Stepped struct {
	off atomic.Int64 // nanoseconds added to the wall reading
}

// Now is time.Now with the offset added to its wall reading only.
func (s *Stepped) Now() time.Time { return shiftWall(time.Now(), time.Duration(s.off.Load())) }

// Sleep is time.Sleep: a step does not shorten or lengthen it.
func (s *Stepped) Sleep(d time.Duration) { time.Sleep(d) }

// Since is the real time since t (monotonic: a step does not move it).
func (s *Stepped) Since(t time.Time) time.Duration { return s.Now().Sub(t) }

// NewTimer, NewTicker and AfterFunc are time's: a step does not move them.
func (s *Stepped) NewTimer(d time.Duration) (Timer, <-chan time.Time) { return Real{}.NewTimer(d) }
func (s *Stepped) NewTicker(d time.Duration) (Ticker, <-chan time.Time) {
	return Real{}.NewTicker(d)
}
func (s *Stepped) AfterFunc(d time.Duration, f func()) Timer { return Real{}.AfterFunc(d, f) }

// Offset is the current offset.
func (s *Stepped) Offset() time.Duration { return time.Duration(s.off.Load()) }

// Step sets the offset to `to` (a step of to-from) and returns the previous
// one.
func (s *Stepped) Step(to time.Duration) (from time.Duration) {
	return time.Duration(s.off.Swap(int64(to)))
}

// ReadOffset reads an offset file: a Go duration, surrounding space
// ignored; an empty or missing file is 0.
func ReadOffset(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return 0, nil
	}
	return time.ParseDuration(s)
}

// Follow makes s follow the offset file at path: read now, then every
// `every` until stop is called. onStep (optional) is called from the
// reading goroutine after each change, and with err for a file that cannot
// be read or parsed (the offset is then kept).
func (s *Stepped) Follow(path string, every time.Duration, onStep func(from, to time.Duration, err error)) (stop func()) {
	read := func(last *error) {
		d, err := ReadOffset(path)
		if err != nil {
			if onStep != nil && (*last == nil || (*last).Error() != err.Error()) {
				onStep(s.Offset(), s.Offset(), err)
			}
			*last = err
			return
		}
		*last = nil
		if from := s.Step(d); from != d && onStep != nil {
			onStep(from, d, nil)
		}
	}
	var last error
	read(&last)
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				read(&last)
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// timeLayout mirrors time.Time's fields: with the monotonic bit set in wall,
// ext holds the monotonic reading (see the time package's source). Checked
// by monotonicKept at init and by TestSteppedKeepsMonotonic.
type timeLayout struct {
	wall uint64
	ext  int64
	loc  *time.Location
}

const hasMonotonic = 1 << 63

// shiftWall returns t with d added to its wall reading and its monotonic
// reading (if any) unchanged: what time.Now returns after the host's clock
// was stepped by d. time.Time has no exported way to build that (Add moves
// both readings), hence the copy of the monotonic field.
func shiftWall(t time.Time, d time.Duration) time.Time {
	if d == 0 || !layoutKnown {
		return t.Add(d)
	}
	u := t.Add(d)
	tl, ul := (*timeLayout)(unsafe.Pointer(&t)), (*timeLayout)(unsafe.Pointer(&u))
	if tl.wall&hasMonotonic != 0 && ul.wall&hasMonotonic != 0 {
		ul.ext = tl.ext
	}
	return u
}

// layoutKnown is whether time.Time is laid out as timeLayout says, tested
// once on a real reading; if not (a Go release changed it), shiftWall falls
// back to Add, which moves the monotonic reading too (durations across a
// step then see it) and TestSteppedKeepsMonotonic fails.
var layoutKnown = monotonicKept()

func monotonicKept() bool {
	if unsafe.Sizeof(time.Time{}) != unsafe.Sizeof(timeLayout{}) {
		return false
	}
	t := time.Now()
	tl := (*timeLayout)(unsafe.Pointer(&t))
	if tl.wall&hasMonotonic == 0 {
		return false
	}
	u := t.Add(time.Hour)
	ul := (*timeLayout)(unsafe.Pointer(&u))
	if ul.wall&hasMonotonic == 0 || ul.ext-tl.ext != int64(time.Hour) {
		return false
	}
	ul.ext = tl.ext
	return u.Sub(t) == 0 && u.Unix()-t.Unix() == 3600 && t.Round(0).Add(time.Hour).Equal(u.Round(0))
}
