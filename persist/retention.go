package persist

import (
	"context"
	"time"
)

// DefaultTrimStep is how many conversations one TrimBefore step covers in
// TrimAll: one statement (PostgreSQL) or one write transaction (SQLite), so
// commits never wait long behind a retention pass.
const DefaultTrimStep = 200

// TrimAll runs one complete retention pass over every conversation of s:
// TrimBefore steps of step conversations (DefaultTrimStep when <= 0) until
// the cursor ends. onStep, when set, is called with the rows each step
// deleted. It returns the rows deleted; on an error (or ctx ending) it stops
// and returns what was deleted so far; the next pass starts over and
// finishes the job (each step is idempotent).
func TrimAll(ctx context.Context, s Retention, before time.Time, step int, onStep func(deleted int)) (int, error) {
	if step <= 0 {
		step = DefaultTrimStep
	}
	total, after := 0, ""
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		next, n, err := s.TrimBefore(ctx, before, after, step)
		if err != nil {
			return total, err
		}
		total += n
		if onStep != nil && n > 0 {
			onStep(n)
		}
		if next == "" {
			return total, nil
		}
		after = next
	}
}
