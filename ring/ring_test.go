package ring

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strconv"
	"testing"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// bruteForce computes the owners straight from the rule the library documents,
// without its data structures: every member has R points on a 64-bit circle at
// xxhash(NodeID + "/" + i); partition p starts at xxhash(littleEndian64(p)) and
// walks clockwise over the points (the point at the start included) taking the
// first member that owns fewer than cap = ceil(floor(P/N) * Load) partitions.
// Partitions are placed in order 0..P-1. Like the library, the walk looks at no
// more than (number of points - 1) points; ok is false when it finds no member.
func bruteForce(t *testing.T, members []Node, cfg Config) (owners []string, ok bool) {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatalf("bruteForce: %v", err)
	}
	type point struct {
		h     uint64
		owner string
	}
	var points []point
	seen := map[uint64]bool{}
	for _, m := range members {
		for i := range cfg.ReplicationFactor {
			h := xxhash.Sum64String(m.NodeID + "/" + strconv.Itoa(i))
			if seen[h] {
				t.Fatalf("bruteForce: 64-bit point collision for %q; pick other ids", m.NodeID)
			}
			seen[h] = true
			points = append(points, point{h, m.NodeID})
		}
	}
	capacity := math.Ceil(float64(cfg.Partitions/len(members)) * cfg.Load)
	load := map[string]float64{}
	owners = make([]string, cfg.Partitions)
	var buf [8]byte
	for p := range cfg.Partitions {
		binary.LittleEndian.PutUint64(buf[:], uint64(p))
		start := xxhash.Sum64(buf[:])
		// Visit points in clockwise order from start: increasing (h - start) mod 2^64,
		// found by scanning all points for the next larger distance each step.
		placed := false
		var last uint64
		for step := 0; step < len(points)-1; step++ {
			best, bestD := -1, uint64(0)
			for i, pt := range points {
				d := pt.h - start
				if (step == 0 || d > last) && (best < 0 || d < bestD) {
					best, bestD = i, d
				}
			}
			last = bestD
			o := points[best].owner
			if load[o]+1 <= capacity {
				load[o]++
				owners[p] = o
				placed = true
				break
			}
		}
		if !placed {
			return nil, false
		}
	}
	return owners, true
}

// randomMembers returns n members with distinct random NodeIDs. Some ids are
// numbered like "node-1", "node-11" so that the library's point keys would collide
// without the separator.
func randomMembers(rng *rand.Rand, n int) []Node {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_.:"
	used := map[string]bool{}
	var ms []Node
	for len(ms) < n {
		var id string
		switch rng.Intn(3) {
		case 0:
			id = "node-" + strconv.Itoa(rng.Intn(200))
		case 1:
			b := make([]byte, 1+rng.Intn(16))
			for i := range b {
				b[i] = alphabet[rng.Intn(len(alphabet))]
			}
			id = string(b)
		default:
			id = fmt.Sprintf("%08x-%04x", rng.Uint32(), rng.Intn(1<<16))
		}
		if used[id] {
			continue
		}
		used[id] = true
		ms = append(ms, Node{NodeID: id, Address: "10.0.0." + strconv.Itoa(len(ms)) + ":7070"})
	}
	return ms
}

func shuffled(rng *rand.Rand, ms []Node) []Node {
	out := slices.Clone(ms)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func mustNew(t *testing.T, ms []Node, cfg Config) *Ring {
	t.Helper()
	r, err := New(ms, cfg)
	if err != nil {
		t.Fatalf("New(%d members, %+v): %v", len(ms), cfg, err)
	}
	return r
}

func nodeIDs(ms []Node) []string {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.NodeID
	}
	return ids
}

