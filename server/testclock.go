package server

import (
	"log/slog"
	"os"
	"time"

	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/persist/open"
)

// testClock is the node's clock when the test-only environment variable
// clock.TestOffsetFileEnv names an offset file (docs/TESTING.md "Clock
// jumps"): the real clock with that offset added to its wall reading, for
// the msg_id issuer, server_at and the cluster node. Unset (production), it
// returns nil, which every component takes for the real clock, and a no-op
// stop: nothing is read or started.
func testClock(log *slog.Logger) (clock.Clock, func()) {
	path := os.Getenv(clock.TestOffsetFileEnv)
	if path == "" {
		return nil, func() {}
	}
	log.Warn("test-only clock hook: this node's wall clock is the host's plus the offset in the file; never set this in production",
		"env", clock.TestOffsetFileEnv, "file", path)
	s := &clock.Stepped{}
	stop := s.Follow(path, clock.TestOffsetPoll, func(from, to time.Duration, err error) {
		if err != nil {
			log.Error("test clock: offset file unreadable; offset kept", "file", path, "offset", to, "err", err)
			return
		}
		log.Warn("test clock stepped", "from", from, "to", to, "step", to-from)
	})
	return s, stop
}

// testNoLeaseCheck reads open.TestNoLeaseCheckEnv: set (tests only), the
// node's Citus store skips its lease-cache check before a commit (the e2e
// zombie test on Citus). Unset (production), false.
func testNoLeaseCheck(log *slog.Logger) bool {
	if os.Getenv(open.TestNoLeaseCheckEnv) == "" {
		return false
	}
	log.Warn(open.TestNoLeaseCheckEnv + " is set: Citus commits skip the lease check (tests only); never set this in production")
	return true
}
