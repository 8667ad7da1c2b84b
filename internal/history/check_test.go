package history

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// b builds histories by hand: times in milliseconds.
type b struct{ ops []Op }

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func (h *b) ack(client int, key string, call, ret int, seq uint64) *b {
	h.ops = append(h.ops, Op{Kind: Send, Conv: "c", Client: client, Key: key, Call: ms(call), Return: ms(ret), Outcome: OK, Seq: seq, MsgID: 1000 + seq})
	return h
}

func (h *b) dup(client int, key string, call, ret int, seq uint64) *b {
	h.ack(client, key, call, ret, seq)
	h.ops[len(h.ops)-1].Duplicate = true
	return h
}

func (h *b) fail(client int, key string, call, ret int, code string) *b {
	h.ops = append(h.ops, Op{Kind: Send, Conv: "c", Client: client, Key: key, Call: ms(call), Return: ms(ret), Outcome: OutcomeOfCode(code, true), Code: code})
	return h
}

func (h *b) lost(client int, key string, call, ret int) *b {
	h.ops = append(h.ops, Op{Kind: Send, Conv: "c", Client: client, Key: key, Call: ms(call), Return: ms(ret), Outcome: OutcomeOfCode("unavailable", false), Code: "unavailable"})
	return h
}

func (h *b) head(client int, call, ret int, head uint64) *b {
	h.ops = append(h.ops, Op{Kind: Head, Conv: "c", Client: client, Call: ms(call), Return: ms(ret), Outcome: OK, Head: head})
	return h
}

func (h *b) pull(client int, call, ret int, after uint64, keys ...string) *b {
	seqs := make([]uint64, len(keys))
	for i := range seqs {
		seqs[i] = after + uint64(i) + 1
	}
	h.ops = append(h.ops, Op{Kind: Pull, Conv: "c", Client: client, Call: ms(call), Return: ms(ret), Outcome: OK, AfterSeq: after, Keys: keys, Seqs: seqs})
	return h
}

// final marks the last pull as the final read of the whole log.
func (h *b) final() *b {
	h.ops[len(h.ops)-1].Final = true
	return h
}

// withSeqs sets the seqs of the last pull.
func (h *b) withSeqs(seqs ...uint64) *b {
	h.ops[len(h.ops)-1].Seqs = seqs
	return h
}

func TestLegalHistories(t *testing.T) {
	cases := map[string]*b{
		"sequential sends, resend, reads": new(b).ack(0, "a", 0, 10, 1).ack(1, "b", 11, 20, 2).dup(0, "a", 21, 30, 1).
			head(2, 31, 32, 2).pull(2, 33, 34, 0, "a", "b"),
		// Concurrent sends may take their seqs in either order.
		"concurrent sends": new(b).ack(0, "a", 0, 10, 2).ack(1, "b", 0, 10, 1).pull(2, 11, 12, 1, "a"),
		// A send with no answer stored later: the client's resend learns its seq.
		"lost answer then resend": new(b).lost(0, "a", 0, 10).ack(1, "b", 20, 30, 2).dup(0, "a", 40, 50, 1),
		// A lost send that never landed changes nothing.
		"lost and never stored": new(b).lost(0, "a", 0, 10).ack(1, "b", 20, 30, 1).pull(2, 40, 41, 0, "b").head(2, 42, 43, 1),
		// A lost send may land long after its client gave up (a slow commit).
		"lost send lands late": new(b).lost(0, "a", 0, 10).ack(1, "b", 20, 30, 1).head(2, 31, 32, 1).pull(2, 60, 61, 0, "b", "a"),
		// An error answer, then a resend that is stored.
		"error then resend": new(b).fail(0, "a", 0, 10, "unavailable").ack(0, "a", 20, 30, 1),
		// A final read shows the whole log: a lost send it does not show never landed.
		"lost, final read without it": new(b).lost(0, "x", 0, 10).ack(1, "a", 5, 20, 1).pull(2, 30, 30, 0, "a").final(),
		// A pull past the head reads nothing.
		"pull past the head": new(b).ack(0, "a", 0, 10, 1).pull(1, 11, 12, 6),
		// A head read while a send is in flight may see it.
		"head sees a send in flight": new(b).ack(0, "a", 0, 100, 1).head(1, 10, 20, 1),
		// The first of several lost attempts stored the key: a read shows it
		// before the resend that is acked was even called.
		"stored by an earlier lost attempt": new(b).lost(0, "a", 0, 10).lost(0, "a", 11, 20).pull(1, 21, 22, 0, "a").
			ack(0, "a", 30, 40, 1).head(1, 41, 42, 1),
		// Lost attempts of a key that is never acked, one of them stored.
		"lost attempts, one stored": new(b).lost(0, "a", 0, 10).lost(0, "a", 11, 20).ack(1, "b", 21, 30, 2).pull(2, 31, 32, 0, "a", "b").final(),
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			res, err := Check(h.ops, 10*time.Second, "", "")
			if err != nil {
				t.Fatal(err)
			}
			if !res.OK() {
				t.Fatalf("legal history rejected: %v", res)
			}
		})
	}
}

