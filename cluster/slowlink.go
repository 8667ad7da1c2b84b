package cluster

import (
	"sync"
	"time"
)

// linkTimes keeps, per peer address, how long the link's share of a
// forward's round trip is (the round trip less the time the owner spent,
// ForwardBatchReply.served_us): a smoothed average that rises with the
// samples and falls at once to a sample below the limit, so a healed link
// is trusted again by its first fast sample.
type linkTimes struct {
	mu sync.Mutex
	m  map[string]linkTime
}

type linkTime struct {
	avg time.Duration
	at  time.Time // the last sample
	// measuring: a re-measure of a stale "slow" verdict is under way
	// (slow's remeasure), since this time.
	measuring time.Time
}

// linkFresh: a verdict "slow" older than this is measured again (slow's
// remeasure): a link that healed while no forward used it is not avoided
// for long.
const linkFresh = time.Second

// note records one link time to addr (a forward's share, or a probe's round
// trip); it ends a re-measure under way.
func (l *linkTimes) note(addr string, d time.Duration, now time.Time, limit time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]linkTime{}
	}
	lt, ok := l.m[addr]
	switch {
	case !ok || d <= limit:
		lt.avg = d
	default:
		lt.avg += (d - lt.avg) * 3 / 10
	}
	lt.at = now
	lt.measuring = time.Time{}
	l.m[addr] = lt
}

// slow reports whether addr's link averaged above limit, and that average.
// A verdict "slow" older than linkFresh still holds, and remeasure asks the
// caller to measure the link again (note): true for one caller until the
// measure ends, or until linkFresh passed without one. So no send waits on
// a slow link to learn whether it healed: before, the first sends after the
// verdict aged out were all forwarded over the slow link, every second,
// until one came back.
func (l *linkTimes) slow(addr string, now time.Time, limit time.Duration) (avg time.Duration, slow, remeasure bool) {
	if limit <= 0 {
		return 0, false, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lt, ok := l.m[addr]
	if !ok || lt.avg <= limit {
		return lt.avg, false, false
	}
	if now.Sub(lt.at) >= linkFresh && (lt.measuring.IsZero() || now.Sub(lt.measuring) >= linkFresh) {
		lt.measuring = now
		l.m[addr] = lt
		remeasure = true
	}
	return lt.avg, true, remeasure
}
