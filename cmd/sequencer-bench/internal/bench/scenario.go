package bench

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Scenario is a load shape: how many senders, over how many conversations,
// picked how, for how long.
type Scenario struct {
	Name    string
	Senders int
	Convs   int
	// Skew 0 picks conversations uniformly; Skew > 1 picks them by a Zipf
	// law with that exponent (conversation 0 the hottest).
	Skew float64
	// TouchOnce sends exactly one message to each of Convs conversations
	// (the memory scenario); Duration and Messages are then ignored.
	TouchOnce bool
	// Duration of the measurement (after Warmup), unless Messages > 0.
	Duration time.Duration
	// Messages, when > 0, ends the run after that many sends (all measured).
	Messages int64
	// Warmup runs the load unmeasured before Duration starts (duration mode).
	Warmup time.Duration
	// About says what the scenario shows.
	About string
}

// The scenarios of the issue. Senders, Convs, Duration and Messages may be
// overridden by flags.
var scenarioDefaults = map[string]Scenario{
	"many":   {Name: "many", Senders: 1024, Convs: 10000, About: "many conversations"},
	"hot":    {Name: "hot", Senders: 1024, Convs: 1, About: "one hot conversation"},
	"light":  {Name: "light", Senders: 64, Convs: 10000, About: "light load, latency matters"},
	"skewed": {Name: "skewed", Senders: 1024, Convs: 10000, Skew: 1.1, About: "a few hot conversations"},
	"memory": {Name: "memory", Senders: 1024, Convs: 1000000, TouchOnce: true, About: "distinct conversations touched once"},
}

// Describe says what the scenario does, with its actual numbers.
func (s Scenario) Describe() string {
	pick := "picked uniformly"
	switch {
	case s.TouchOnce:
		pick = "each touched once"
	case s.Convs == 1:
		pick = "every sender on it"
	case s.Skew > 1:
		pick = fmt.Sprintf("picked by Zipf(%g)", s.Skew)
	}
	convs := fmtInt(int64(s.Convs)) + " conversations"
	if s.Convs == 1 {
		convs = "1 conversation"
	}
	return fmt.Sprintf("%s: %s senders, %s, %s", s.About, fmtInt(int64(s.Senders)), convs, pick)
}

var scenarioOrder = []string{"many", "hot", "light", "skewed", "memory"}

// parseScenarios turns "many,hot" into scenarios, applying the overrides.
func parseScenarios(list string, o scenarioOverrides) ([]Scenario, error) {
	var out []Scenario
	seen := map[string]bool{}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" || seen[name] {
			continue
		}
		s, ok := scenarioDefaults[name]
		if !ok {
			return nil, fmt.Errorf("unknown scenario %q (known: %s)", name, strings.Join(scenarioOrder, ","))
		}
		seen[name] = true
		if o.Senders > 0 {
			s.Senders = o.Senders
		}
		if o.Convs > 0 {
			s.Convs = o.Convs
		}
		if s.TouchOnce && o.MemoryConvs > 0 {
			s.Convs = o.MemoryConvs
		}
		if o.Skew >= 0 && o.SkewSet {
			s.Skew = o.Skew
		}
		s.Duration, s.Messages, s.Warmup = o.Duration, o.Messages, o.Warmup
		if s.Messages > 0 {
			s.Warmup = 0
		}
		if s.Skew != 0 && s.Skew <= 1 {
			return nil, fmt.Errorf("scenario %s: --skew must be 0 (uniform) or > 1 (Zipf exponent), got %v", name, s.Skew)
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no scenario selected")
	}
	return out, nil
}

type scenarioOverrides struct {
	Senders, Convs int
	MemoryConvs    int
	Skew           float64
	SkewSet        bool
	Duration       time.Duration
	Messages       int64
	Warmup         time.Duration
}

// convPicker chooses the conversation of a sender's next message. One per
// sender: it is not safe for concurrent use.
type convPicker struct {
	r    *rand.Rand
	zipf *rand.Zipf
	n    int
}

func newConvPicker(s Scenario, seed uint64) *convPicker {
	p := &convPicker{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), n: max(s.Convs, 1)}
	if s.Skew > 1 && p.n > 1 {
		p.zipf = rand.NewZipf(p.r, s.Skew, 1, uint64(p.n-1))
	}
	return p
}

func (p *convPicker) next() int {
	if p.zipf != nil {
		return int(p.zipf.Uint64())
	}
	if p.n == 1 {
		return 0
	}
	return p.r.IntN(p.n)
}

// convID names conversation k of a run's scenario. It is built on every send
// (not kept in a table) so that an engine that keeps a conversation's id pays
// for its bytes in the memory scenario, as it would in production.
func convID(prefix string, k int) string {
	return prefix + strconv.Itoa(k)
}
