package history

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// logState is a conversation: the keys appended so far, as a persistent
// list (every state shares its prefix with the states it came from, so a
// search that keeps many states keeps each key once, not once per state)
// with jump pointers for O(log n) access by index. The zero value is the
// empty log.
type logState struct {
	last *entry // nil: empty
}

// entry is the n-th key of a log (1-based) and the log before it.
type entry struct {
	key  string
	n    int
	h    uint64   // a hash of the keys 1..n in order
	up   []*entry // up[i] is the entry 2^i places before this one (up[0] the previous)
	keys *keyIndex
}

// keyIndex lists, for one conversation's search, every entry that appended
// each key (on any branch of the search): how indexOf finds a key without
// walking the log.
type keyIndex struct {
	by map[string][]*entry
}

func (s logState) len() int {
	if s.last == nil {
		return 0
	}
	return s.last.n
}

func (s logState) hash() uint64 {
	if s.last == nil {
		return 0
	}
	return s.last.h
}

// at returns the entry of index i (1..len) of s's log.
func (s logState) at(i int) *entry {
	e := s.last
	for e != nil && e.n > i {
		d := e.n - i
		k := 0
		for k+1 < len(e.up) && 1<<(k+1) <= d {
			k++
		}
		e = e.up[k]
	}
	return e
}

// indexOf returns key's index in s's log, 0 when it is not there.
func (s logState) indexOf(key string) int {
	if s.last == nil {
		return 0
	}
	for _, c := range s.last.keys.by[key] {
		if c.n <= s.last.n && s.at(c.n) == c {
			return c.n
		}
	}
	return 0
}

func (e *entry) prev() *entry {
	if len(e.up) == 0 {
		return nil
	}
	return e.up[0]
}

func (s logState) appendKey(key string) logState {
	f := fnv.New64a()
	f.Write([]byte(key))
	h := (s.hash()^f.Sum64())*1099511628211 + 1
	e := &entry{key: key, n: s.len() + 1, h: h}
	if s.last == nil {
		e.keys = &keyIndex{by: map[string][]*entry{}}
	} else {
		e.keys = s.last.keys
		e.up = append(e.up, s.last)
		for k := 0; ; k++ {
			a := e.up[k]
			if k >= len(a.up) {
				break
			}
			e.up = append(e.up, a.up[k])
		}
	}
	e.keys.by[key] = append(e.keys.by[key], e)
	return logState{last: e}
}

// equal reports whether a and b hold the same keys in the same order.
func (a logState) equal(b logState) bool {
	x, y := a.last, b.last
	for x != y {
		if x == nil || y == nil || x.n != y.n || x.h != y.h || x.key != y.key {
			return false
		}
		x, y = x.prev(), y.prev()
	}
	return true
}

// step is the model: can op happen on s, and what is the log after it.
func step(s logState, op *Op) (bool, logState) {
	switch op.Kind {
	case Send:
		switch op.Outcome {
		case OK:
			if i := s.indexOf(op.Key); i > 0 {
				return uint64(i) == op.Seq, s
			}
			if op.Seq != uint64(s.len())+1 {
				return false, s
			}
			return true, s.appendKey(op.Key)
		case Unknown:
			// Applied here, or (placed last, where nothing sees it) never.
			if s.indexOf(op.Key) > 0 {
				return true, s
			}
			return true, s.appendKey(op.Key)
		default:
			return true, s // an error answer: nothing, ever
		}
	case Pull:
		n := uint64(s.len())
		if op.Outcome == OK && op.Final && op.AfterSeq+uint64(len(op.Keys)) != n {
			return false, s // the whole log, and nothing but it
		}
		if op.Outcome != OK || len(op.Keys) == 0 {
			return true, s // nothing read (after_seq may be past the head)
		}
		if op.AfterSeq+uint64(len(op.Keys)) > n {
			return false, s
		}
		for i := range op.Keys {
			if i < len(op.Seqs) && op.Seqs[i] != op.AfterSeq+uint64(i)+1 {
				return false, s
			}
		}
		e := s.at(int(op.AfterSeq) + len(op.Keys))
		for i := len(op.Keys) - 1; i >= 0; i, e = i-1, e.prev() {
			if e.key != op.Keys[i] {
				return false, s
			}
		}
		return true, s
	case Head:
		if op.Outcome != OK {
			return true, s
		}
		return op.Head == uint64(s.len()), s
	}
	return false, s
}