// checkRing asserts what every ring must satisfy: each partition has exactly one
// owner, that owner is a member (with its address), and no member exceeds the
// bounded load.
func checkRing(t *testing.T, r *Ring, ms []Node, cfg Config) {
	t.Helper()
	cfg, _ = cfg.withDefaults()
	byID := map[string]Node{}
	for _, m := range ms {
		byID[m.NodeID] = m
	}
	as := r.Assignments()
	if len(as) != cfg.Partitions {
		t.Fatalf("%d assignments, want %d", len(as), cfg.Partitions)
	}
	load := map[string]int{}
	for p, o := range as {
		if byID[o.NodeID] != o {
			t.Fatalf("partition %d owned by %+v, not a member", p, o)
		}
		if got, ok := r.Owner(uint32(p)); !ok || got != o {
			t.Fatalf("Owner(%d) = %+v, %v; Assignments says %+v", p, got, ok, o)
		}
		load[o.NodeID]++
	}
	capacity := int(math.Ceil(float64(cfg.Partitions/len(ms)) * cfg.Load))
	total := 0
	for _, m := range ms {
		if load[m.NodeID] > capacity {
			t.Fatalf("member %q owns %d partitions, bound is %d", m.NodeID, load[m.NodeID], capacity)
		}
		total += len(r.OwnedBy(m.NodeID))
	}
	if total != cfg.Partitions {
		t.Fatalf("OwnedBy over all members covers %d partitions, want %d", total, cfg.Partitions)
	}
}

// With the default config, every member set of 1..64 random members gives the
// owners of the brute-force rule, the same owners in any insertion order, and a
// valid assignment.
func TestOwnersMatchBruteForce(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for n := 1; n <= 64; n++ {
		ms := randomMembers(rng, n)
		r := mustNew(t, ms, Config{})
		checkRing(t, r, ms, Config{})
		want, ok := bruteForce(t, ms, Config{})
		if !ok {
			t.Fatalf("brute force found no room for %d members under defaults", n)
		}
		if got := nodeIDs(r.Assignments()); !slices.Equal(got, want) {
			t.Fatalf("%d members %v: owners differ from brute force\n got %v\nwant %v", n, nodeIDs(ms), got, want)
		}
		r2 := mustNew(t, shuffled(rng, ms), Config{})
		if !slices.Equal(r.Assignments(), r2.Assignments()) {
			t.Fatalf("%d members: insertion order changed owners", n)
		}
		if moved := Moved(r, r2); len(moved) != 0 {
			t.Fatalf("Moved between equal rings = %v", moved)
		}
		if !slices.Equal(r.Nodes(), r2.Nodes()) {
			t.Fatalf("Members differ with insertion order")
		}
	}
}

