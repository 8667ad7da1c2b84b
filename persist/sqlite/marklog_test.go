package sqlite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// markModel is what the positions must read as: each commit's senders
// raised to their seq, each MarkRead to min(seq, head).
type markModel struct {
	heads map[string]uint64
	pos   map[string]map[uint64]uint64
}

func (m *markModel) raise(conv string, uid, seq uint64) {
	if m.pos[conv] == nil {
		m.pos[conv] = map[uint64]uint64{}
	}
	m.pos[conv][uid] = max(m.pos[conv][uid], seq)
}

// check compares every read of positions with the model.
func (m *markModel) check(t *testing.T, s *Store, convs []string, uids []uint64, step int) {
	t.Helper()
	ctx := context.Background()
	for _, uid := range uids {
		got, err := s.ReadStates(ctx, uid, convs)
		if err != nil {
			t.Fatalf("step %d: read states: %v", step, err)
		}
		for i, c := range convs {
			if got[i].ReadSeq != m.pos[c][uid] || got[i].Head != m.heads[c] {
				t.Fatalf("step %d: uid %d in %s: %+v, want read %d head %d", step, uid, c, got[i], m.pos[c][uid], m.heads[c])
			}
		}
	}
	for _, c := range convs {
		if m.heads[c] == 0 {
			continue
		}
		var seqs []uint64
		for q := uint64(1); q <= m.heads[c] && len(seqs) < sequencer.MaxReceiptSeqs; q += 1 + uint64(step%3) {
			seqs = append(seqs, q)
		}
		got, err := persist.ReadReceipts(ctx, s, c, seqs)
		if err != nil {
			t.Fatalf("step %d: receipts of %s: %v", step, c, err)
		}
		for i, q := range seqs {
			want := uint64(0)
			for _, p := range m.pos[c] {
				if p >= q {
					want++
				}
			}
			if got[i] != want {
				t.Fatalf("step %d: %s seq %d read by %d, want %d (all %v)", step, c, q, got[i], want, got)
			}
		}
		var want []persist.ReadPosition
		for u, p := range m.pos[c] {
			want = append(want, persist.ReadPosition{UID: u, ReadSeq: p})
		}
		slices.SortFunc(want, func(a, b persist.ReadPosition) int { return int(a.UID) - int(b.UID) })
		var all []persist.ReadPosition
		for after := uint64(0); ; {
			page, more, err := s.ReadPositionsPage(ctx, c, after, 2)
			if err != nil {
				t.Fatalf("step %d: page of %s: %v", step, c, err)
			}
			all = append(all, page...)
			if !more {
				break
			}
			after = page[len(page)-1].UID
		}
		if !slices.Equal(all, want) {
			t.Fatalf("step %d: positions of %s %v, want %v", step, c, all, want)
		}
	}
}