// Model is the append-only log, for porcupine; inputs are *Op.
var Model = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var convs []string
		for _, o := range h {
			c := o.Input.(*Op).Conv
			if _, ok := by[c]; !ok {
				convs = append(convs, c)
			}
			by[c] = append(by[c], o)
		}
		sort.Strings(convs)
		out := make([][]porcupine.Operation, 0, len(convs))
		for _, c := range convs {
			out = append(out, by[c])
		}
		return out
	},
	Init: func() interface{} { return logState{} },
	Step: func(state, input, _ interface{}) (bool, interface{}) {
		return step(state.(logState), input.(*Op))
	},
	Hash:  func(state interface{}) uint64 { return state.(logState).hash() },
	Equal: func(a, b interface{}) bool { return a.(logState).equal(b.(logState)) },
	DescribeOperation: func(input, _ interface{}) string {
		op := input.(*Op)
		switch op.Kind {
		case Send:
			switch op.Outcome {
			case OK:
				d := ""
				if op.Duplicate {
					d = " (duplicate)"
				}
				return fmt.Sprintf("send(%s) -> seq %d%s", op.Key, op.Seq, d)
			case Unknown:
				return fmt.Sprintf("send(%s) -> unknown %s", op.Key, op.Code)
			}
			return fmt.Sprintf("send(%s) -> error %s", op.Key, op.Code)
		case Pull:
			if op.Outcome != OK {
				return fmt.Sprintf("pull(after %d) -> %s", op.AfterSeq, op.Code)
			}
			return fmt.Sprintf("pull(after %d) -> %v", op.AfterSeq, op.Keys)
		case Head:
			if op.Outcome != OK {
				return "head -> " + op.Code
			}
			return fmt.Sprintf("head -> %d", op.Head)
		}
		return op.String()
	},
	DescribeState: func(state interface{}) string {
		s := state.(logState)
		var tail []string
		for e := s.last; e != nil && len(tail) < 6; e = e.prev() {
			tail = append([]string{e.key}, tail...)
		}
		if s.len() > len(tail) {
			return fmt.Sprintf("%d entries: ... %v", s.len(), tail)
		}
		return fmt.Sprintf("%d entries: %v", s.len(), tail)
	},
	DescribeOperationMetadata: func(info interface{}) string {
		if info == nil {
			return ""
		}
		return info.(string)
	},
}

// operations turns a history into porcupine's form. An unknown outcome has
// no return: it stays open to the end.
//
// The attempts of one key whose outcome is unknown are merged: only the
// first attempt to reach the store appends the key and every other one
// finds it there and changes nothing, so one operation from the earliest
// call stands for all of them. When an attempt of the key was acked, the
// merged attempts fold into the ack that returned first (its call moved
// back to the earliest unknown attempt's): the key was appended between
// that call and that return, at the acked seq. Without this, a client that
// resent one key ten times while a node was unavailable gave porcupine
// 2^10 orders of no-op attempts to try per key, and a few such keys at once
// in one conversation made the search run out of time (TestClusterChurn,
// 36 unknown attempts in one conversation).
//
// In a conversation with a Final read, an unknown send whose key no ack and
// no read ever shows is left out: the final read shows the whole log, so it
// never landed before it, and after it nothing sees it. (Kept, it would be
// tried at every step of the search.)
func operations(ops []Op) []porcupine.Operation {
	firstAck := map[string]int{}     // conv+key -> the ack that returned first
	firstUnknown := map[string]int{} // conv+key -> its unknown attempt called first
	merged := map[string]int{}       // conv+key -> unknown attempts
	seen := map[string]bool{}        // conv+key shown by an ack or a read
	final := map[string]bool{}       // conversations with a Final read
	var last time.Duration
	for i, o := range ops {
		if o.Return > last {
			last = o.Return
		}
		if o.Call > last {
			last = o.Call
		}
		k := o.Conv + "\x00" + o.Key
		switch {
		case o.Kind == Send && o.Outcome == OK:
			seen[k] = true
			if j, ok := firstAck[k]; !ok || o.Return < ops[j].Return {
				firstAck[k] = i
			}
		case o.Kind == Send && o.Outcome == Unknown:
			merged[k]++
			if j, ok := firstUnknown[k]; !ok || o.Call < ops[j].Call {
				firstUnknown[k] = i
			}
		case o.Kind == Pull && o.Outcome == OK:
			final[o.Conv] = final[o.Conv] || o.Final
			for _, key := range o.Keys {
				seen[o.Conv+"\x00"+key] = true
			}
		}
	}
	never := int64(last) + 1 // after every answer: open to the end
	out := make([]porcupine.Operation, 0, len(ops))
	for i := range ops {
		o := &ops[i]
		call, ret, meta := int64(o.Call), int64(o.Return), o.String()
		k := o.Conv + "\x00" + o.Key
		if o.Kind == Send && o.Outcome == Unknown {
			_, acked := firstAck[k]
			if acked || firstUnknown[k] != i || (final[o.Conv] && !seen[k]) {
				continue // folded into the first ack, or into the first unknown attempt, or never landed
			}
			ret = never
			if n := merged[k]; n > 1 {
				meta += fmt.Sprintf(" (stands for the key's %d attempts of unknown outcome)", n)
			}
		}
		if o.Kind == Send && o.Outcome == OK && firstAck[k] == i {
			if j, ok := firstUnknown[k]; ok && ops[j].Call < o.Call {
				call = int64(ops[j].Call)
				meta += fmt.Sprintf(" (called at %v by the first of the key's %d attempts of unknown outcome)", ops[j].Call, merged[k])
			}
		}
		out = append(out, porcupine.Operation{ClientId: o.Client, Input: o, Call: call, Return: ret, Metadata: meta})
	}
	return out
}

