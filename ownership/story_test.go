package ownership

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/internal/storytest"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
	"github.com/sequencer-im/sequencer/ring"
)

// TestStories runs the stories in testdata/*.txt against the core. The
// harness plays the shell of package cluster, one step per command, against
// one in-memory membership table (membership.Mem, the same rules as the
// PostgreSQL table) and a fake clock shared by the table and every node.
// The file format and -rewrite are internal/storytest's.
//
// Commands (NODE names a process; several processes may share a node id):
//
//	start NODE [id=ID] [partitions=N]  new core for a process of node id ID (default NODE), and its join
//	beat NODE                one heartbeat, fed to the core
//	round NODE               the core's Next, carried out against the table
//	decide NODE              the core's Next only (nothing carried out: a frozen shell)
//	commit NODE p=P          a commit fenced by the core's Fence, checked by the table
//	route NODE p=P           where a send for partition P goes
//	ready NODE               the core's readiness
//	leave NODE               a graceful leave, carried out to the end
//	drain NODE               an operator marks NODE's row leaving (admin drain)
//	forget NODE              an operator removes NODE's row (admin forget)
//	tick DURATION            time passes (the table expires rows by it)
//	state NODE               the core's state
func TestStories(t *testing.T) {
	storytest.Run(t, func(t *testing.T) func(string) string { return newHarness(t).do })
}

const (
	storyPartitions = 8
	storyTTL        = 1500 * time.Millisecond
)

type harness struct {
	t     *testing.T
	clk   *clock.Fake
	start time.Time
	table *membership.Mem
	procs map[string]*proc
	incs  map[string]int // incarnations started per node id
}

// proc is one process: its core and what its shell remembers.
type proc struct {
	name string
	core *Core
}

func newHarness(t *testing.T) *harness {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(start)
	return &harness{t: t, clk: clk, start: start, table: membership.NewMem(clk), procs: map[string]*proc{}, incs: map[string]int{}}
}

