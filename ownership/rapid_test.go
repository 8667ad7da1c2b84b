package ownership

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/internal/rapidmutant"
	"github.com/sequencer-im/sequencer/persist"
)

// ownMutation, when set, breaks the harness on purpose (see
// TestRapidOwnershipMutantsFail): the properties must then fail.
var ownMutation string

// inFlight is a commit formed with a fence (Writable's answer at the time)
// that reaches the table later: a slow commit, or a paused process that
// resumes.
type inFlight struct {
	proc  string
	fence persist.Fence
}

// ownMachine is the state of one rapid run: the story harness (one
// membership.Mem table, a fake clock, the processes) and what the
// properties remember.
type ownMachine struct {
	t        *rapid.T
	h        *harness
	names    []string        // every process started, in order
	frozen   map[string]bool // shells that stopped stepping (SIGSTOP): no beat, no round
	flight   []inFlight
	maxEpoch map[uint32]uint64    // highest epoch seen in the table per partition
	byEpoch  map[[2]uint64]string // (partition, epoch) -> incarnation whose commit passed
}

// TestRapidOwnership drives several ownership cores sharing one membership
// table with random beats, rounds, time (past the TTL too), frozen shells,
// commits formed by Writable and checked by the table at once or later,
// leaves, operator drains and forgets, and restarts; and checks after every
// step that the table lets at most one incarnation commit per partition and
// epoch, only at the partition's current epoch, that epochs never go back,
// and that Dispatch, Locate and Serving agree with Writable.
func TestRapidOwnership(t *testing.T) {
	ownSeen = map[string]int{}
	rapid.Check(t, func(rt *rapid.T) { ownProperty(t, rt) })
	t.Logf("seen: %v", ownSeen)
	if ownSeen["runs"] < 50 {
		return // a replay: too few runs to ask for coverage
	}
	// The runs must have reached takeovers (epoch 2 and more) and commits
	// that passed, at epoch 2 and more too. (Zombie fences, Writable's yes
	// that the table refuses, come in few runs: "stale fence" and
	// "refused" are logged; the core-decides mutant shows they are
	// reached.)
	for _, what := range []string{"epoch>1", "passed", "passed at epoch>1"} {
		if ownSeen[what] == 0 {
			t.Errorf("no %s in %d runs: %v", what, ownSeen["runs"], ownSeen)
		}
	}
}

// ownSeen counts what the runs of TestRapidOwnership reached.
var ownSeen map[string]int

func ownSaw(what string) {
	if ownSeen != nil {
		ownSeen[what]++
	}
}

func ownProperty(outer *testing.T, t *rapid.T) {
	m := &ownMachine{t: t, h: newHarness(outer), frozen: map[string]bool{},
		maxEpoch: map[uint32]uint64{}, byEpoch: map[[2]uint64]string{}}
	ownSaw("runs")
	for _, n := range []string{"a", "b", "c"} {
		m.start(n, n)
	}
	procName := func(t *rapid.T) string { return rapid.SampledFrom(m.names).Draw(t, "proc") }
	stepping := func(t *rapid.T) string {
		n := procName(t)
		if m.frozen[n] {
			t.Skip("frozen")
		}
		return n
	}
	t.Repeat(map[string]func(*rapid.T){
		"beat":  func(t *rapid.T) { m.h.do("beat " + stepping(t)) },
		"round": func(t *rapid.T) { m.h.do("round " + stepping(t)) },
		"run": func(t *rapid.T) {
			// Every shell that steps beats and carries out a round.
			for _, n := range m.names {
				if !m.frozen[n] {
					m.h.do("beat " + n)
					m.h.do("round " + n)
				}
			}
		},
		"tick": func(t *rapid.T) {
			ms := rapid.SampledFrom([]int{100, 400, 700, 1400, 1600}).Draw(t, "ms")
			m.h.do(fmt.Sprintf("tick %dms", ms))
		},
		"freeze": func(t *rapid.T) { n := procName(t); m.frozen[n] = !m.frozen[n] },
		"commit now": func(t *rapid.T) {
			p := uint32(rapid.IntRange(0, storyPartitions-1).Draw(t, "p"))
			for _, n := range m.names {
				if f, err := m.h.procs[n].core.Writable(p, m.h.clk.Now()); err == nil {
					m.land(inFlight{n, f})
				}
			}
		},
		"form commit": func(t *rapid.T) {
			n := procName(t)
			p := uint32(rapid.IntRange(0, storyPartitions-1).Draw(t, "p"))
			if f, err := m.h.procs[n].core.Writable(p, m.h.clk.Now()); err == nil {
				m.flight = append(m.flight, inFlight{n, f})
			}
		},
		"land commit": func(t *rapid.T) {
			if len(m.flight) == 0 {
				t.Skip("no commit in flight")
			}
			i := rapid.IntRange(0, len(m.flight)-1).Draw(t, "commit")
			c := m.flight[i]
			m.flight = append(m.flight[:i], m.flight[i+1:]...)
			m.land(c)
		},
		"leave":  func(t *rapid.T) { m.h.do("leave " + stepping(t)) },
		"drain":  func(t *rapid.T) { m.h.do("drain " + procName(t)) },
		"forget": func(t *rapid.T) { m.h.do("forget " + procName(t)) },
		"restart": func(t *rapid.T) {
			// A new process for a node id whose process left or is
			// frozen (the old one may still hold fences: a zombie).
			n := procName(t)
			c := m.h.procs[n].core
			if c.Phase() != PhaseLeft && c.Phase() != PhaseSuperseded && !m.frozen[n] {
				t.Skip("still running")
			}
			m.start(fmt.Sprintf("%s%d", c.Self().NodeID, len(m.names)), c.Self().NodeID)
		},
		"": func(t *rapid.T) { m.check() },
	})
}

