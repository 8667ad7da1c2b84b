package conv

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
	"github.com/sequencer-im/sequencer/persist"
)

// TestStories runs the step scripts in testdata/*.txt (internal/storytest).
// Every command that feeds the core prints the Ready it produced.
func TestStories(t *testing.T) {
	storytest.Run(t, func(t *testing.T) func(string) string { return newHarness(t).do })
}

// fakeIDs issues 1001, 1002, ... and fails the next `fail` calls with err.
type fakeIDs struct {
	next uint64
	fail int
	err  error
}

func (f *fakeIDs) NextID() (uint64, error) {
	if f.fail > 0 {
		f.fail--
		return 0, f.err
	}
	f.next++
	return f.next, nil
}

type harness struct {
	t        *testing.T
	core     *Core
	ids      *fakeIDs
	clk      *clock.Fake
	start    time.Time
	fence    persist.Fence
	fenceErr error
	cancels  map[string]func(cause error) // the caller of a send gives up
	batch    *persist.ConvBatch           // last commit handed out
	lookup   []sequencer.ClientKey        // last lookup handed out
}

func newHarness(t *testing.T) *harness {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := &harness{t: t, ids: &fakeIDs{next: 1000}, clk: clock.NewFake(start), start: start, cancels: map[string]func(error){}}
	h.newCore(Config{ConvID: "c1"})
	return h
}