// Result is the verdict on a history.
type Result struct {
	Counts
	Convs    int      // conversations checked
	Bad      []string // conversations with no legal order, with the first obvious reason found
	TimedOut bool     // the search did not finish: the history is NOT checked
	HTML     string   // the visualisation written for a failing history
}

// OK says the history was checked and is legal.
func (r Result) OK() bool { return !r.TimedOut && len(r.Bad) == 0 }

func (r Result) String() string {
	switch {
	case r.TimedOut:
		return fmt.Sprintf("history NOT checked (search timed out): %v", r.Counts)
	case len(r.Bad) > 0:
		return fmt.Sprintf("history of %d conversations violates the log model in %d (%s), see %s: %v",
			r.Convs, len(r.Bad), strings.Join(r.Bad, "; "), r.HTML, r.Counts)
	}
	return fmt.Sprintf("history of %d conversations is linearizable: %v", r.Convs, r.Counts)
}

// Check checks ops against the model. When it fails and dir is not empty,
// porcupine's visualisation is written to dir/name.html and the history as
// text to dir/name.txt.
func Check(ops []Op, timeout time.Duration, dir, name string) (Result, error) {
	res := Result{Counts: Count(ops)}
	pops := operations(ops)
	parts := Model.Partition(pops)
	res.Convs = len(parts)
	bad, timedOut := checkParts(parts, runtime.GOMAXPROCS(0), timeout)
	res.TimedOut = timedOut
	if len(bad) == 0 && !timedOut {
		return res, nil
	}
	var failing []porcupine.Operation
	for _, i := range bad {
		p := parts[i]
		conv := p[0].Input.(*Op).Conv
		res.Bad = append(res.Bad, conv+": "+explain(p))
		failing = append(failing, p...)
	}
	if dir == "" {
		return res, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	if len(failing) > 0 {
		// The visualisation: the failing conversations only, searched
		// again with the partial linearizations kept.
		_, info := porcupine.CheckOperationsVerbose(Model, failing, timeout)
		res.HTML = filepath.Join(dir, name+".html")
		if err := porcupine.VisualizePath(Model, info, res.HTML); err != nil {
			return res, fmt.Errorf("history visualisation: %w", err)
		}
	}
	var b strings.Builder
	for _, o := range ops {
		b.WriteString(o.String())
		b.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join(dir, name+".txt"), []byte(b.String()), 0o644); err != nil {
		return res, err
	}
	return res, nil
}

// checkParts checks each conversation's operations on its own, at most
// workers at a time, within timeout in all, and returns the indexes of the
// parts with no legal order (sorted) and whether the time ran out first.
// porcupine checks a partitioned history's parts all at once, and each
// part's search keeps a bitset of all its operations per state it caches:
// memory that grows with the square of a conversation's operations, summed
// over every conversation at once. A 60-minute soak's history (120
// conversations of about 35,000 operations each) took more than the
// machine's 24 GiB that way; checked two at a time, a larger one (5.3
// million operations) left the test process at 12.4 GB, 5.2 GB of it
// the history and ledger held before the check.
func checkParts(parts [][]porcupine.Operation, workers int, timeout time.Duration) (bad []int, timedOut bool) {
	one := Model
	one.Partition, one.PartitionEvent = nil, nil
	deadline := time.Now().Add(timeout)
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				left := time.Until(deadline)
				verdict := porcupine.Unknown
				if left > 0 {
					verdict = porcupine.CheckOperationsTimeout(one, parts[i], left)
				}
				mu.Lock()
				switch verdict {
				case porcupine.Illegal:
					bad = append(bad, i)
				case porcupine.Unknown:
					timedOut = true
				}
				mu.Unlock()
			}
		}()
	}
	for i := range parts {
		next <- i
	}
	close(next)
	wg.Wait()
	sort.Ints(bad)
	return bad, timedOut
}