func TestIllegalHistoriesAreCaught(t *testing.T) {
	cases := map[string]struct {
		h    *b
		want string // in the explanation
	}{
		"doubled seq":       {new(b).ack(0, "a", 0, 10, 1).ack(1, "b", 20, 30, 1), "seq 1 acked to"},
		"resend, other seq": {new(b).ack(0, "a", 0, 10, 1).ack(1, "b", 20, 30, 2).dup(0, "a", 40, 50, 2), "seq 2 acked to b and to a"},
		"hole":              {new(b).ack(0, "a", 0, 10, 1).ack(1, "b", 20, 30, 3), "hole"},
		"hole seen by pull": {new(b).ack(0, "a", 0, 10, 1).lost(1, "b", 20, 30).pull(2, 40, 41, 0, "a", "b").withSeqs(1, 3), "a hole"},
		"error then stored": {new(b).fail(0, "a", 0, 10, "unavailable").ack(1, "b", 20, 30, 1).pull(2, 40, 41, 0, "b", "a"),
			"answered with an error"},
		"error, later read as stored": {new(b).ack(1, "b", 0, 5, 1).fail(0, "a", 10, 20, "resource_exhausted").head(2, 30, 31, 2), "no linearization"},
		"head backwards":              {new(b).ack(0, "a", 0, 10, 1).ack(0, "b", 11, 20, 2).head(1, 21, 22, 2).head(1, 23, 24, 1), "head 1 read after seq 2"},
		"head backwards, reads only":  {new(b).lost(0, "a", 0, 10).head(1, 21, 22, 1).head(1, 23, 24, 0), "head went backwards"},
		"final read misses an ack":    {new(b).lost(0, "x", 0, 10).ack(1, "a", 5, 20, 1).ack(1, "b", 21, 25, 2).pull(2, 30, 30, 0, "a").final(), "no linearization"},
		"final read with a hole":      {new(b).ack(0, "a", 0, 10, 1).lost(1, "x", 11, 12).ack(0, "b", 13, 20, 3).pull(2, 30, 30, 0, "a", "b").withSeqs(1, 3).final(), "hole"},
		"head behind an ack":          {new(b).ack(0, "a", 0, 10, 1).head(1, 11, 12, 0), "head 0 read after seq 1"},
		"key stored twice":            {new(b).lost(0, "a", 0, 10).ack(1, "b", 20, 30, 2).pull(2, 40, 41, 0, "a", "b", "a"), "stored at seq 1 and 3"},
		"acked but read elsewhere":    {new(b).ack(0, "a", 0, 10, 1).ack(1, "b", 11, 20, 2).pull(2, 30, 31, 0, "b", "a"), "b acked at seq 2 but read at seq 1"},
		// Merging a key's attempts must not move its append before the
		// first of them: a read that shows the key before any attempt of it
		// was called is still caught.
		"read before every attempt": {new(b).pull(1, 0, 5, 0, "a").lost(0, "a", 10, 20).lost(0, "a", 21, 30).ack(0, "a", 31, 40, 1), "no linearization"},
		// Lost attempts then an ack: the seq is still the acked one.
		"lost attempts, read at another seq": {new(b).lost(0, "a", 0, 10).lost(0, "a", 11, 20).ack(1, "b", 21, 30, 1).ack(0, "a", 31, 40, 2).
			pull(2, 41, 42, 0, "a", "b"), "a acked at seq 2 but read at seq 1"},
	}
	dir := t.TempDir()
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			res, err := Check(c.h.ops, 10*time.Second, dir, strings.ReplaceAll(name, " ", "-"))
			if err != nil {
				t.Fatal(err)
			}
			if res.OK() {
				t.Fatalf("illegal history accepted: %v", res)
			}
			if len(res.Bad) != 1 || !strings.Contains(res.Bad[0], c.want) {
				t.Errorf("explanation %q, want it to say %q", res.Bad, c.want)
			}
			html, err := os.ReadFile(res.HTML)
			if err != nil || !strings.Contains(string(html), "<html") {
				t.Fatalf("no visualisation at %s: %v", res.HTML, err)
			}
			if _, err := os.Stat(strings.TrimSuffix(res.HTML, ".html") + ".txt"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A resend storm, the shape of a failover under load: while the
// conversation's owner is unavailable, each of 40 clients resends its
// message every few milliseconds (12 attempts of unknown outcome each,
// overlapping every other client's); then the new owner acks them one
// after the other, and readers see the head grow. The attempts of a key are
// merged into one operation; checked one by one, the 480 open attempts made
// the search run out of time (as in the e2e TestClusterChurn, 36 in one
// conversation).
func TestResendStormIsChecked(t *testing.T) {
	h := new(b)
	const clients, attempts = 40, 12
	var keys []string
	for c := 0; c < clients; c++ {
		key := fmt.Sprintf("k%d", c)
		keys = append(keys, key)
		for a := 0; a < attempts; a++ {
			h.lost(c, key, c+a*8, c+a*8+6)
		}
	}
	for c, key := range keys {
		at := 200 + 3*c
		h.ack(c, key, at, at+2, uint64(c+1))
		h.head(clients, at+2, at+3, uint64(c+1))
	}
	h.pull(clients, 400, 401, 0, keys...).final()
	start := time.Now()
	res, err := Check(h.ops, 30*time.Second, "", "")
	if err != nil || !res.OK() {
		t.Fatalf("%v %v", res, err)
	}
	t.Logf("%d operations checked in %v", len(h.ops), time.Since(start))
}

// Conversations are checked apart: a bad one is named, the good one is not.
func TestPartitionedByConversation(t *testing.T) {
	good := new(b).ack(0, "a", 0, 10, 1).ack(1, "b", 11, 20, 2).ops
	bad := new(b).ack(0, "x", 0, 10, 1).ack(1, "y", 11, 20, 1).ops
	for i := range bad {
		bad[i].Conv = "other"
	}
	res, err := Check(append(good, bad...), 10*time.Second, filepath.Join(t.TempDir(), "sub"), "two")
	if err != nil {
		t.Fatal(err)
	}
	if res.Convs != 2 || len(res.Bad) != 1 || !strings.HasPrefix(res.Bad[0], "other:") {
		t.Fatalf("got %v", res)
	}
}

func TestOutcomeOfCode(t *testing.T) {
	for _, c := range []struct {
		code     string
		answered bool
		want     Outcome
	}{
		{"", true, OK}, {"unavailable", true, Failed}, {"resource_exhausted", true, Failed},
		{"already_exists", true, Failed}, {"deadline_exceeded", true, Unknown}, {"canceled", true, Unknown},
		{"unknown", true, Unknown}, {"unavailable", false, Unknown}, {"internal", false, Unknown},
	} {
		if got := OutcomeOfCode(c.code, c.answered); got != c.want {
			t.Errorf("OutcomeOfCode(%q, %v) = %v, want %v", c.code, c.answered, got, c.want)
		}
	}
}

func TestRecorderCounts(t *testing.T) {
	r := NewRecorder()
	for _, o := range new(b).ack(0, "a", 0, 10, 1).dup(0, "a", 11, 300, 1).fail(1, "b", 0, 1, "unavailable").lost(1, "c", 0, 1).ops {
		r.Add(o)
	}
	c := Count(r.Ops())
	if c.Sends != 4 || c.Acked != 2 || c.Duplicates != 1 || c.Unknown != 1 || c.Errors["unavailable"] != 2 || c.SlowestAck != ms(289) {
		t.Fatalf("counts %+v", c)
	}
}

// Conversations are checked a few at a time (memory grows with the square
// of a conversation's operations): every bad one is still found, whatever
// the number of workers, and reported in conversation order.
func TestPartsCheckedAFewAtATime(t *testing.T) {
	var ops []Op
	for c := 0; c < 40; c++ {
		conv := fmt.Sprintf("c%02d", c)
		part := new(b).ack(0, "a", 0, 10, 1).ack(1, "b", 11, 20, 2).ops
		if c%13 == 5 { // c05, c18, c31: two keys acked at seq 1
			part = new(b).ack(0, "x", 0, 10, 1).ack(1, "y", 11, 20, 1).ops
		}
		for i := range part {
			part[i].Conv = conv
		}
		ops = append(ops, part...)
	}
	parts := Model.Partition(operations(ops))
	for _, w := range []int{1, 3, 64} {
		bad, timedOut := checkParts(parts, w, 10*time.Second)
		if timedOut || fmt.Sprint(bad) != "[5 18 31]" {
			t.Errorf("%d workers: bad %v, timed out %v; want [5 18 31]", w, bad, timedOut)
		}
	}
	if _, timedOut := checkParts(parts, 2, 0); !timedOut {
		t.Errorf("no time at all: not reported as timed out")
	}
}

// A file recorder gives back exactly what was recorded, in order, from many
// goroutines, and its history checks like the in-memory one's.
func TestFileRecorderGivesBackWhatWasRecorded(t *testing.T) {
	ops := new(b).ack(0, "a", 0, 10, 1).dup(0, "a", 11, 300, 1).fail(1, "b", 0, 1, "unavailable").lost(1, "c", 0, 1).ops
	ops = append(ops,
		Op{Kind: Pull, Conv: "x", Node: "n2", Client: 3, AfterSeq: 1, Call: ms(400), Return: ms(410), Keys: []string{"7/a"}, Seqs: []uint64{2}},
		Op{Kind: Head, Conv: "x", Node: "n1", Client: 4, Call: ms(5), Return: ms(6), Head: 1},
		Op{}, // every field zero still counts as one operation
		Op{Kind: Pull, Conv: "x", Node: "store", Client: -1, Call: ms(900), Return: ms(900), Final: true, Keys: []string{"1/a", "7/a"}, Seqs: []uint64{1, 2}})
	r, err := NewFileRecorder(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, o := range ops {
		r.Add(o)
	}
	if got := r.Ops(); !reflect.DeepEqual(got, ops) {
		t.Fatalf("read back\n%v\nwant\n%v", got, ops)
	}
	// Recording goes on after a read, concurrently.
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				r.Add(Op{Kind: Send, Conv: fmt.Sprintf("g%d", g), Client: g, Key: fmt.Sprintf("%d/%d", g, i), Call: time.Duration(i), Return: time.Duration(i + 1), Seq: uint64(i + 1)})
			}
		}(g)
	}
	wg.Wait()
	got := r.Ops()
	if len(got) != len(ops)+8*500 {
		t.Fatalf("%d operations read back, want %d", len(got), len(ops)+8*500)
	}
	next := map[string]uint64{}
	for _, o := range got[len(ops):] {
		if next[o.Conv]++; o.Seq != next[o.Conv] || o.Key != fmt.Sprintf("%d/%d", o.Client, o.Seq-1) {
			t.Fatalf("out of order or garbled: %v", o)
		}
	}
	if res, err := Check(got[len(ops):], 10*time.Second, "", ""); err != nil || !res.OK() {
		t.Fatalf("check: %v %v", res, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Errorf("Ops after Close did not panic")
		}
	}()
	r.Ops()
}
