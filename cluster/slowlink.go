package cluster

import (
	"sync"
	"time"
)

// linkTimes keeps, per peer address, how long the link's share of a
// forward's round trip is (the round trip less the time the owner spent,
// ForwardBatchReply.served_us): a smoothed average that rises with the
// samples and falls at once to a sample below the limit, so a healed link
// is trusted again by its first fast forward.
type linkTimes struct {
	mu sync.Mutex
	m  map[string]linkTime
}

type linkTime struct {
	avg time.Duration
	at  time.Time // the last sample
}

// linkFresh: a verdict "slow" older than this lets the next send through
// (forwarded, so it measures the link again): a link that healed while no
// forward used it is not avoided for long.
const linkFresh = time.Second

// note records one forward's link time to addr.
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
	l.m[addr] = lt
}

// slow reports whether addr's link averaged above limit in a sample at most
// linkFresh old, and that average.
func (l *linkTimes) slow(addr string, now time.Time, limit time.Duration) (time.Duration, bool) {
	if limit <= 0 {
		return 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lt, ok := l.m[addr]
	return lt.avg, ok && lt.avg > limit && now.Sub(lt.at) < linkFresh
}