func (h *harness) newCore(cfg Config) {
	c, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.core = c
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
	c := h.core
	switch cmd {
	case "new":
		// new [conv=X] [max-queue=N] [max-batch=N] [memo=N] [floor=N] [target-cache=N] [edit-window=D] [recall-window=D]
		h.newCore(Config{ConvID: or(kv["conv"], "c1"), MaxQueue: h.atoi(kv["max-queue"]), MaxBatch: h.atoi(kv["max-batch"]), MemoSize: h.atoi(kv["memo"]),
			Floor: uint64(h.atoi(kv["floor"])), TargetCache: h.atoi(kv["target-cache"]),
			Windows: Windows{Edit: h.duration(kv["edit-window"]), Recall: h.duration(kv["recall-window"])}})
		return ""
	case "send":
		// send <token> <client> [uid=N] [conv=X] [ctx=done]
		uid := uint64(1)
		if v := kv["uid"]; v != "" {
			uid = uint64(h.atoi(v))
		}
		body := pos[1]
		if b, ok := kv["body"]; ok {
			body = b
		}
		tok, key := pos[0], sequencer.ClientKey{FromUID: uid, ClientMsgID: pos[1]}
		h.cancels[tok] = func(cause error) { c.Cancel(tok, key, cause) }
		c.Send(tok, sequencer.SendRequest{ConvID: or(kv["conv"], c.ConvID()), FromUID: uid,
			ClientMsgID: pos[1], MsgType: 1, Body: []byte(body)})
		if kv["ctx"] == "done" {
			// The caller gave up before the core saw the send (its
			// shell tells the core right after it).
			h.cancels[tok](context.Canceled)
		}
	case "edit", "recall":
		// edit <token> <client> target=<msgid> [uid=N] [body=X] [mod=true]
		// recall <token> <client> target=<msgid> [uid=N] [mod=true]
		uid := uint64(1)
		if v := kv["uid"]; v != "" {
			uid = uint64(h.atoi(v))
		}
		kind := sequencer.KindEdit
		if cmd == "recall" {
			kind = sequencer.KindRecall
		}
		tok := pos[0]
		req := sequencer.SendRequest{ConvID: c.ConvID(), FromUID: uid, ClientMsgID: pos[1], MsgType: 1, Body: []byte(kv["body"]),
			Kind: kind, TargetMsgID: uint64(h.atoi(kv["target"])), AsModerator: kv["mod"] == "true"}
		h.cancels[tok] = func(cause error) { c.Cancel(tok, req.Key(), cause) }
		c.Send(tok, req)
	case "targets-loaded":
		// targets-loaded <msgid>=msg:<from_uid>[:recalled] | event | elsewhere | notfound | <store error>, in any order
		var rs []TargetResult
		for _, a := range args {
			id, v, _ := strings.Cut(a, "=")
			parts := strings.Split(v, ":")
			r := TargetResult{MsgID: uint64(h.atoi(id))}
			m := sequencer.Message{MsgID: r.MsgID, ConvID: c.ConvID(), Seq: 1, MsgType: 1, ServerAt: h.start}
			switch parts[0] {
			case "msg":
				m.FromUID = uint64(h.atoi(parts[1]))
				m.Recalled = len(parts) > 2 && parts[2] == "recalled"
				r.Msg = m
			case "event":
				m.FromUID, m.Kind, m.TargetMsgID = 1, sequencer.KindEdit, 1
				r.Msg = m
			case "elsewhere":
				m.FromUID, m.ConvID = 1, "elsewhere"
				r.Msg = m
			case "notfound":
				r.Err = fmt.Errorf("get: %w", sequencer.ErrNotFound)
			default:
				r.Err = h.storeErr(parts[0])
			}
			rs = append(rs, r)
		}
		c.TargetsLoaded(rs)
	case "cancel":
		// cancel <token>... [cause=deadline]
		cause := context.Canceled
		if kv["cause"] == "deadline" {
			cause = context.DeadlineExceeded
		}
		for _, tok := range pos {
			h.cancels[tok](cause)
		}
		return ""
	case "head-loaded":
		if e := kv["error"]; e != "" {
			c.HeadLoaded(0, h.storeErr(e))
		} else {
			c.HeadLoaded(uint64(h.atoi(pos[0])), nil)
		}
	case "committed":
		switch {
		case len(pos) > 0 && pos[0] == "ok":
			c.Committed(nil)
		case len(pos) > 0 && pos[0] == "conflict":
			c.Committed(h.conflict(pos[1:]))
		default:
			c.Committed(h.storeErr(kv["error"]))
		}
	case "resolved":
		if e := kv["error"]; e != "" {
			c.Resolved(0, nil, h.storeErr(e))
			break
		}
		var rows []sequencer.Message
		switch kv["rows"] {
		case "batch":
			rows = h.batch.Messages
		case "other":
			for _, m := range h.batch.Messages {
				m.MsgID += 5000
				rows = append(rows, m)
			}
		}
		c.Resolved(uint64(h.atoi(kv["head"])), rows, nil)
	case "looked-up":
		// looked-up <client>=same:<msgid>:<seq> | other | notfound | error, in lookup order
		var rs []LookupResult
		for i, a := range args {
			_, v, _ := strings.Cut(a, "=")
			key := h.lookup[i]
			parts := strings.Split(v, ":")
			n := len(rs)
			switch parts[0] {
			case "same":
				rs = append(rs, LookupResult{Msg: sequencer.Message{MsgID: uint64(h.atoi(parts[1])), Seq: uint64(h.atoi(parts[2])),
					ConvID: c.ConvID(), FromUID: key.FromUID, ClientMsgID: key.ClientMsgID, MsgType: 1, Body: []byte(key.ClientMsgID), ServerAt: h.start}})
			case "changed":
				// Same conversation and key, another body: not a resend.
				rs = append(rs, LookupResult{Msg: sequencer.Message{MsgID: 66, Seq: 1, ConvID: c.ConvID(), FromUID: key.FromUID,
					ClientMsgID: key.ClientMsgID, MsgType: 1, Body: []byte("another body")}})
			case "other":
				rs = append(rs, LookupResult{Msg: sequencer.Message{MsgID: 77, Seq: 1, ConvID: "elsewhere", FromUID: key.FromUID, ClientMsgID: key.ClientMsgID}})
			case "notfound":
				rs = append(rs, LookupResult{Err: fmt.Errorf("find: %w", sequencer.ErrNotFound)})
			default:
				rs = append(rs, LookupResult{Err: h.storeErr(parts[0])})
			}
			rs[n].Key = key
		}
		// Answer in reverse order: results are matched by key, not position.
		slices.Reverse(rs)
		c.LookedUp(rs)
	case "ids":
		h.ids.fail = h.atoi(kv["fail"])
		h.ids.err = sequencer.ErrClockMovedBackwards
		if kv["err"] == "lease" {
			h.ids.err = sequencer.ErrWorkerLeaseLost
		}
		return ""
	case "fence":
		h.fence, h.fenceErr = persist.Fence{}, nil
		switch kv["error"] {
		case "not-owner":
			h.fenceErr = fmt.Errorf("partition 3: %w", sequencer.ErrNotOwner)
		case "moving":
			h.fenceErr = fmt.Errorf("partition 3: %w", sequencer.ErrOwnershipMoving)
		case "":
			h.fence = persist.Fence{Partition: uint32(h.atoi(kv["p"])), Owner: kv["owner"], Epoch: uint64(h.atoi(kv["epoch"]))}
		}
		return ""
	case "tick":
		h.clk.Advance(h.duration(pos[0]))
		return ""
	case "idle":
		return strconv.FormatBool(c.Idle())
	case "state":
		head, known := c.Head()
		return fmt.Sprintf("head=%d known=%v held=%d queued=%d floor=%d", head, known, c.Held(), len(c.queue), c.Floor())
	default:
		h.t.Fatalf("unknown command %q", cmd)
	}
	return h.printReady()
}

