package console

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"
)

// Event is one change of the cluster as a node saw it: a member joined,
// began draining, left, or died (its lease expired), or this node took
// partitions (in a handoff, from a live member, or in a failover, from a
// dead one).
//
// Events are not stored anywhere: each node derives them by comparing its
// view of the members and the partition leases at every sample, keeps the
// last MaxEvents in memory, and the cluster page merges every reachable
// node's list. So the history starts when the oldest running node started,
// and a change nobody was running to see (all nodes restarted) is not in
// it.
type Event struct {
	At   time.Time `json:"at"` // when the observer saw it (UTC)
	Kind string    `json:"kind"`
	// Node is the member the event is about (for a take: the taker).
	Node string `json:"node"`
	// From is the previous owner of the partitions taken ("" when they
	// had none).
	From       string `json:"from,omitempty"`
	Partitions int    `json:"partitions,omitempty"` // partitions moved (takes only)
	// MembershipVersion is the version the observer's view had; with Kind
	// and Node it identifies a membership event across observers.
	MembershipVersion string `json:"membershipVersion"`
	Observer          string `json:"observer"` // the node that saw it
	Detail            string `json:"detail"`
}

// Event kinds.
const (
	EventJoin     = "join"     // a member appeared
	EventDrain    = "drain"    // a member began leaving (admin drain, SIGTERM)
	EventLeave    = "leave"    // a leaving member's row went away
	EventDeath    = "death"    // a member's row went away without leaving: its lease expired (crash, kill -9, partition)
	EventHandoff  = "handoff"  // this node took partitions from a live member
	EventFailover = "failover" // this node took partitions from a member that is gone
)

// MaxEvents is how many events a node keeps.
const MaxEvents = 500

// takeMergeWithin merges the takes of one (kind, from) that follow each other
// within it into one event (a takeover spans a few samples).
const takeMergeWithin = 15 * time.Second

// observer derives events from successive views. It is used under the
// Console's mutex.
type observer struct {
	self    string
	started bool
	members map[string]Member
	owners  []string
	gone    map[string]time.Time // members that died or left, until forgotten
	events  []Event
}

func (o *observer) observe(now time.Time, version uint64, members []Member, parts []Partition) {
	now = now.UTC()
	ver := strconv.FormatUint(version, 10)
	cur := make(map[string]Member, len(members))
	for _, m := range members {
		cur[m.NodeID] = m
	}
	if o.gone == nil {
		o.gone = map[string]time.Time{}
	}
	if !o.started {
		// The first view: what is there already is not news.
		o.started, o.members = true, cur
		o.owners = ownersOf(parts)
		return
	}
	add := func(e Event) {
		e.Observer, e.MembershipVersion = o.self, ver
		o.events = append(o.events, e)
		if len(o.events) > MaxEvents {
			o.events = slices.Delete(o.events, 0, len(o.events)-MaxEvents)
		}
	}
	for _, id := range sortedKeys(cur) {
		m, was := cur[id], o.members[id]
		_, existed := o.members[id]
		switch {
		case !existed:
			add(Event{At: now, Kind: EventJoin, Node: id, Detail: fmt.Sprintf("%s joined (API %s)", id, m.APIAddr)})
		case m.Leaving && !was.Leaving:
			add(Event{At: now, Kind: EventDrain, Node: id, Detail: id + " is leaving: handing off its partitions"})
		}
	}
	for _, id := range sortedKeys(o.members) {
		if _, ok := cur[id]; ok {
			continue
		}
		o.gone[id] = now
		if o.members[id].Leaving {
			add(Event{At: now, Kind: EventLeave, Node: id, Detail: id + " left the cluster"})
		} else {
			add(Event{At: now, Kind: EventDeath, Node: id, Detail: id + "'s member lease expired (crash, kill -9 or cut off): its partitions fail over"})
		}
	}
	// Takes: partitions this node holds now and did not before.
	owners := ownersOf(parts)
	taken := map[string]int{} // by previous owner
	for p, owner := range owners {
		if owner != o.self || p >= len(o.owners) || o.owners[p] == o.self {
			continue
		}
		taken[o.owners[p]]++
	}
	for _, from := range sortedKeys(taken) {
		n := taken[from]
		kind := EventHandoff
		if _, live := cur[from]; !live && from != "" {
			kind = EventFailover
		}
		if last := o.lastTake(kind, from); last != nil && now.Sub(last.At) <= takeMergeWithin {
			last.Partitions += n
			last.At, last.MembershipVersion = now, ver
			last.Detail = takeDetail(kind, o.self, from, last.Partitions)
			continue
		}
		add(Event{At: now, Kind: kind, Node: o.self, From: from, Partitions: n, Detail: takeDetail(kind, o.self, from, n)})
	}
	for id, at := range o.gone {
		if now.Sub(at) > time.Hour {
			delete(o.gone, id)
		}
	}
	// A partition whose holder is gone shows no owner until it is taken:
	// remember who held it, so the take names them.
	for p, owner := range owners {
		if owner == "" && p < len(o.owners) {
			owners[p] = o.owners[p]
		}
	}
	o.members, o.owners = cur, owners
}

// lastTake returns the newest event if it is a take of kind from from.
func (o *observer) lastTake(kind, from string) *Event {
	for i := len(o.events) - 1; i >= 0; i-- {
		e := &o.events[i]
		if e.Kind == EventHandoff || e.Kind == EventFailover {
			if e.Kind == kind && e.From == from {
				return e
			}
			return nil
		}
	}
	return nil
}

func takeDetail(kind, self, from string, n int) string {
	switch {
	case from == "":
		return fmt.Sprintf("%s took %d free partitions", self, n)
	case kind == EventFailover:
		return fmt.Sprintf("%s took %d partitions of %s, which is gone", self, n, from)
	default:
		return fmt.Sprintf("%s took %d partitions from %s", self, n, from)
	}
}

func ownersOf(parts []Partition) []string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = p.Owner
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// mergeEvents merges the nodes' lists: membership events seen by several
// nodes (same kind, node and membership version) appear once, at the
// earliest time one saw them; takes are each reported by their taker only.
// Newest first.
func mergeEvents(lists ...[]Event) []Event {
	seen := map[string]int{}
	var out []Event
	for _, l := range lists {
		for _, e := range l {
			if e.Kind == EventHandoff || e.Kind == EventFailover {
				out = append(out, e)
				continue
			}
			key := e.Kind + "\x00" + e.Node + "\x00" + e.MembershipVersion
			if i, ok := seen[key]; ok {
				if e.At.Before(out[i].At) {
					out[i] = e
				}
				continue
			}
			seen[key] = len(out)
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.After(out[j].At) })
	if len(out) > MaxEvents {
		out = out[:MaxEvents]
	}
	return out
}