func (h *harness) do(line string) string {
	f := strings.Fields(line)
	cmd, args := f[0], f[1:]
	kv := map[string]string{}
	var pos []string
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			kv[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	if cmd == "tick" {
		d, err := time.ParseDuration(pos[0])
		if err != nil {
			h.t.Fatal(err)
		}
		h.clk.Advance(d)
		return fmt.Sprintf("now +%v", h.clk.Now().Sub(h.start))
	}
	if cmd == "start" {
		parts := storyPartitions
		if v := kv["partitions"]; v != "" {
			parts, _ = strconv.Atoi(v)
		}
		return h.startProc(pos[0], kv["id"], parts)
	}
	p := h.procs[pos[0]]
	if p == nil {
		h.t.Fatalf("no process %q", pos[0])
	}
	c := p.core
	ctx := context.Background()
	now := h.clk.Now()
	switch cmd {
	case "beat":
		self := c.Self()
		sent := h.clk.Now()
		v, err := h.table.Heartbeat(ctx, self.NodeID, self.Incarnation, storyTTL)
		var out string
		if err != nil {
			out = fmt.Sprintf("heartbeat: %v; trouble news: %v", err, c.RenewFailed(self.Incarnation, err))
		} else {
			out = fmt.Sprintf("heartbeat: ok; drain: %v", c.Renewed(self.Incarnation, v, sent))
		}
		return out + "\n" + h.state(p)
	case "round", "decide":
		rd := c.Next()
		out := []string{"round: " + roundString(rd)}
		if cmd == "round" {
			out = append(out, h.carryOut(p, rd)...)
		}
		return strings.Join(append(out, h.state(p)), "\n")
	case "commit":
		part := h.partition(kv["p"])
		fence, err := c.Writable(part, now)
		if err != nil {
			return "not written: " + err.Error()
		}
		var sf *persist.StaleFenceError
		if err := h.table.Fenced([]persist.Fence{fence}, func() {}); errors.As(err, &sf) {
			news := c.Refused(sf.Fences)
			return fmt.Sprintf("refused by the table: fence %s@%d is stale; trouble news: %v", fence.Owner, fence.Epoch, news)
		} else if err != nil {
			return "commit: " + err.Error()
		}
		return fmt.Sprintf("committed with fence %s@%d", fence.Owner, fence.Epoch)
	case "route":
		d := c.Dispatch(h.partition(kv["p"]), now)
		switch d.Way {
		case WayLocal:
			return "local"
		case WayForward:
			if d.Successor {
				return fmt.Sprintf("forward to the next owner %s at %s (view %d), this node cannot write: %v", d.Owner.NodeID, d.Owner.ClusterAddr, d.Version, d.Err)
			}
			return fmt.Sprintf("forward to %s at %s (view %d)", d.Owner.NodeID, d.Owner.ClusterAddr, d.Version)
		}
		return fmt.Sprintf("%s: %v (retryable: %v)", d.Way, d.Err, sequencer.ErrorCode(d.Err) == sequencer.CodeUnavailable &&
			!errors.Is(d.Err, sequencer.ErrShuttingDown))
	case "ready":
		if err := c.Serving(now); err != nil {
			return "not ready: " + err.Error()
		}
		return "ready"
	case "leave":
		return h.leave(p)
	case "drain":
		m, err := h.table.RequestDrain(ctx, c.Self().NodeID)
		if err != nil {
			return "drain: " + err.Error()
		}
		return fmt.Sprintf("row of %s marked leaving", m.Incarnation)
	case "forget":
		self := c.Self()
		if err := h.table.Remove(ctx, self.NodeID, self.Incarnation); err != nil {
			return "forget: " + err.Error()
		}
		return "row of " + self.Incarnation + " removed by an operator"
	case "state":
		return h.state(p)
	}
	h.t.Fatalf("unknown command %q", cmd)
	return ""
}

func (h *harness) partition(s string) uint32 {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= storyPartitions {
		h.t.Fatalf("bad partition %q", s)
	}
	return uint32(n)
}

func (h *harness) startProc(name, id string, partitions int) string {
	if id == "" {
		id = name
	}
	c, err := New(Config{NodeID: id, Ring: ring.Config{Partitions: partitions}, MemberTTL: storyTTL}, membership.Member{})
	if err != nil {
		h.t.Fatal(err)
	}
	p := &proc{name: name, core: c}
	h.procs[name] = p
	return h.join(p, "")
}

// join joins p as a new incarnation, as cluster.Node.join does; old is the
// previous incarnation to remove first (a rejoin).
func (h *harness) join(p *proc, old string) string {
	ctx := context.Background()
	c := p.core
	var out []string
	if old != "" {
		if err := h.table.Remove(ctx, c.Self().NodeID, old); err != nil {
			h.t.Fatal(err)
		}
		out = append(out, "removed the row of "+old)
	}
	m := c.Self()
	h.incs[m.NodeID]++
	m.Incarnation = fmt.Sprintf("%s#%d", m.NodeID, h.incs[m.NodeID])
	m.ClusterAddr = p.name + ":7946"
	sent := h.clk.Now()
	v, err := h.table.Join(ctx, m, storyTTL, false)
	switch {
	case errors.Is(err, membership.ErrSuperseded) && old != "":
		c.JoinSuperseded()
		out = append(out, "join as "+m.Incarnation+": refused, node id taken by a live process")
	case err != nil:
		// The shell reports it and retries (start) or gives up; the core
		// is not told: it has not joined.
		out = append(out, "join as "+m.Incarnation+": "+err.Error())
	default:
		c.Joined(m, v, sent)
		out = append(out, "joined as "+m.Incarnation)
	}
	return strings.Join(append(out, h.state(p)), "\n")
}

// carryOut does what a round asks, against the table, as cluster.Node's
// reconcile does (conversations are not modeled: stopping them is a no-op).
func (h *harness) carryOut(p *proc, rd Round) []string {
	ctx := context.Background()
	c := p.core
	var out []string
	if rd.StepDown {
		if len(rd.Leases) > 0 {
			if err := h.table.Release(ctx, rd.Leases); err != nil {
				out = append(out, "release after step-down: "+err.Error())
			}
		}
		if rd.Final {
			c.Superseded()
			return append(out, "out for good")
		}
	}
	if rd.Rejoin {
		return append(out, strings.Split(h.join(p, rd.Old.Incarnation), "\n")[:1]...)
	}
	if len(rd.Release) > 0 {
		if err := h.table.Release(ctx, rd.Release); err != nil {
			out = append(out, "release: "+err.Error())
		} else {
			c.Released(rd.Release)
			out = append(out, "released "+leasesString(rd.Release))
		}
	}
	if len(rd.Acquire) > 0 {
		ls, err := h.table.Acquire(ctx, rd.Incarnation, rd.Version, rd.Acquire)
		if err != nil {
			out = append(out, "acquire: "+err.Error())
		} else {
			c.Acquired(rd.Incarnation, ls)
			out = append(out, "acquired "+leasesString(ls))
		}
	}
	return out
}

// leave runs a graceful leave to the end, as cluster.Node.Leave does.
func (h *harness) leave(p *proc) string {
	ctx := context.Background()
	c := p.core
	wasMember, err := c.Leave()
	if err != nil {
		return "leave: " + err.Error()
	}
	self := c.Self()
	var out []string
	if wasMember {
		v, err := h.table.Leave(ctx, self.NodeID, self.Incarnation)
		if err != nil {
			out = append(out, "marking the row leaving: "+err.Error())
		} else {
			c.Observed(v)
			out = append(out, fmt.Sprintf("row marked leaving (view %d)", v.Version))
		}
	}
	if held := c.HeldLeases(); len(held) > 0 {
		ps := make([]uint32, len(held))
		for i, l := range held {
			ps[i] = l.Partition
		}
		ls := c.StartHandoff(ps)
		if err := h.table.Release(ctx, ls); err != nil {
			h.t.Fatal(err)
		}
		c.Released(ls)
		out = append(out, "released "+leasesString(ls))
	}
	if err := h.table.Remove(ctx, self.NodeID, self.Incarnation); err != nil {
		h.t.Fatal(err)
	}
	c.Left()
	return strings.Join(append(out, "row removed", h.state(p)), "\n")
}

func (h *harness) state(p *proc) string {
	c := p.core
	var held, moving []string
	for i := range c.Partitions() {
		st := c.Part(uint32(i))
		if st.Held {
			held = append(held, fmt.Sprintf("%d@%d", i, st.Epoch))
		}
		if st.HandingOff {
			moving = append(moving, strconv.Itoa(i))
		}
	}
	var ring []string
	for _, m := range c.Ring().Nodes() {
		ring = append(ring, m.NodeID)
	}
	s := fmt.Sprintf("%s: %s", p.name, c.Phase())
	if c.Trouble() != TroubleNone {
		s += " (" + c.Trouble().String() + ")"
	}
	s += fmt.Sprintf(" inc=%s view=%d ring=[%s] held=[%s]", or(c.Self().Incarnation, "-"), c.View().Version,
		strings.Join(ring, " "), strings.Join(held, " "))
	if len(moving) > 0 {
		s += " moving=[" + strings.Join(moving, " ") + "]"
	}
	return s
}

func roundString(rd Round) string {
	var parts []string
	if rd.StepDown {
		parts = append(parts, fmt.Sprintf("step down (%s) releasing %s", rd.Reason, leasesString(rd.Leases)))
	}
	if rd.Final {
		parts = append(parts, "final")
	}
	if rd.Rejoin {
		parts = append(parts, "rejoin after "+rd.Old.Incarnation)
	}
	if len(rd.Release) > 0 {
		parts = append(parts, "hand off "+leasesString(rd.Release))
	}
	if len(rd.Acquire) > 0 {
		parts = append(parts, fmt.Sprintf("acquire %v at view %d", rd.Acquire, rd.Version))
	}
	if len(parts) == 0 {
		return "nothing to do"
	}
	return strings.Join(parts, "; ")
}

func leasesString(ls []membership.PartitionLease) string {
	if len(ls) == 0 {
		return "[]"
	}
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = fmt.Sprintf("%d@%d", l.Partition, l.Epoch)
	}
	slices.Sort(s)
	return "[" + strings.Join(s, " ") + "]"
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