// formation answers Ready.Form from the harness's fence, ids and clock, as
// the actor does from the node's.
func (h *harness) formation(n int) Formation {
	if h.fenceErr != nil {
		return Formation{FenceErr: h.fenceErr}
	}
	f := Formation{Fence: h.fence, Now: h.clk.Now()}
	for range n {
		id, err := h.ids.NextID()
		if err != nil {
			f.IDErr = err
			break
		}
		f.IDs = append(f.IDs, id)
	}
	return f
}

// ready takes the core's Ready, answering a Form at once (the printed
// stories show the commit it leads to).
func ready(c *Core, form func(n int) Formation) Ready {
	rd := c.Ready()
	for rd.Form > 0 {
		c.Formed(form(rd.Form))
		more := c.Ready()
		more.Replies = append(rd.Replies, more.Replies...)
		if more.Regressed == nil {
			more.Regressed = rd.Regressed
		}
		rd = more
	}
	return rd
}

func (h *harness) printReady() string {
	rd := ready(h.core, h.formation)
	var b strings.Builder
	if rd.LoadHead {
		b.WriteString("load-head\n")
	}
	if len(rd.Targets) > 0 {
		fmt.Fprintf(&b, "targets %v\n", rd.Targets)
	}
	if rd.Commit != nil {
		h.batch = rd.Commit
		fence := "-"
		if !rd.Commit.Fence.IsZero() {
			fence = fmt.Sprintf("%d/%s/%d", rd.Commit.Fence.Partition, rd.Commit.Fence.Owner, rd.Commit.Fence.Epoch)
		}
		fmt.Fprintf(&b, "commit conv=%s prev=%d fence=%s\n", rd.Commit.ConvID, rd.Commit.PrevHead, fence)
		for _, m := range rd.Commit.Messages {
			fmt.Fprintf(&b, "  seq=%d msg=%d key=%d/%s at=+%s", m.Seq, m.MsgID, m.FromUID, m.ClientMsgID, m.ServerAt.Sub(h.start))
			if m.Kind != sequencer.KindMessage {
				fmt.Fprintf(&b, " %s of %d", m.Kind, m.TargetMsgID)
			}
			b.WriteString("\n")
		}
	}
	if rd.Resolve != nil {
		fmt.Fprintf(&b, "resolve after=%d count=%d", rd.Resolve.AfterSeq, rd.Resolve.Count)
		if rd.Resolve.Attempt > 0 {
			fmt.Fprintf(&b, " attempt=%d", rd.Resolve.Attempt)
		}
		b.WriteString("\n")
	}
	if len(rd.Lookup) > 0 {
		h.lookup = rd.Lookup
		b.WriteString("lookup")
		for _, k := range rd.Lookup {
			fmt.Fprintf(&b, " %d/%s", k.FromUID, k.ClientMsgID)
		}
		b.WriteString("\n")
	}
	if rd.Regressed != nil {
		fmt.Fprintf(&b, "regressed: %v\n", rd.Regressed)
	}
	for _, r := range rd.Replies {
		switch {
		case r.Err != nil:
			fmt.Fprintf(&b, "reply %v: error %s: %v\n", r.Token, sequencer.ErrorCode(r.Err), r.Err)
		case r.Result.Duplicate:
			fmt.Fprintf(&b, "reply %v: dup msg=%d seq=%d at=+%s\n", r.Token, r.Result.MsgID, r.Result.Seq, r.Result.ServerAt.Sub(h.start))
		default:
			fmt.Fprintf(&b, "reply %v: ok msg=%d seq=%d at=+%s\n", r.Token, r.Result.MsgID, r.Result.Seq, r.Result.ServerAt.Sub(h.start))
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

func (h *harness) conflict(specs []string) error {
	ce := &persist.ConflictError{}
	for _, s := range specs {
		kind, arg, _ := strings.Cut(s, ":")
		switch kind {
		case "client", "msgid":
			var row *sequencer.Message
			for i := range h.batch.Messages {
				if h.batch.Messages[i].ClientMsgID == arg {
					row = &h.batch.Messages[i]
				}
			}
			if row == nil {
				h.t.Fatalf("no row %q in flight", arg)
			}
			key := persist.KeyClientMsgID
			if kind == "msgid" {
				key = persist.KeyMsgID
			}
			ce.Conflicts = append(ce.Conflicts, persist.Conflict{Key: key, ConvID: row.ConvID, Seq: row.Seq, MsgID: row.MsgID, FromUID: row.FromUID, ClientMsgID: row.ClientMsgID})
		case "seq":
			// seq:first names the batch's first row
			row := h.batch.Messages[0]
			seq := row.Seq
			ce.Conflicts = append(ce.Conflicts, persist.Conflict{Key: persist.KeyConvSeq, ConvID: row.ConvID, Seq: seq, MsgID: row.MsgID, FromUID: row.FromUID, ClientMsgID: row.ClientMsgID})
		case "other":
			ce.Conflicts = append(ce.Conflicts, persist.Conflict{Key: persist.KeyClientMsgID, ConvID: "c9", Seq: 1, MsgID: 9, FromUID: 9, ClientMsgID: arg})
		default:
			h.t.Fatalf("bad conflict spec %q", s)
		}
	}
	return ce
}

func (h *harness) storeErr(kind string) error {
	switch kind {
	case "unavailable":
		return fmt.Errorf("dial: %w", sequencer.ErrStoreUnavailable)
	case "unknown":
		return fmt.Errorf("connection reset during COMMIT: %w", sequencer.ErrUnknownOutcome)
	case "timeout":
		return context.DeadlineExceeded
	case "head-mismatch":
		return &persist.HeadMismatchError{ConvIDs: []string{h.core.ConvID()}}
	case "stale-fence":
		return &persist.StaleFenceError{Fences: []persist.Fence{{Partition: 3, Owner: "n1", Epoch: 2}}}
	case "weird":
		return errors.New("weird driver error")
	}
	h.t.Fatalf("unknown error kind %q", kind)
	return nil
}

func (h *harness) atoi(s string) int { return parse(h.t, s, strconv.Atoi) }

func (h *harness) duration(s string) time.Duration { return parse(h.t, s, time.ParseDuration) }

// parse returns s parsed by p, the zero value for "" (a story's typo fails
// the test).
func parse[T any](t *testing.T, s string, p func(string) (T, error)) T {
	var v T
	if s == "" {
		return v
	}
	v, err := p(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