// The own-send marks read the same whether they are still in the log,
// applied, or reloaded from the log (a stale copy): commits, MarkRead,
// flushes and reloads in random order against a model.
func TestMarkLogReadsAsApplied(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	convs := []string{"g:m0", "g:m1", "g:m2"}
	uids := []uint64{1, 2, 3, 4, 5}
	m := &markModel{heads: map[string]uint64{}, pos: map[string]map[uint64]uint64{}}
	r := rand.New(rand.NewPCG(7, 11))
	var id uint64
	flushes, staleFlushes, reloads := 0, 0, 0
	for step := 0; step < 400; step++ {
		switch k := r.IntN(10); {
		case k < 5: // a commit over one or two conversations, one to three messages each
			var bs []persist.ConvBatch
			for _, ci := range r.Perm(len(convs))[:1+r.IntN(2)] {
				c := convs[ci]
				b := persist.ConvBatch{ConvID: c, PrevHead: m.heads[c], MarkSendersRead: r.IntN(5) > 0}
				for j := 0; j < 1+r.IntN(3); j++ {
					id++
					m.heads[c]++
					uid := uids[r.IntN(len(uids))]
					b.Messages = append(b.Messages, sequencer.Message{MsgID: id, ConvID: c, Seq: m.heads[c], FromUID: uid, MsgType: 1,
						Body: []byte("b"), ClientMsgID: fmt.Sprint("k", id), ServerAt: time.UnixMilli(1)})
					if b.MarkSendersRead {
						m.raise(c, uid, m.heads[c])
					}
				}
				bs = append(bs, b)
			}
			if err := s.Commit(ctx, bs); err != nil {
				t.Fatalf("step %d: commit: %v", step, err)
			}
		case k < 7: // MarkRead
			c, uid := convs[r.IntN(len(convs))], uids[r.IntN(len(uids))]
			seq := uint64(1 + r.IntN(int(m.heads[c])+2))
			st, err := s.MarkRead(ctx, c, uid, seq)
			if err != nil {
				t.Fatalf("step %d: mark read: %v", step, err)
			}
			if v := min(seq, m.heads[c]); v > 0 {
				m.raise(c, uid, v)
			}
			if st.ReadSeq != m.pos[c][uid] || st.Head != m.heads[c] {
				t.Fatalf("step %d: mark read %s uid %d seq %d: %+v, want read %d head %d", step, c, uid, seq, st, m.pos[c][uid], m.heads[c])
			}
		case k < 8: // the writer applies the log (no commit is in flight)
			s.pend.mu.Lock()
			if s.pend.stale {
				staleFlushes++ // by SQL from the log, not from the copy
			}
			s.pend.mu.Unlock()
			if s.flushMarks(true) != 0 {
				t.Fatalf("step %d: a flush failed", step)
			}
			flushes++
			var n int
			if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM mark_log`).Scan(&n); err != nil || n != 0 {
				t.Fatalf("step %d: %d rows in the log after a flush (%v)", step, n, err)
			}
		case k < 9: // the copy is lost and stale (as after a COMMIT of unknown outcome): reads reload it
			s.pend.mu.Lock()
			s.pend.stale = true
			clear(s.pend.convs)
			s.pend.mu.Unlock()
			reloads++
		default:
			m.check(t, s, convs, uids, step)
		}
	}
	m.check(t, s, convs, uids, -1)
	if flushes == staleFlushes || staleFlushes == 0 || reloads == 0 {
		t.Fatalf("%d flushes (%d of a stale copy), %d reloads: the schedule missed a case", flushes, staleFlushes, reloads)
	}
}

// Marks logged and not yet applied survive a crash: a restart reads them
// from the log at once and applies them.
func TestMarkLogSurvivesCrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sequencer.db")
	s := openAt(t, path)
	ctx := context.Background()
	b := persist.ConvBatch{ConvID: "g:crash", MarkSendersRead: true}
	for i := uint64(1); i <= 3; i++ {
		b.Messages = append(b.Messages, sequencer.Message{MsgID: i, ConvID: "g:crash", Seq: i, FromUID: 10 + i%2, MsgType: 1,
			Body: []byte("b"), ClientMsgID: fmt.Sprint("c", i), ServerAt: time.UnixMilli(1)})
	}
	if err := s.Commit(ctx, []persist.ConvBatch{b}); err != nil {
		t.Fatal(err)
	}
	var stored int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM read_position`).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("%d positions stored right after the commit (%v): the test wants them still in the log", stored, err)
	}
	// The files as a kill -9 now leaves them.
	img := filepath.Join(t.TempDir(), "sequencer.db")
	copyFile(t, path, img)
	copyFile(t, path+"-wal", img+"-wal")
	c := openAt(t, img)
	got, err := c.ReadStates(ctx, 11, []string{"g:crash"})
	if err != nil || got[0].ReadSeq != 3 {
		t.Fatalf("uid 11 after the crash: %+v %v, want read 3", got, err)
	}
	if got, err := c.ReadStates(ctx, 10, []string{"g:crash"}); err != nil || got[0].ReadSeq != 2 {
		t.Fatalf("uid 10 after the crash: %+v %v, want read 2", got, err)
	}
	// The restarted writer applied the log (at start, or a second later).
	deadline := time.Now().Add(5 * time.Second)
	for {
		var logged int
		if err := c.r.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM read_position), (SELECT count(*) FROM mark_log)`).Scan(&stored, &logged); err != nil {
			t.Fatal(err)
		}
		if stored == 2 && logged == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart: %d positions stored, %d log rows", stored, logged)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Close applies the log: a clean stop leaves every position in
// read_position (what an older binary, which knows no log, reads).
func TestMarkLogAppliedAtClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sequencer.db")
	s := openAt(t, path)
	ctx := context.Background()
	b := persist.ConvBatch{ConvID: "g:close", MarkSendersRead: true, Messages: []sequencer.Message{{MsgID: 1, ConvID: "g:close", Seq: 1,
		FromUID: 5, MsgType: 1, Body: []byte("b"), ClientMsgID: "c1", ServerAt: time.UnixMilli(1)}}}
	if err := s.Commit(ctx, []persist.ConvBatch{b}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := Open(ctx, path, Options{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var seq, logged int
	if err := c.r.QueryRowContext(ctx, `SELECT (SELECT read_seq FROM read_position WHERE conv_id = 'g:close' AND uid = 5), (SELECT count(*) FROM mark_log)`).Scan(&seq, &logged); err != nil || seq != 1 || logged != 0 {
		t.Fatalf("after Close: position %d, %d log rows (%v), want 1 and 0", seq, logged, err)
	}
}
