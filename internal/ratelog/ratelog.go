// Package ratelog logs a warning at most once per interval for each cause,
// and says how many it held back in between: an outage that fails thousands
// of sends gives a few lines, not thousands and not none.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Logger is a rate-limited logger. The zero value is not usable; use New.
type Logger struct {
	log   *slog.Logger
	every time.Duration

	mu    sync.Mutex
	last  map[string]time.Time
	muted map[string]int
}

// New returns a Logger writing to log at most once per every for each cause.
func New(log *slog.Logger, every time.Duration) *Logger {
	return &Logger{log: log, every: every, last: map[string]time.Time{}, muted: map[string]int{}}
}

// Warn logs msg at WARN unless a line of the same cause was logged within
// the interval.
func (l *Logger) Warn(cause, msg string, args ...any) { l.Log(slog.LevelWarn, cause, msg, args...) }

// Error logs msg at ERROR, rate-limited like Warn.
func (l *Logger) Error(cause, msg string, args ...any) { l.Log(slog.LevelError, cause, msg, args...) }

// Log logs msg at level, rate-limited per cause.
func (l *Logger) Log(level slog.Level, cause, msg string, args ...any) {
	l.mu.Lock()
	now := time.Now()
	if t, ok := l.last[cause]; ok && now.Sub(t) < l.every {
		l.muted[cause]++
		l.mu.Unlock()
		return
	}
	l.last[cause] = now
	muted := l.muted[cause]
	l.muted[cause] = 0
	l.mu.Unlock()
	if muted > 0 {
		args = append(args, "suppressed_since_last", muted)
	}
	l.log.Log(context.Background(), level, msg, args...)
}