// Small and odd configs (few partitions, replication factor 1..4, loads from 0.5
// to 2): New never panics; it fails with ErrNoRoom exactly when the brute-force
// rule cannot place every partition, and otherwise gives the brute-force owners.
func TestEdgeConfigsMatchBruteForce(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	var built, noRoom int
	for range 1500 {
		cfg := Config{
			Partitions:        1 + rng.Intn(40),
			ReplicationFactor: 1 + rng.Intn(4),
			Load:              0.5 + 1.5*rng.Float64(),
		}
		n := 1 + rng.Intn(50)
		ms := randomMembers(rng, n)
		want, ok := bruteForce(t, ms, cfg)
		r, err := New(shuffled(rng, ms), cfg)
		if !ok {
			if !errors.Is(err, ErrNoRoom) {
				t.Fatalf("%d members %+v: brute force finds no room, New returned %v", n, cfg, err)
			}
			noRoom++
			continue
		}
		if err != nil {
			t.Fatalf("%d members %+v: brute force places all, New: %v", n, cfg, err)
		}
		checkRing(t, r, ms, cfg)
		if got := nodeIDs(r.Assignments()); !slices.Equal(got, want) {
			t.Fatalf("%d members %+v: owners\n got %v\nwant %v", n, cfg, got, want)
		}
		built++
	}
	t.Logf("edge configs: %d built, %d ErrNoRoom", built, noRoom)
	if built < 100 || noRoom < 100 {
		t.Fatalf("edge configs not mixed enough: %d built, %d ErrNoRoom", built, noRoom)
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	two := []Node{{NodeID: "a"}, {NodeID: "b"}}
	cases := []struct {
		name    string
		members []Node
		cfg     Config
		want    error
	}{
		{"negative partitions", two, Config{Partitions: -1}, ErrInvalidConfig},
		{"too many partitions", two, Config{Partitions: MaxPartitions + 1}, ErrInvalidConfig},
		{"negative replication", two, Config{ReplicationFactor: -3}, ErrInvalidConfig},
		{"too much replication", two, Config{ReplicationFactor: MaxReplicationFactor + 1}, ErrInvalidConfig},
		{"negative load", two, Config{Load: -1}, ErrInvalidConfig},
		{"NaN load", two, Config{Load: math.NaN()}, ErrInvalidConfig},
		{"infinite load", two, Config{Load: math.Inf(1)}, ErrInvalidConfig},
		{"empty node id", []Node{{NodeID: "a"}, {Address: "x:1"}}, Config{}, ErrInvalidConfig},
		{"node id twice", []Node{{NodeID: "a", Address: "x:1"}, {NodeID: "b"}, {NodeID: "a", Address: "y:2"}}, Config{}, ErrInvalidConfig},
		// floor(271/272) = 0: the library would panic.
		{"more members than partitions", randomMembers(rand.New(rand.NewSource(3)), 272), Config{}, ErrNoRoom},
		{"members above partitions, small", randomMembers(rand.New(rand.NewSource(4)), 5), Config{Partitions: 3}, ErrNoRoom},
		// 64 members * ceil(4 * 1.0) = 256 < 271: the library would panic.
		{"load 1 with 64 members", randomMembers(rand.New(rand.NewSource(5)), 64), Config{Load: 1}, ErrNoRoom},
		{"load below 1", two, Config{Partitions: 10, Load: 0.5}, ErrNoRoom},
		// One member with one point: the library's walk checks no point at all.
		{"one member one point", []Node{{NodeID: "solo"}}, Config{ReplicationFactor: 1}, ErrNoRoom},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.members, tc.cfg)
			if !errors.Is(err, tc.want) {
				t.Fatalf("New = %v, %v; want error %v", r, err, tc.want)
			}
			if r != nil {
				t.Fatalf("New returned a ring with error %v", err)
			}
		})
	}
}

// No member set of 1..64 members panics or fails under the default config, nor
// under a few common configs.
func TestNoPanicForUsualSizes(t *testing.T) {
	rng := rand.New(rand.NewSource(6))
	for _, cfg := range []Config{{}, {Partitions: 1024}, {ReplicationFactor: 2}, {Load: 1.05}} {
		for n := 1; n <= 64; n++ {
			if cfg != (Config{}) && n%4 != 0 {
				continue // every size for the default, a sample for the others
			}
			ms := randomMembers(rng, n)
			r, err := New(ms, cfg)
			if cfg.Load == 1.05 && errors.Is(err, ErrNoRoom) {
				continue // a tight load may legitimately not fit; it must not panic
			}
			if err != nil {
				t.Fatalf("%+v, %d members: %v", cfg, n, err)
			}
			checkRing(t, r, ms, cfg)
		}
	}
}

func TestEmptyRing(t *testing.T) {
	for _, ms := range [][]Node{nil, {}} {
		r := mustNew(t, ms, Config{Partitions: 7})
		if r.Partitions() != 7 {
			t.Fatalf("Partitions = %d", r.Partitions())
		}
		for p := range uint32(8) {
			if m, ok := r.Owner(p); ok {
				t.Fatalf("empty ring: Owner(%d) = %+v", p, m)
			}
		}
		m, p, ok := r.OwnerOf("conv-1")
		if ok || m != (Node{}) || p != PartitionOf("conv-1", 7) {
			t.Fatalf("empty ring: OwnerOf = %+v, %d, %v", m, p, ok)
		}
		if r.Assignments() != nil || len(r.Nodes()) != 0 || r.OwnedBy("a") != nil {
			t.Fatalf("empty ring has assignments or members")
		}
		full := mustNew(t, []Node{{NodeID: "a"}}, Config{Partitions: 7})
		if got := Moved(r, full); len(got) != 7 {
			t.Fatalf("Moved(empty, full) = %v, want all 7", got)
		}
		if got := Moved(full, nil); len(got) != 7 {
			t.Fatalf("Moved(full, nil) = %v, want all 7", got)
		}
		if got := Moved(r, nil); len(got) != 0 {
			t.Fatalf("Moved(empty, nil) = %v, want none", got)
		}
	}
	if got := Moved(nil, nil); got != nil {
		t.Fatalf("Moved(nil, nil) = %v", got)
	}
}

