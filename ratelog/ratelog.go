// Package ratelog logs a recurring condition (a store outage, a lost lease,
// a fenced commit) at most once per cause per interval, so an outage shows up
// at the default level as a few lines, not as zero and not as one line per
// failed message. The line after a quiet interval carries how many were
// suppressed.
//
// It owns only the "once per cause per interval" decision; it never buffers
// records, never drops a cause it has not seen in the interval, and never
// logs anything itself except what the caller asked for.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// DefaultInterval is the quiet time between two lines of one cause.
const DefaultInterval = 10 * time.Second

// maxCauses bounds the causes remembered; past it the memory is cleared (at
// worst a cause logs once more than it would have).
const maxCauses = 1024

// Logger logs through an *slog.Logger at most once per cause per interval.
// The zero value is not usable; use New. Safe for concurrent use.
type Logger struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu     sync.Mutex
	causes map[string]*causeState
}

type causeState struct {
	last       time.Time
	suppressed int
}

// New returns a Logger writing to log (nil: slog.Default()) at most once per
// cause per interval (<= 0: DefaultInterval).
func New(log *slog.Logger, interval time.Duration) *Logger {
	if log == nil {
		log = slog.Default()
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Logger{log: log, interval: interval, now: time.Now, causes: map[string]*causeState{}}
}

// SetClock replaces the clock (tests).
func (l *Logger) SetClock(now func() time.Time) {
	l.mu.Lock()
	l.now = now
	l.mu.Unlock()
}

// Warn logs msg at WARN unless cause was logged less than the interval ago;
// it reports whether it logged.
func (l *Logger) Warn(cause, msg string, args ...any) bool {
	return l.Log(slog.LevelWarn, cause, msg, args...)
}

// Error logs msg at ERROR unless cause was logged less than the interval
// ago; it reports whether it logged.
func (l *Logger) Error(cause, msg string, args ...any) bool {
	return l.Log(slog.LevelError, cause, msg, args...)
}

// Log logs msg at level unless cause was logged less than the interval ago;
// it reports whether it logged. A logged line carries "suppressed", the count
// of lines of that cause dropped since the previous one, when non-zero.
func (l *Logger) Log(level slog.Level, cause, msg string, args ...any) bool {
	if l == nil {
		return false
	}
	return l.logTo(l.log, level, cause, msg, args...)
}

func (l *Logger) logTo(log *slog.Logger, level slog.Level, cause, msg string, args ...any) bool {
	if log == nil {
		log = slog.Default()
	}
	if !log.Enabled(context.Background(), level) {
		return false
	}
	l.mu.Lock()
	now := l.now()
	c := l.causes[cause]
	if c != nil && now.Sub(c.last) < l.interval {
		c.suppressed++
		l.mu.Unlock()
		return false
	}
	if c == nil {
		if len(l.causes) >= maxCauses {
			clear(l.causes)
		}
		c = &causeState{}
		l.causes[cause] = c
	}
	n := c.suppressed
	c.last, c.suppressed = now, 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	log.Log(context.Background(), level, msg, args...)
	return true
}

// shared is the process-wide table of Warn and Error, for code that holds an
// *slog.Logger and no Logger of its own.
var shared = New(nil, DefaultInterval)

// Warn logs msg at WARN to log (nil: slog.Default()) unless cause was
// logged, by any caller of this function or of Error, less than
// DefaultInterval ago. Make cause name the package and the condition
// ("commit: store unavailable"): the table is process-wide.
func Warn(log *slog.Logger, cause, msg string, args ...any) bool {
	return shared.logTo(log, slog.LevelWarn, cause, msg, args...)
}

// Error is Warn at ERROR.
func Error(log *slog.Logger, cause, msg string, args ...any) bool {
	return shared.logTo(log, slog.LevelError, cause, msg, args...)
}
