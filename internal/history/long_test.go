package history

import (
	"fmt"
	"testing"
	"time"
)

// A long single-conversation history (a probe that sends one message at a
// time for minutes) with lost answers that never landed is checked, not
// timed out.
func TestLongHistoryIsChecked(t *testing.T) {
	var ops []Op
	at := time.Duration(0)
	seq := uint64(0)
	for i := 0; i < 6000; i++ {
		key := fmt.Sprintf("k%d", i)
		if i%100 == 7 { // an attempt whose answer was lost and that never landed
			ops = append(ops, Op{Kind: Send, Conv: "probe", Client: 1, Key: "lost-" + key, Call: at, Return: at + 1, Outcome: Unknown, Code: "unavailable"})
		}
		if i%50 == 3 { // a lost answer, resent and acked
			ops = append(ops, Op{Kind: Send, Conv: "probe", Client: 0, Key: key, Call: at, Return: at + 2, Outcome: Unknown, Code: "unavailable"})
			at += 3
		}
		seq++
		ops = append(ops, Op{Kind: Send, Conv: "probe", Client: 0, Key: key, Call: at, Return: at + 5, Outcome: OK, Seq: seq})
		at += 10
		if i%200 == 0 {
			ops = append(ops, Op{Kind: Head, Conv: "probe", Client: 2, Call: at, Return: at + 1, Outcome: OK, Head: seq})
			at += 2
		}
	}
	var keys []string
	var seqs []uint64
	for _, o := range ops {
		if o.Kind == Send && o.Outcome == OK && (len(seqs) == 0 || seqs[len(seqs)-1] < o.Seq) {
			keys, seqs = append(keys, o.Key), append(seqs, o.Seq)
		}
	}
	ops = append(ops, Op{Kind: Pull, Conv: "probe", Client: 3, Call: at + 10, Return: at + 10, Outcome: OK, Keys: keys, Seqs: seqs, Final: true})
	start := time.Now()
	res, err := Check(ops, time.Minute, "", "")
	if err != nil || !res.OK() {
		t.Fatalf("%v %v", res, err)
	}
	t.Logf("%d operations checked in %v", len(ops), time.Since(start))
}