func TestOwnerOutOfRange(t *testing.T) {
	r := mustNew(t, []Node{{NodeID: "a", Address: "h:1"}}, Config{Partitions: 5})
	if _, ok := r.Owner(5); ok {
		t.Fatal("Owner(5) on a 5-partition ring reported an owner")
	}
	if m, ok := r.Owner(4); !ok || m != (Node{NodeID: "a", Address: "h:1"}) {
		t.Fatalf("Owner(4) = %+v, %v", m, ok)
	}
	m, p, ok := r.OwnerOf("x")
	if !ok || m.NodeID != "a" || p >= 5 {
		t.Fatalf("OwnerOf = %+v, %d, %v", m, p, ok)
	}
}

func TestMovedAcrossPartitionCounts(t *testing.T) {
	ms := []Node{{NodeID: "a"}, {NodeID: "b"}}
	a := mustNew(t, ms, Config{Partitions: 5})
	b := mustNew(t, ms, Config{Partitions: 9})
	if got := Moved(a, b); len(got) != 9 || got[8] != 8 {
		t.Fatalf("Moved over different partition counts = %v, want 0..8", got)
	}
}

// An address change is not a move: ownership follows the NodeID.
func TestAddressDoesNotMoveOwnership(t *testing.T) {
	a := mustNew(t, []Node{{NodeID: "a", Address: "h:1"}, {NodeID: "b", Address: "h:2"}}, Config{})
	b := mustNew(t, []Node{{NodeID: "a", Address: "h:9"}, {NodeID: "b", Address: "h:2"}}, Config{})
	if got := Moved(a, b); len(got) != 0 {
		t.Fatalf("address change moved %v", got)
	}
	for _, p := range b.OwnedBy("a") {
		if m, _ := b.Owner(p); m.Address != "h:9" {
			t.Fatalf("owner of %d has address %q, want the new one", p, m.Address)
		}
	}
}

// The partition of a conversation is the library's FindPartitionID, whatever the
// members or the ring.
func TestPartitionMatchesLibrary(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for _, parts := range []int{1, 2, 7, 271, 1024, MaxPartitions} {
		lib := consistent.New(nil, consistent.Config{Hasher: xxhasher{}, PartitionCount: parts, ReplicationFactor: 1, Load: 1})
		empty := mustNew(t, nil, Config{Partitions: parts})
		var rings []*Ring
		if parts >= 2 {
			rings = append(rings, mustNew(t, randomMembers(rng, 1), Config{Partitions: parts}),
				mustNew(t, randomMembers(rng, 2), Config{Partitions: parts}))
		}
		for range 500 {
			b := make([]byte, rng.Intn(40))
			rng.Read(b)
			conv := string(b)
			want := uint32(lib.FindPartitionID(b))
			if got := empty.Partition(conv); got != want {
				t.Fatalf("P=%d: Partition(%q) = %d, library says %d", parts, conv, got, want)
			}
			for _, r := range rings {
				if got := r.Partition(conv); got != want {
					t.Fatalf("P=%d: Partition depends on members", parts)
				}
			}
		}
	}
}