func (m *ownMachine) start(name, id string) {
	m.h.do(fmt.Sprintf("start %s id=%s", name, id))
	m.names = append(m.names, name)
}

// land checks c's fence against the table, as a store's commit does, and
// records who passed.
func (m *ownMachine) land(c inFlight) {
	t := m.t
	core := m.h.procs[c.proc].core
	var err error
	if ownMutation == "core-decides" {
		// The core's own answer stands in for the store's check.
		_, err = core.Writable(c.fence.Partition, m.h.clk.Now())
	} else {
		err = m.h.table.Fenced([]persist.Fence{c.fence}, func() {})
	}
	var sf *persist.StaleFenceError
	switch {
	case errors.As(err, &sf):
		ownSaw("refused")
		core.Refused(sf.Fences)
		return
	case err != nil:
		return
	}
	v, verr := m.h.table.View(context.Background())
	if verr != nil {
		t.Fatal(verr)
	}
	l, _ := v.Lease(c.fence.Partition)
	if l.Owner != c.fence.Owner || l.Epoch != c.fence.Epoch {
		t.Fatalf("fence check: %s's commit on partition %d passed with %s@%d, the table's lease is %s@%d",
			c.proc, c.fence.Partition, c.fence.Owner, c.fence.Epoch, l.Owner, l.Epoch)
	}
	k := [2]uint64{uint64(c.fence.Partition), c.fence.Epoch}
	if w, ok := m.byEpoch[k]; ok && w != c.fence.Owner {
		t.Fatalf("fence check: partition %d at epoch %d committed by %s and %s", c.fence.Partition, c.fence.Epoch, w, c.fence.Owner)
	}
	m.byEpoch[k] = c.fence.Owner
	ownSaw("passed")
	if c.fence.Epoch > 1 {
		ownSaw("passed at epoch>1")
	}
}

// check runs the invariants of every step.
func (m *ownMachine) check() {
	t := m.t
	now := m.h.clk.Now()
	v, err := m.h.table.View(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range v.Leases {
		if l.Epoch < m.maxEpoch[l.Partition] {
			t.Fatalf("epoch monotone: partition %d at epoch %d in the table after %d", l.Partition, l.Epoch, m.maxEpoch[l.Partition])
		}
		if l.Epoch > 1 && m.maxEpoch[l.Partition] <= 1 {
			ownSaw("epoch>1")
		}
		m.maxEpoch[l.Partition] = l.Epoch
	}
	for p := range uint32(storyPartitions) {
		// Whenever several cores give a fence for p, at most one passes
		// the table's check.
		passed := 0
		for _, n := range m.names {
			f, err := m.h.procs[n].core.Writable(p, now)
			if err != nil {
				continue
			}
			if ownMutation == "core-decides" || m.h.table.Fenced([]persist.Fence{f}, nil) == nil {
				passed++
			} else {
				ownSaw("stale fence") // a zombie: Writable says yes, the table no
			}
		}
		if passed > 1 {
			t.Fatalf("fence check: %d cores' fences for partition %d pass the table's check", passed, p)
		}
		for _, n := range m.names {
			c := m.h.procs[n].core
			if _, ok := c.Ring().Owner(p); ok || c.refusal() != nil {
				checkQueries(t, n, c, p, now)
				continue
			}
			// An empty ring (checkQueries' states always have one):
			// wait, and Locate says no owner.
			if d := c.Dispatch(p, now); d.Way != WayWait || !errors.Is(d.Err, sequencer.ErrNotOwner) {
				t.Errorf("%s: empty ring: Route %s (%v), want wait", n, d.Way, d.Err)
			}
			if _, err := c.Locate(p, now); !errors.Is(err, sequencer.ErrNotOwner) {
				t.Errorf("%s: empty ring: Locate gave %v, want not owner", n, err)
			}
		}
	}
	if ownMutation == "epoch-back" {
		// A table that loses a takeover: the lease goes back an
		// epoch (seen by the next step's check).
		for _, l := range v.Leases {
			if l.Epoch > 1 {
				m.h.table.PutLeaseForTest(persist.Fence{Partition: l.Partition, Owner: l.Owner, Epoch: l.Epoch - 1})
			}
		}
	}
}

// TestRapidOwnershipMutantsFail shows the properties able to fail: with
// the harness broken on purpose, rapid must report the property's failure.
func TestRapidOwnershipMutantsFail(t *testing.T) {
	for _, c := range []struct{ mutation, property string }{
		{"core-decides", "fence check"},  // no in-commit fence: the core's Writable decides
		{"epoch-back", "epoch monotone"}, // the table loses a takeover
	} {
		t.Run(c.mutation, func(t *testing.T) {
			rapidmutant.Fails(t, &ownMutation, c.mutation, c.property, func(rt *rapid.T) { ownProperty(t, rt) })
		})
	}
}