// explain names an obvious violation in one conversation's operations, for
// the report; porcupine's verdict is the check.
func explain(p []porcupine.Operation) string {
	bySeq := map[uint64]string{}
	byKey := map[string]uint64{}
	failed := map[string]bool{}
	mayStore := map[string]bool{}
	var maxHead, maxAck uint64
	for _, po := range p {
		o := po.Input.(*Op)
		switch {
		case o.Kind == Send && o.Outcome == OK:
			if k, ok := bySeq[o.Seq]; ok && k != o.Key {
				return fmt.Sprintf("seq %d acked to %s and to %s", o.Seq, k, o.Key)
			}
			if s, ok := byKey[o.Key]; ok && s != o.Seq {
				return fmt.Sprintf("%s acked at seq %d and at seq %d", o.Key, s, o.Seq)
			}
			bySeq[o.Seq], byKey[o.Key] = o.Key, o.Seq
			mayStore[o.Key] = true
			maxAck = max(maxAck, o.Seq)
		case o.Kind == Send && o.Outcome == Unknown:
			mayStore[o.Key] = true
		case o.Kind == Send:
			failed[o.Key] = true
		case o.Kind == Head && o.Outcome == OK:
			maxHead = max(maxHead, o.Head)
		}
	}
	for _, po := range p {
		o := po.Input.(*Op)
		if o.Kind != Pull || o.Outcome != OK {
			continue
		}
		seen := map[string]uint64{}
		for i, k := range o.Keys {
			s := o.AfterSeq + uint64(i) + 1
			if i < len(o.Seqs) && o.Seqs[i] != s {
				return fmt.Sprintf("read seq %d where seq %d belongs: a hole", o.Seqs[i], s)
			}
			if failed[k] && !mayStore[k] {
				return fmt.Sprintf("%s is stored at seq %d but every send of it was answered with an error", k, s)
			}
			if prev, ok := seen[k]; ok {
				return fmt.Sprintf("%s stored at seq %d and %d", k, prev, s)
			}
			seen[k] = s
			if a, ok := byKey[k]; ok && a != s {
				return fmt.Sprintf("%s acked at seq %d but read at seq %d", k, a, s)
			}
		}
	}
	for i := 0; i < len(p); i++ {
		a := p[i].Input.(*Op)
		for j := 0; j < len(p); j++ {
			b := p[j].Input.(*Op)
			if a.Kind == Head && b.Kind == Head && a.Outcome == OK && b.Outcome == OK && a.Return < b.Call && b.Head < a.Head {
				return fmt.Sprintf("head went backwards: %d, then %d", a.Head, b.Head)
			}
			if a.Kind == Send && a.Outcome == OK && b.Kind == Head && b.Outcome == OK && a.Return < b.Call && b.Head < a.Seq {
				return fmt.Sprintf("head %d read after seq %d was acked", b.Head, a.Seq)
			}
		}
	}
	if maxAck > 0 && uint64(len(bySeq)) < maxAck {
		return fmt.Sprintf("acks up to seq %d but only %d seqs acked: a hole no open send explains?", maxAck, len(bySeq))
	}
	return "no linearization of the log model"
}