// Pins the mapping so that a change of hash, separator or library version, which
// would make nodes of different builds disagree, fails loudly. The values were
// recorded from this implementation.
func TestGolden(t *testing.T) {
	partitions := map[string]uint32{
		"":            goldenPartitions[0],
		"conv-1":      goldenPartitions[1],
		"group:42":    goldenPartitions[2],
		"dm:alice:bo": goldenPartitions[3],
	}
	for conv, want := range partitions {
		if got := PartitionOf(conv, DefaultPartitions); got != want {
			t.Errorf("PartitionOf(%q) = %d, want %d", conv, got, want)
		}
	}
	var ms []Node
	for i := 1; i <= 12; i++ {
		ms = append(ms, Node{NodeID: "node-" + strconv.Itoa(i)})
	}
	r := mustNew(t, ms, Config{})
	h := sha256.New()
	for _, o := range r.Assignments() {
		h.Write([]byte(o.NodeID + "\n"))
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != goldenAssignment {
		t.Errorf("assignment digest for node-1..node-12 = %s, want %s", got, goldenAssignment)
	}
}

var (
	goldenPartitions = [4]uint32{171, 108, 160, 191}
	goldenAssignment = "b14525550f9cf6297fa7c0ef17677229bc837ef8a566f53545c53a79b8690ba2"
)

// loadCap is the most partitions one member may own: ceil(floor(P/n) * Load).
func loadCap(p, n int, load float64) int { return int(math.Ceil(float64(p/n) * load)) }

// movementBound is the most partitions one join or leave between n-1 and n members
// may move (P partitions, load factor load). It is an envelope, not a theorem:
//
//   - The member that joins (leaves) takes (gives up) about P/n partitions, and
//     the members it displaces in the bounded-load walk hand on about as many
//     again: 2 * P/n, plus one P/n for the uneven shares of random points.
//   - The less spare room the caps leave (slack s = n*cap/P - 1, the smaller of
//     the two rings'), the longer a displaced partition walks before it finds a
//     member with room, and the more partitions behind it shift: P/n / (4s).
//   - When floor(P/n) changes, the cap changes by dc for every member, and each
//     member that was full must shed (or may take) up to dc partitions; about half
//     of them are full: n*dc/2.
//   - A constant 4 absorbs small-number effects when P/n is only a few partitions.
//
// The constants were set above the worst of 100 random joins and 100 random leaves
// per size n = 2..64, for P = 97, 271 and 1024 (worst moved/bound: 0.96, 0.76,
// 0.66). The worst case is a change of cap: at P = 271, 54 <-> 55 members takes the
// cap from 7 to 5 and moved up to 79 partitions (29%, 16 x P/n) in those runs.
func movementBound(p, n int, load float64) int {
	c1, c2 := loadCap(p, n-1, load), loadCap(p, n, load)
	slack := min(float64(n*c2)/float64(p)-1, float64((n-1)*c1)/float64(p)-1)
	dc := c1 - c2
	b := float64(p)/float64(n)*(3+1/(4*slack)) + 4 + float64(n*dc)/2
	return int(math.Floor(b))
}

// A join or leave moves a bounded number of partitions, and at least all of those
// of the member that joined or left. The log reports the measured figures.
func TestMovementOnJoinAndLeave(t *testing.T) {
	rng := rand.New(rand.NewSource(8))
	const p = DefaultPartitions
	type worst struct {
		moved, n int
		event    string
	}
	ratio := func(w worst) float64 { return float64(w.moved*w.n) / p } // moved / (P/n)
	var most, mostSameCap, mostCapChange worst
	var worstShare float64 // moved / bound
	var sumRatio float64
	var events int
	observe := func(event string, n, moved int) {
		bound := movementBound(p, n, DefaultLoad)
		if moved > bound {
			t.Fatalf("%s between %d and %d members moved %d of %d partitions, bound %d", event, n-1, n, moved, p, bound)
		}
		w := worst{moved, n, event}
		if moved > most.moved {
			most = w
		}
		if loadCap(p, n-1, DefaultLoad) == loadCap(p, n, DefaultLoad) {
			if ratio(w) > ratio(mostSameCap) {
				mostSameCap = w
			}
		} else if ratio(w) > ratio(mostCapChange) {
			mostCapChange = w
		}
		worstShare = max(worstShare, float64(moved)/float64(bound))
		sumRatio += ratio(w)
		events++
	}
	var sizes []int // between n-1 and n members: every size once, three times where the cap changes
	for n := 2; n <= 64; n++ {
		sizes = append(sizes, n)
		if loadCap(p, n-1, DefaultLoad) != loadCap(p, n, DefaultLoad) {
			sizes = append(sizes, n, n)
		}
	}
	for _, n := range sizes {
		ms := randomMembers(rng, n)
		small := mustNew(t, ms[:n-1], Config{})
		big := mustNew(t, shuffled(rng, ms), Config{})

		joined := ms[n-1].NodeID
		moved := Moved(small, big)
		if owned := big.OwnedBy(joined); len(owned) == 0 || !isSubset(owned, moved) {
			t.Fatalf("join of %q: it owns %v, moved %v", joined, owned, moved)
		}
		observe("join", n, len(moved))

		gone := ms[rng.Intn(n)].NodeID
		after := mustNew(t, slices.DeleteFunc(slices.Clone(ms), func(m Node) bool { return m.NodeID == gone }), Config{})
		moved = Moved(big, after)
		if owned := big.OwnedBy(gone); !isSubset(owned, moved) {
			t.Fatalf("leave of %q: it owned %v, moved %v", gone, owned, moved)
		}
		observe("leave", n, len(moved))
	}
	t.Logf("P=%d, %d joins and leaves between 1..64 members: max moved %d (%s %d<->%d members); "+
		"worst where the cap stays: %d (%s %d<->%d, %.1f x P/n); worst where the cap changes: %d (%s %d<->%d, %.1f x P/n); "+
		"mean %.2f x P/n; worst moved/bound %.2f",
		p, events, most.moved, most.event, most.n-1, most.n,
		mostSameCap.moved, mostSameCap.event, mostSameCap.n-1, mostSameCap.n, ratio(mostSameCap),
		mostCapChange.moved, mostCapChange.event, mostCapChange.n-1, mostCapChange.n, ratio(mostCapChange),
		sumRatio/float64(events), worstShare)
}

// isSubset reports whether every element of sub (sorted) is in set (sorted).
func isSubset(sub, set []uint32) bool {
	for _, x := range sub {
		if _, ok := slices.BinarySearch(set, x); !ok {
			return false
		}
	}
	return true
}

// FuzzPartition: the partition of any conv_id is in range, is xxhash mod P, and
// does not depend on the members.
func FuzzPartition(f *testing.F) {
	for _, s := range []string{"", "conv-1", "group:42", "\x00\xff", "日本語"} {
		f.Add(s)
	}
	empty, err := New(nil, Config{})
	if err != nil {
		f.Fatal(err)
	}
	full, err := New(randomMembers(rand.New(rand.NewSource(9)), 10), Config{})
	if err != nil {
		f.Fatal(err)
	}
	lib := consistent.New(nil, consistent.Config{Hasher: xxhasher{}, PartitionCount: DefaultPartitions, ReplicationFactor: 1, Load: 1})
	f.Fuzz(func(t *testing.T, conv string) {
		p := empty.Partition(conv)
		if p >= DefaultPartitions {
			t.Fatalf("partition %d out of range", p)
		}
		if q := full.Partition(conv); q != p {
			t.Fatalf("partition depends on members: %d vs %d", p, q)
		}
		if q := uint32(lib.FindPartitionID([]byte(conv))); q != p {
			t.Fatalf("partition %d, library %d", p, q)
		}
		if _, q, ok := full.OwnerOf(conv); !ok || q != p {
			t.Fatalf("OwnerOf partition %d, ok %v; want %d", q, ok, p)
		}
		if q := PartitionOf(conv, DefaultPartitions); q != p {
			t.Fatalf("PartitionOf %d vs %d", q, p)
		}
	})
}
