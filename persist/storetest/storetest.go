// Package storetest is the ONE conformance suite every persist.Store
// implementation runs: `storetest.Run(t, newStore)` from the store package's
// tests. It checks the behaviour the sequencer relies on (heads, atomic
// multi-conversation commits, unique keys, fences, ranges, worker leases,
// read positions: persist.ReadPositions, which every store implements),
// through the Store interface only, plus the optional Hooks for states the
// interface cannot reach.
//
// It never depends on a particular backend, never sleeps, and takes every
// lease time from a fixed base time it moves by hand.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

// Hooks are test-only abilities a store under test provides (declare them in
// the store package's _test.go files). Subtests that need them fail when the
// store lacks them.
type Hooks interface {
	// PutPartitionLeaseForTest makes partition f.Partition held by f.Owner at
	// f.Epoch (insert or overwrite).
	PutPartitionLeaseForTest(ctx context.Context, f persist.Fence) error
	// SetHeadForTest overwrites conv's stored head, e.g. to put it behind its
	// rows as imported data might be.
	SetHeadForTest(ctx context.Context, convID string, head uint64) error
}

// base is the suite's clock for worker leases.
var base = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

// serverAt has nanoseconds and a non-UTC zone: stores keep milliseconds, UTC.
var serverAt = time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.FixedZone("CET", 3600))

var nextID atomic.Uint64

func init() { nextID.Store(7_000_000_000_000) }

// suite is one subtest's store and helpers.
type suite struct {
	t     *testing.T
	ctx   context.Context
	s     persist.Store
	convN int
}

func newSuite(t *testing.T, newStore func(t *testing.T) persist.Store) *suite {
	return &suite{t: t, ctx: context.Background(), s: newStore(t)}
}

// conv returns a new conversation id unique within the subtest.
func (x *suite) conv() string {
	x.convN++
	return fmt.Sprintf("g:%s:%d", strings.ReplaceAll(x.t.Name(), "/", "."), x.convN)
}

// msg builds a message with fresh ids.
func msg(conv string, seq uint64) sequencer.Message {
	id := nextID.Add(1)
	return sequencer.Message{
		MsgID: id, ConvID: conv, Seq: seq, FromUID: 1000 + id%7, MsgType: 1,
		Body: []byte(fmt.Sprintf("body %s #%d", conv, seq)), ClientMsgID: fmt.Sprintf("c-%d", id),
		ServerAt: serverAt,
	}
}

// batch builds conv's batch of n new messages after prev.
func batch(conv string, prev uint64, n int) persist.ConvBatch {
	b := persist.ConvBatch{ConvID: conv, PrevHead: prev}
	for i := 1; i <= n; i++ {
		b.Messages = append(b.Messages, msg(conv, prev+uint64(i)))
	}
	return b
}

func (x *suite) commit(bs ...persist.ConvBatch) error {
	return x.s.Commit(x.ctx, bs)
}

func (x *suite) mustCommit(bs ...persist.ConvBatch) {
	x.t.Helper()
	if err := x.commit(bs...); err != nil {
		x.t.Fatalf("commit: %v", err)
	}
}

func (x *suite) head(conv string) uint64 {
	x.t.Helper()
	h, err := x.s.LoadHead(x.ctx, conv)
	if err != nil {
		x.t.Fatalf("LoadHead(%q): %v", conv, err)
	}
	return h
}

func (x *suite) rangeOf(conv string, after uint64, limit int) []sequencer.Message {
	x.t.Helper()
	ms, err := x.s.ReadRange(x.ctx, conv, after, limit)
	if err != nil {
		x.t.Fatalf("ReadRange(%q, %d, %d): %v", conv, after, limit, err)
	}
	return ms
}

// expectStored checks conv holds exactly batches' messages and head.
func (x *suite) expectStored(conv string, head uint64, want []sequencer.Message) {
	x.t.Helper()
	if h := x.head(conv); h != head {
		x.t.Fatalf("head of %q = %d, want %d", conv, h, head)
	}
	got := x.rangeOf(conv, 0, 10000)
	if len(got) != len(want) {
		x.t.Fatalf("%q holds %d messages, want %d", conv, len(got), len(want))
	}
	for i := range want {
		sameMessage(x.t, got[i], want[i])
	}
	// ReadMany (PullMany, the feed's backlog) answers the same rows.
	page := x.readMany([]persist.Cursor{{ConvID: conv}}, 10000, 10000)[0]
	if page.Head != head || len(page.Messages) != len(want) {
		x.t.Fatalf("ReadMany of %q: head %d, %d messages; want %d, %d", conv, page.Head, len(page.Messages), head, len(want))
	}
	for i := range want {
		sameMessage(x.t, page.Messages[i], want[i])
	}
}

// commitFails commits bs, expects an error, and checks nothing of bs was
// written: heads unchanged, none of its rows stored.
func (x *suite) commitFails(bs ...persist.ConvBatch) error {
	x.t.Helper()
	heads := map[string]uint64{}
	for _, b := range bs {
		heads[b.ConvID] = x.head(b.ConvID)
	}
	err := x.commit(bs...)
	if err == nil {
		x.t.Fatalf("commit succeeded, want an error")
	}
	for _, b := range bs {
		if h := x.head(b.ConvID); h != heads[b.ConvID] {
			x.t.Fatalf("head of %q moved from %d to %d after a failed commit (%v)", b.ConvID, heads[b.ConvID], h, err)
		}
		for _, m := range b.Messages {
			got, gerr := x.s.GetMessage(x.ctx, m.MsgID)
			if gerr != nil && !errors.Is(gerr, sequencer.ErrNotFound) {
				x.t.Fatalf("GetMessage(%d): %v", m.MsgID, gerr)
			}
			if gerr == nil && got.ConvID == m.ConvID && got.Seq == m.Seq && got.ClientMsgID == m.ClientMsgID {
				x.t.Fatalf("row conv=%q seq=%d of a failed commit was stored (%v)", m.ConvID, m.Seq, err)
			}
		}
	}
	return err
}

// sameMessage compares a stored message with what was committed: server_at
// comes back in UTC with millisecond precision, a nil body as empty.
func sameMessage(t *testing.T, got, want sequencer.Message) {
	t.Helper()
	wantAt := want.ServerAt.UTC().Truncate(time.Millisecond)
	if got.MsgID != want.MsgID || got.ConvID != want.ConvID || got.Seq != want.Seq || got.FromUID != want.FromUID ||
		got.MsgType != want.MsgType || !bytes.Equal(got.Body, want.Body) || got.ClientMsgID != want.ClientMsgID ||
		!got.ServerAt.Equal(wantAt) || got.Kind != want.Kind || got.TargetMsgID != want.TargetMsgID ||
		got.Recalled != want.Recalled || got.EditCount != want.EditCount ||
		!got.EditedAt.Equal(want.EditedAt.UTC().Truncate(time.Millisecond)) {
		t.Fatalf("stored message differs:\n got %+v\nwant %+v (server_at %v)", got, want, wantAt)
	}
	if got.ServerAt.Location() != time.UTC {
		t.Fatalf("server_at %v is not in UTC", got.ServerAt)
	}
	if !got.EditedAt.IsZero() && got.EditedAt.Location() != time.UTC {
		t.Fatalf("edited_at %v is not in UTC", got.EditedAt)
	}
	if got.Body == nil {
		t.Fatalf("body is nil, want non-nil (possibly empty)")
	}
}

func conflictOf(t *testing.T, err error) *persist.ConflictError {
	t.Helper()
	ce, ok := persist.AsConflict(err)
	if !ok {
		t.Fatalf("want *persist.ConflictError, got %T: %v", err, err)
	}
	return ce
}

// hasConflict checks ce reports key for the row m.
func hasConflict(t *testing.T, ce *persist.ConflictError, key persist.ConflictKey, m sequencer.Message) {
	t.Helper()
	for _, c := range ce.Conflicts {
		if c.Key == key && c.ConvID == m.ConvID && c.Seq == m.Seq && c.MsgID == m.MsgID &&
			c.FromUID == m.FromUID && c.ClientMsgID == m.ClientMsgID {
			return
		}
	}
	t.Fatalf("conflict list %+v lacks %s for row conv=%q seq=%d msg_id=%d", ce.Conflicts, key, m.ConvID, m.Seq, m.MsgID)
}

func hooks(t *testing.T, s persist.Store) Hooks {
	t.Helper()
	h, ok := s.(Hooks)
	if !ok {
		t.Fatalf("store %T does not implement storetest.Hooks (declare them in its _test.go)", s)
	}
	return h
}

// Run runs the conformance suite. newStore returns a fresh, empty, migrated
// store for one subtest (and registers its cleanup).
func Run(t *testing.T, newStore func(t *testing.T) persist.Store) {
	cases := []struct {
		name string
		fn   func(x *suite)
	}{
		{"EmptyConversation", testEmpty},
		{"CommitThenRead", testCommitThenRead},
		{"MultiConversationAllOrNothing", testAllOrNothing},
		{"InvalidBatchWritesNothing", testInvalidBatch},
		{"ConflictConvSeqWithinBatch", testConflictConvSeqWithinBatch},
		{"ConflictConvSeqStored", testConflictConvSeqStored},
		{"ConflictClientKeyStored", testConflictClientKeyStored},
		{"ConflictClientKeyWithinBatch", testConflictClientKeyWithinBatch},
		{"ConflictMsgID", testConflictMsgID},
		{"HeadMismatch", testHeadMismatch},
		{"StaleFence", testStaleFence},
		{"HeadSurvivesTrim", testHeadSurvivesTrim},
		{"TrimBefore", testTrimBefore},
		{"ReadRange", testReadRange},
		{"RoundTrip", testRoundTrip},
		{"ConcurrentCommits", testConcurrentCommits},
		{"WorkerLeaseBasics", testWorkerLeaseBasics},
		{"WorkerLeasesExhaustedAndTakeover", testWorkerLeasesExhausted},
		{"WorkerLeasesConcurrentAcquire", testWorkerLeasesConcurrent},
		{"ReadPositionNeverBackwards", testReadPositionNeverBackwards},
		{"ReadPositionClampedToHead", testReadPositionClampedToHead},
		{"ReadPositionHeadZero", testReadPositionHeadZero},
		{"ReadPositionInvalid", testReadPositionInvalid},
		{"ReadPositionConcurrentMarks", testReadPositionConcurrent},
		{"ReadStatesOf1000", testReadStatesMany},
		{"ReadPositionRetention", testReadPositionsSurviveRetention},
	}
	cases = append(cases, pageCases...)
	cases = append(cases, outboxCases...)
	cases = append(cases, eventCases...)
	cases = append(cases, receiptCases...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := newSuite(t, newStore)
			c.fn(x)
		})
	}
}

func testEmpty(x *suite) {
	t := x.t
	c := x.conv()
	if h := x.head(c); h != 0 {
		t.Fatalf("head of an unknown conversation = %d, want 0", h)
	}
	if ms := x.rangeOf(c, 0, 100); len(ms) != 0 {
		t.Fatalf("ReadRange of an unknown conversation = %d messages", len(ms))
	}
	if _, err := x.s.GetMessage(x.ctx, 12345); !errors.Is(err, sequencer.ErrNotFound) {
		t.Fatalf("GetMessage(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := x.s.GetMessage(x.ctx, math.MaxUint64); !errors.Is(err, sequencer.ErrNotFound) {
		t.Fatalf("GetMessage(2^64-1) = %v, want ErrNotFound", err)
	}
	if _, err := x.s.FindByClientKey(x.ctx, sequencer.ClientKey{FromUID: 1, ClientMsgID: "nope"}); !errors.Is(err, sequencer.ErrNotFound) {
		t.Fatalf("FindByClientKey(unknown) = %v, want ErrNotFound", err)
	}
	if code := sequencer.ErrorCode(func() error { _, err := x.s.GetMessage(x.ctx, 1); return err }()); code != sequencer.CodeNotFound {
		t.Fatalf("GetMessage(unknown) code = %v, want not_found", code)
	}
	if err := x.commit(); err != nil {
		t.Fatalf("commit of nothing: %v", err)
	}
	if err := x.s.Ping(x.ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

func testCommitThenRead(x *suite) {
	t := x.t
	a, b := x.conv(), x.conv()
	ba, bb := batch(a, 0, 3), batch(b, 0, 1)
	x.mustCommit(ba, bb)
	x.expectStored(a, 3, ba.Messages)
	x.expectStored(b, 1, bb.Messages)
	ba2 := batch(a, 3, 2)
	x.mustCommit(ba2)
	x.expectStored(a, 5, append(append([]sequencer.Message{}, ba.Messages...), ba2.Messages...))
	for _, m := range append(ba.Messages, bb.Messages...) {
		got, err := x.s.GetMessage(x.ctx, m.MsgID)
		if err != nil {
			t.Fatalf("GetMessage(%d): %v", m.MsgID, err)
		}
		sameMessage(t, got, m)
		got, err = x.s.FindByClientKey(x.ctx, m.Key())
		if err != nil {
			t.Fatalf("FindByClientKey(%v): %v", m.Key(), err)
		}
		sameMessage(t, got, m)
	}
	// An empty batch checks the head and changes nothing.
	x.mustCommit(persist.ConvBatch{ConvID: a, PrevHead: 5})
	if err := x.commitFails(persist.ConvBatch{ConvID: a, PrevHead: 4}); !errors.Is(err, sequencer.ErrHeadMismatch) {
		t.Fatalf("empty batch with a wrong head: %v, want ErrHeadMismatch", err)
	}
	c := x.conv()
	x.mustCommit(persist.ConvBatch{ConvID: c})
	x.expectStored(c, 0, nil)
	x.mustCommit(batch(c, 0, 1))
}

func testAllOrNothing(x *suite) {
	t := x.t
	good, bad := x.conv(), x.conv()
	x.mustCommit(batch(bad, 0, 2))
	// bad's PrevHead is wrong: nothing of good may land.
	bg, bb := batch(good, 0, 3), batch(bad, 1, 1)
	err := x.commitFails(bg, bb)
	var hm *persist.HeadMismatchError
	if !errors.As(err, &hm) || !errors.Is(err, sequencer.ErrHeadMismatch) {
		t.Fatalf("want *HeadMismatchError, got %T: %v", err, err)
	}
	if len(hm.ConvIDs) != 1 || hm.ConvIDs[0] != bad {
		t.Fatalf("mismatch names %v, want [%s]", hm.ConvIDs, bad)
	}
	x.expectStored(good, 0, nil)
	if h := x.head(bad); h != 2 {
		t.Fatalf("head of %q = %d, want 2", bad, h)
	}
	// A conflicting row in one conversation: nothing of the other lands.
	dup := msg(bad, 3)
	stored := x.rangeOf(bad, 0, 1)[0]
	dup.FromUID, dup.ClientMsgID = stored.FromUID, stored.ClientMsgID
	bb = persist.ConvBatch{ConvID: bad, PrevHead: 2, Messages: []sequencer.Message{dup}}
	err = x.commitFails(bg, bb)
	hasConflict(t, conflictOf(t, err), persist.KeyClientMsgID, dup)
	// The same batch without the bad part lands.
	x.mustCommit(bg)
	x.expectStored(good, 3, bg.Messages)
}

func testInvalidBatch(x *suite) {
	t := x.t
	a := x.conv()
	cases := map[string]persist.ConvBatch{}
	b := batch(a, 0, 2)
	b.Messages[1].Seq = 3 // gap
	cases["seq outside the batch"] = b
	b = batch(a, 0, 1)
	b.Messages[0].ConvID = "other"
	cases["message of another conversation"] = b
	b = batch(a, 0, 1)
	b.Messages[0].ClientMsgID = ""
	cases["empty client_msg_id"] = b
	b = batch(a, 0, 1)
	b.Messages[0].MsgID = 1 << 63
	cases["msg_id at 2^63"] = b
	for name, b := range cases {
		err := x.commitFails(b)
		if err == nil {
			t.Fatalf("%s: commit succeeded", name)
		}
		if _, ok := persist.AsConflict(err); ok {
			t.Fatalf("%s: got a ConflictError, want an invalid-batch error: %v", name, err)
		}
	}
	if err := x.commitFails(batch(a, 0, 1), batch(a, 1, 1)); err == nil {
		t.Fatalf("a conversation twice in one commit was accepted")
	}
	x.expectStored(a, 0, nil)
}

func testConflictConvSeqWithinBatch(x *suite) {
	t := x.t
	a, other := x.conv(), x.conv()
	b := batch(a, 0, 3)
	b.Messages[2].Seq = 2 // seqs 1, 2, 2: in range, one taken twice
	bo := batch(other, 0, 1)
	ce := conflictOf(t, x.commitFails(bo, b))
	hasConflict(t, ce, persist.KeyConvSeq, b.Messages[2])
	if len(ce.Conflicts) != 1 {
		t.Fatalf("conflicts %+v, want only the later row", ce.Conflicts)
	}
}

func testConflictConvSeqStored(x *suite) {
	t := x.t
	h := hooks(t, x.s)
	a := x.conv()
	first := batch(a, 0, 3)
	x.mustCommit(first)
	// The head is behind the rows (as imported data might be): rows 2..3
	// collide with stored seqs.
	if err := h.SetHeadForTest(x.ctx, a, 1); err != nil {
		t.Fatal(err)
	}
	b := batch(a, 1, 3)
	ce := conflictOf(t, x.commitFails(b))
	hasConflict(t, ce, persist.KeyConvSeq, b.Messages[0])
	hasConflict(t, ce, persist.KeyConvSeq, b.Messages[1])
	for _, c := range ce.Conflicts {
		if c.Seq == 4 {
			t.Fatalf("seq 4 reported as conflicting: %+v", c)
		}
	}
	x.expectStored(a, 1, first.Messages)
}

func testConflictClientKeyStored(x *suite) {
	t := x.t
	a, b := x.conv(), x.conv()
	ba := batch(a, 0, 2)
	x.mustCommit(ba)
	// A resend of a's second message into b, and into a itself at a new seq.
	bb := batch(b, 0, 2)
	bb.Messages[1].FromUID, bb.Messages[1].ClientMsgID = ba.Messages[1].FromUID, ba.Messages[1].ClientMsgID
	if persist.KeysPerConversation(x.s) {
		// Keys unique per conversation (Citus, docs/API.md "Distributed
		// mode"): in b it is a new message of b, and each conversation
		// finds its own.
		x.mustCommit(bb)
		x.expectStored(b, 2, bb.Messages)
		sc := x.s.(persist.ConvScopedKeys)
		for conv, want := range map[string]sequencer.Message{a: ba.Messages[1], b: bb.Messages[1]} {
			got, err := sc.FindByClientKeyIn(x.ctx, conv, want.Key())
			if err != nil {
				t.Fatalf("FindByClientKeyIn(%s): %v", conv, err)
			}
			sameMessage(t, got, want)
		}
		if _, err := sc.FindByClientKeyIn(x.ctx, x.conv(), want1(ba)); !errors.Is(err, sequencer.ErrNotFound) {
			t.Fatalf("FindByClientKeyIn in a conversation without it: %v, want ErrNotFound", err)
		}
		b = x.conv()
	} else {
		ce := conflictOf(t, x.commitFails(bb))
		hasConflict(t, ce, persist.KeyClientMsgID, bb.Messages[1])
		if len(ce.Conflicts) != 1 {
			t.Fatalf("conflicts %+v, want one", ce.Conflicts)
		}
	}
	ba2 := batch(a, 2, 1)
	ba2.Messages[0].FromUID, ba2.Messages[0].ClientMsgID = ba.Messages[0].FromUID, ba.Messages[0].ClientMsgID
	hasConflict(t, conflictOf(t, x.commitFails(ba2)), persist.KeyClientMsgID, ba2.Messages[0])
	x.expectStored(a, 2, ba.Messages)
	// The same client id from another sender is no conflict.
	ok := batch(b, 0, 1)
	ok.Messages[0].FromUID, ok.Messages[0].ClientMsgID = ba.Messages[0].FromUID+1, ba.Messages[0].ClientMsgID
	x.mustCommit(ok)
}

func testConflictClientKeyWithinBatch(x *suite) {
	t := x.t
	a, b := x.conv(), x.conv()
	ba, bb := batch(a, 0, 2), batch(b, 0, 2)
	bb.Messages[0].FromUID, bb.Messages[0].ClientMsgID = ba.Messages[1].FromUID, ba.Messages[1].ClientMsgID
	if persist.KeysPerConversation(x.s) {
		// Keys unique per conversation: two conversations may hold one.
		x.mustCommit(ba, bb)
		x.expectStored(b, 2, bb.Messages)
		a = x.conv()
	} else {
		ce := conflictOf(t, x.commitFails(ba, bb))
		hasConflict(t, ce, persist.KeyClientMsgID, bb.Messages[0])
		if len(ce.Conflicts) != 1 {
			t.Fatalf("conflicts %+v, want only the later row", ce.Conflicts)
		}
	}
	// Within one conversation too.
	bc := batch(a, 0, 2)
	bc.Messages[1].FromUID, bc.Messages[1].ClientMsgID = bc.Messages[0].FromUID, bc.Messages[0].ClientMsgID
	hasConflict(t, conflictOf(t, x.commitFails(bc)), persist.KeyClientMsgID, bc.Messages[1])
}

// want1 is the resend key of b's second message.
func want1(b persist.ConvBatch) sequencer.ClientKey { return b.Messages[1].Key() }

func testConflictMsgID(x *suite) {
	t := x.t
	a, b := x.conv(), x.conv()
	ba := batch(a, 0, 1)
	x.mustCommit(ba)
	bb := batch(b, 0, 2)
	bb.Messages[1].MsgID = ba.Messages[0].MsgID
	if persist.KeysPerConversation(x.s) {
		// Citus: the key is (conv_id, msg_id); msg_ids are unique by the
		// leased worker ids, and a copy in another conversation is not
		// seen (docs/API.md "Distributed mode"). Within one conversation
		// it is a conflict.
		x.mustCommit(bb)
		bd := batch(b, 2, 1)
		bd.Messages[0].MsgID = bb.Messages[0].MsgID
		hasConflict(t, conflictOf(t, x.commitFails(bd)), persist.KeyMsgID, bd.Messages[0])
		x.expectStored(b, 2, bb.Messages)
		b = x.conv()
	} else {
		ce := conflictOf(t, x.commitFails(bb))
		hasConflict(t, ce, persist.KeyMsgID, bb.Messages[1])
		x.expectStored(b, 0, nil)
	}
	// Two rows of one batch with one msg_id.
	bc := batch(b, 0, 2)
	bc.Messages[1].MsgID = bc.Messages[0].MsgID
	ce := conflictOf(t, x.commitFails(bc))
	hasConflict(t, ce, persist.KeyMsgID, bc.Messages[1])
	x.expectStored(b, 0, nil)
}

func testHeadMismatch(x *suite) {
	t := x.t
	a, b := x.conv(), x.conv()
	x.mustCommit(batch(a, 0, 3))
	for _, prev := range []uint64{0, 2, 4} {
		bad := batch(a, prev, 1)
		err := x.commitFails(bad)
		var hm *persist.HeadMismatchError
		if !errors.As(err, &hm) || len(hm.ConvIDs) != 1 || hm.ConvIDs[0] != a {
			t.Fatalf("PrevHead %d over head 3: got %v, want HeadMismatchError naming %s", prev, err, a)
		}
		if sequencer.ErrorCode(err) != sequencer.CodeUnavailable {
			t.Fatalf("head mismatch code = %v", sequencer.ErrorCode(err))
		}
	}
	// A new conversation must start at 0.
	bad := batch(b, 5, 1)
	err := x.commitFails(bad, batch(a, 3, 1))
	var hm *persist.HeadMismatchError
	if !errors.As(err, &hm) || len(hm.ConvIDs) != 1 || hm.ConvIDs[0] != b {
		t.Fatalf("PrevHead 5 on a new conversation: got %v", err)
	}
	x.expectStored(b, 0, nil)
	if h := x.head(a); h != 3 {
		t.Fatalf("head of %q = %d, want 3", a, h)
	}
}

func testStaleFence(x *suite) {
	t := x.t
	h := hooks(t, x.s)
	if err := h.PutPartitionLeaseForTest(x.ctx, persist.Fence{Partition: 3, Owner: "node-a", Epoch: 5}); err != nil {
		t.Fatal(err)
	}
	if err := h.PutPartitionLeaseForTest(x.ctx, persist.Fence{Partition: 7, Owner: "node-b", Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	a, b := x.conv(), x.conv()
	fenced := func(conv string, prev uint64, f persist.Fence) persist.ConvBatch {
		bt := batch(conv, prev, 1)
		bt.Fence = f
		return bt
	}
	x.mustCommit(fenced(a, 0, persist.Fence{Partition: 3, Owner: "node-a", Epoch: 5}),
		fenced(b, 0, persist.Fence{Partition: 7, Owner: "node-b", Epoch: 1}))
	for _, f := range []persist.Fence{
		{Partition: 3, Owner: "node-a", Epoch: 4}, // older epoch
		{Partition: 3, Owner: "node-a", Epoch: 6}, // epoch not reached
		{Partition: 3, Owner: "node-b", Epoch: 5}, // other owner
		{Partition: 9, Owner: "node-a", Epoch: 1}, // no lease row
		{Partition: 7, Owner: "node-a", Epoch: 1}, // partition of another node
	} {
		good := fenced(a, 1, persist.Fence{Partition: 3, Owner: "node-a", Epoch: 5})
		stale := fenced(b, 1, f)
		err := x.commitFails(good, stale)
		var sf *persist.StaleFenceError
		if !errors.As(err, &sf) || !errors.Is(err, sequencer.ErrStaleEpoch) {
			t.Fatalf("fence %+v: got %T %v, want *StaleFenceError", f, err, err)
		}
		if len(sf.Fences) != 1 || sf.Fences[0] != f {
			t.Fatalf("fence %+v: error names %+v", f, sf.Fences)
		}
	}
	// The epoch moves on: the old fence is stale, the new one works.
	if err := h.PutPartitionLeaseForTest(x.ctx, persist.Fence{Partition: 3, Owner: "node-b", Epoch: 6}); err != nil {
		t.Fatal(err)
	}
	old := fenced(a, 1, persist.Fence{Partition: 3, Owner: "node-a", Epoch: 5})
	if err := x.commitFails(old); !errors.Is(err, sequencer.ErrStaleEpoch) {
		t.Fatalf("commit with the old epoch: %v", err)
	}
	x.mustCommit(fenced(a, 1, persist.Fence{Partition: 3, Owner: "node-b", Epoch: 6}))
	// An unfenced commit (a node without a cluster) is refused while a
	// cluster holds partitions in this store, alone or with fenced batches.
	if err := x.commitFails(batch(a, 2, 1)); !errors.Is(err, persist.ErrUnfenced) || !errors.Is(err, sequencer.ErrStaleEpoch) {
		t.Fatalf("unfenced commit in a cluster store: %v, want ErrUnfenced", err)
	}
	if err := x.commitFails(fenced(a, 2, persist.Fence{Partition: 3, Owner: "node-b", Epoch: 6}), batch(b, 1, 1)); !errors.Is(err, persist.ErrUnfenced) {
		t.Fatalf("unfenced batch beside a fenced one: %v, want ErrUnfenced", err)
	}
	if hd := x.head(a); hd != 2 {
		t.Fatalf("head = %d, want 2", hd)
	}
	// Once every partition is released, unfenced commits work again.
	for _, p := range []uint32{3, 7} {
		if err := h.PutPartitionLeaseForTest(x.ctx, persist.Fence{Partition: p, Owner: "", Epoch: 9}); err != nil {
			t.Fatal(err)
		}
	}
	x.mustCommit(batch(a, 2, 1))
	if hd := x.head(a); hd != 3 {
		t.Fatalf("head = %d, want 3", hd)
	}
}

func testHeadSurvivesTrim(x *suite) {
	t := x.t
	a := x.conv()
	b1 := batch(a, 0, 5)
	x.mustCommit(b1)
	if err := x.s.Trim(x.ctx, a, 3); err != nil {
		t.Fatal(err)
	}
	x.expectStored(a, 5, b1.Messages[3:])
	if _, err := x.s.GetMessage(x.ctx, b1.Messages[0].MsgID); !errors.Is(err, sequencer.ErrNotFound) {
		t.Fatalf("trimmed message still readable: %v", err)
	}
	if err := x.s.Trim(x.ctx, a, math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	x.expectStored(a, 5, nil)
	// The conversation continues at 6, never restarts at 1.
	if err := x.commitFails(batch(a, 0, 1)); !errors.Is(err, sequencer.ErrHeadMismatch) {
		t.Fatalf("commit at seq 1 after trim: %v, want ErrHeadMismatch", err)
	}
	b2 := batch(a, 5, 2)
	x.mustCommit(b2)
	x.expectStored(a, 7, b2.Messages)
	if err := x.s.Trim(x.ctx, x.conv(), 10); err != nil {
		t.Fatalf("trim of an unknown conversation: %v", err)
	}
}

// at returns conv's batch after prev with one message per server_at time.
func at(conv string, prev uint64, times ...time.Time) persist.ConvBatch {
	b := batch(conv, prev, len(times))
	for i, t := range times {
		b.Messages[i].ServerAt = t
	}
	return b
}

// trimPass runs TrimBefore steps of limit conversations to the end of a pass.
func (x *suite) trimPass(before time.Time, limit int) int {
	x.t.Helper()
	total, after := 0, ""
	for steps := 0; ; steps++ {
		if steps > 1000 {
			x.t.Fatal("TrimBefore pass does not end")
		}
		next, n, err := x.s.TrimBefore(x.ctx, before, after, limit)
		if err != nil {
			x.t.Fatalf("TrimBefore(%v, %q, %d): %v", before, after, limit, err)
		}
		total += n
		if next == "" {
			return total
		}
		if next <= after && after != "" {
			x.t.Fatalf("TrimBefore cursor went from %q to %q", after, next)
		}
		after = next
	}
}

func testTrimBefore(x *suite) {
	t := x.t
	t0 := serverAt.Truncate(time.Second)
	min := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	cut := t0.Add(150 * time.Second) // between minute 2 and 3
	mixed, allOld, notPrefix, allNew, atCut := x.conv(), x.conv(), x.conv(), x.conv(), x.conv()
	bMixed := at(mixed, 0, min(0), min(1), min(2), min(3), min(4))
	bOld := at(allOld, 0, min(-60), min(-59), min(-58))
	// An older server_at behind a newer one (clocks of two owners): only a
	// prefix is ever deleted, so seq 2 stays.
	bNotPrefix := at(notPrefix, 0, min(60), min(0), min(61))
	bNew := at(allNew, 0, min(10), min(11))
	bAtCut := at(atCut, 0, min(0), cut, min(0))
	x.mustCommit(bMixed, bOld, bNotPrefix, bNew, bAtCut)

	if n := x.trimPass(cut, 2); n != 3+3+1 {
		t.Fatalf("trim pass deleted %d rows, want 7", n)
	}
	x.expectStored(mixed, 5, bMixed.Messages[3:])
	x.expectStored(allOld, 3, nil)
	x.expectStored(notPrefix, 3, bNotPrefix.Messages)
	x.expectStored(allNew, 2, bNew.Messages)
	x.expectStored(atCut, 3, bAtCut.Messages[1:])
	if _, err := x.s.GetMessage(x.ctx, bMixed.Messages[0].MsgID); !errors.Is(err, sequencer.ErrNotFound) {
		t.Fatalf("trimmed message still readable: %v", err)
	}
	// A second pass finds nothing; a pass in one step does the same.
	if n := x.trimPass(cut, 1000); n != 0 {
		t.Fatalf("second pass deleted %d rows", n)
	}
	// Sends continue at head+1; seq 1 is refused even where no row is left.
	if err := x.commitFails(batch(allOld, 0, 1)); !errors.Is(err, sequencer.ErrHeadMismatch) {
		t.Fatalf("commit at seq 1 after trim: %v, want ErrHeadMismatch", err)
	}
	next := at(allOld, 3, min(100))
	next2 := at(mixed, 5, min(100))
	x.mustCommit(next, next2)
	x.expectStored(allOld, 4, next.Messages)
	x.expectStored(mixed, 6, append(bMixed.Messages[3:len(bMixed.Messages):len(bMixed.Messages)], next2.Messages...))
	// Everything older than the newest row: every conversation keeps only
	// its rows at or after the cut.
	if n := x.trimPass(min(100), 3); n != 2+3+2+2 {
		t.Fatalf("trim pass at minute 100 deleted %d rows, want 9", n)
	}
	x.expectStored(mixed, 6, next2.Messages)
	x.expectStored(allOld, 4, next.Messages)
	x.expectStored(notPrefix, 3, nil)
	x.expectStored(atCut, 3, nil)
	if _, _, err := x.s.TrimBefore(x.ctx, cut, "", 0); err == nil {
		t.Fatal("TrimBefore with limit 0 did not fail")
	}
}

func testReadRange(x *suite) {
	t := x.t
	a, b := x.conv(), x.conv()
	// Commit in several batches interleaved with another conversation.
	var all []sequencer.Message
	for prev := uint64(0); prev < 10; prev += 5 {
		ba := batch(a, prev, 5)
		all = append(all, ba.Messages...)
		x.mustCommit(batch(b, prev, 5), ba)
	}
	check := func(after uint64, limit int, from, to int) {
		t.Helper()
		got := x.rangeOf(a, after, limit)
		want := all[from:to]
		if len(got) != len(want) {
			t.Fatalf("ReadRange(after %d, limit %d): %d messages, want %d", after, limit, len(got), len(want))
		}
		for i := range want {
			sameMessage(t, got[i], want[i])
		}
	}
	check(0, 3, 0, 3)
	check(3, 100, 3, 10)
	check(9, 100, 9, 10)
	check(10, 100, 10, 10)
	check(1000, 100, 10, 10)
	check(math.MaxUint64, 100, 10, 10)
	check(0, 0, 0, 0)
	check(0, 10, 0, 10)
	check(4, 1, 4, 5)
}

func testRoundTrip(x *suite) {
	t := x.t
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	big := bytes.Repeat([]byte{0, 0xff, 'x'}, sequencer.DefaultMaxBody/3)
	convID := strings.Repeat("é", 32) // 64 bytes, 32 characters
	if len(convID) != sequencer.MaxConvIDLen {
		t.Fatalf("conv id is %d bytes", len(convID))
	}
	asciiConv := strings.Repeat("c", 64)
	b := batch(convID, 0, 5)
	b.Messages[0].Body = every
	b.Messages[1].Body = nil
	b.Messages[2].Body = []byte{}
	b.Messages[3].Body = big
	b.Messages[0].ClientMsgID = strings.Repeat("ü", 32)
	b.Messages[1].ClientMsgID = "日本語" + strings.Repeat("k", 55) // 9+55 = 64 bytes
	b.Messages[2].ClientMsgID = strings.Repeat("k", 64)
	b.Messages[3].MsgType = math.MaxInt16
	b.Messages[4].MsgID = math.MaxInt64
	b.Messages[4].FromUID = math.MaxInt64
	b.Messages[4].ServerAt = time.Date(2026, 1, 2, 3, 4, 5, 999_999_999, time.UTC)
	b2 := batch(asciiConv, 0, 1)
	x.mustCommit(b, b2)
	x.expectStored(convID, 5, b.Messages)
	x.expectStored(asciiConv, 1, b2.Messages)
	for _, m := range b.Messages {
		got, err := x.s.FindByClientKey(x.ctx, m.Key())
		if err != nil {
			t.Fatalf("FindByClientKey(%q): %v", m.ClientMsgID, err)
		}
		sameMessage(t, got, m)
	}
	got, err := x.s.GetMessage(x.ctx, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	sameMessage(t, got, b.Messages[4])
	if !got.ServerAt.Equal(time.Date(2026, 1, 2, 3, 4, 5, 999_000_000, time.UTC)) {
		t.Fatalf("server_at %v: want truncation to .999", got.ServerAt)
	}
}

func testConcurrentCommits(x *suite) {
	t := x.t
	const writers, rounds, per = 6, 8, 5
	convs := make([]string, writers)
	for i := range convs {
		convs[i] = x.conv()
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				// Each writer commits its own conversation plus one shared
				// by nobody else in this round: all distinct per commit.
				bs := []persist.ConvBatch{batch(convs[w], uint64(r*per), per)}
				if err := x.s.Commit(x.ctx, bs); err != nil {
					errs <- fmt.Errorf("writer %d round %d: %w", w, r, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, c := range convs {
		if h := x.head(c); h != rounds*per {
			t.Fatalf("head of %q = %d, want %d", c, h, rounds*per)
		}
		ms := x.rangeOf(c, 0, 1000)
		if len(ms) != rounds*per {
			t.Fatalf("%q holds %d messages", c, len(ms))
		}
		for i, m := range ms {
			if m.Seq != uint64(i+1) || m.ConvID != c {
				t.Fatalf("%q message %d has seq %d conv %q", c, i, m.Seq, m.ConvID)
			}
		}
	}
}

func testWorkerLeaseBasics(x *suite) {
	t := x.t
	ttl := 10 * time.Second
	a, err := x.s.AcquireWorker(x.ctx, "node-a", base, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if a.WorkerID < 0 || a.WorkerID > 1023 || a.Holder != "node-a" || a.LastMs != 0 {
		t.Fatalf("first lease %+v", a)
	}
	if !a.Expires.Equal(base.Add(ttl)) {
		t.Fatalf("lease expires %v, want %v", a.Expires, base.Add(ttl))
	}
	b, err := x.s.AcquireWorker(x.ctx, "node-b", base, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if b.WorkerID == a.WorkerID {
		t.Fatalf("two live holders got worker id %d", a.WorkerID)
	}
	// Renew keeps, raises and never lowers LastMs.
	a, err = x.s.RenewWorker(x.ctx, a, 5000, base.Add(5*time.Second), ttl)
	if err != nil {
		t.Fatal(err)
	}
	if a.LastMs != 5000 || !a.Expires.Equal(base.Add(15*time.Second)) {
		t.Fatalf("renewed lease %+v", a)
	}
	a, err = x.s.RenewWorker(x.ctx, a, 3000, base.Add(6*time.Second), ttl)
	if err != nil {
		t.Fatal(err)
	}
	if a.LastMs != 5000 {
		t.Fatalf("renew with a lower last_ms lowered it to %d", a.LastMs)
	}
	// A renew after the lease expired fails.
	if _, err := x.s.RenewWorker(x.ctx, b, 1, base.Add(11*time.Second), ttl); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("renew of an expired lease: %v, want ErrWorkerLeaseLost", err)
	}
	// A renew with a wrong token fails.
	forged := a
	forged.Token++
	if _, err := x.s.RenewWorker(x.ctx, forged, 1, base.Add(7*time.Second), ttl); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("renew with a forged token: %v", err)
	}
	// Release, then the id is free; acquirers prefer ids with a lower
	// last_ms, so the next one (never used: last_ms 0) is another id.
	if err := x.s.ReleaseWorker(x.ctx, a, 6000); err != nil {
		t.Fatal(err)
	}
	if _, err := x.s.RenewWorker(x.ctx, a, 1, base.Add(7*time.Second), ttl); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("renew after release: %v", err)
	}
	c, err := x.s.AcquireWorker(x.ctx, "node-c", base.Add(7*time.Second), ttl)
	if err != nil {
		t.Fatal(err)
	}
	if c.WorkerID == a.WorkerID {
		t.Fatalf("acquire took id %d (last_ms 6000) over never-used ids", c.WorkerID)
	}
	if c.LastMs != 0 {
		t.Fatalf("never used id %d has LastMs %d", c.WorkerID, c.LastMs)
	}
	// Releasing twice is harmless.
	if err := x.s.ReleaseWorker(x.ctx, a, 6000); err != nil {
		t.Fatal(err)
	}
}

// testWorkerLeasesExhausted leases all 1024 ids, then checks that no live id
// is handed out, that a released or expired id is, with the highest last_ms
// any earlier holder recorded, and that the previous holder loses it.
func testWorkerLeasesExhausted(x *suite) {
	t := x.t
	const short = 10 // the last ten leases are short, the rest long
	leases := make([]persist.WorkerLease, 1024)
	seen := map[int]bool{}
	shortIDs := map[int]persist.WorkerLease{}
	for i := range leases {
		ttl := 10 * time.Minute
		if i >= len(leases)-short {
			ttl = time.Minute
		}
		l, err := x.s.AcquireWorker(x.ctx, fmt.Sprintf("h%d", i), base, ttl)
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		if seen[l.WorkerID] || l.WorkerID < 0 || l.WorkerID > 1023 {
			t.Fatalf("acquire %d: worker id %d given twice or out of range", i, l.WorkerID)
		}
		seen[l.WorkerID] = true
		leases[i] = l
		if ttl == time.Minute {
			shortIDs[l.WorkerID] = l
		}
	}
	if _, err := x.s.AcquireWorker(x.ctx, "late", base.Add(time.Second), time.Minute); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("acquire with every id live: %v, want ErrWorkerLeaseLost", err)
	}
	// Released id 5 goes to the next acquirer, with its last_ms.
	h5 := leases[5]
	h5r, err := x.s.RenewWorker(x.ctx, h5, 9000, base.Add(time.Second), 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.s.ReleaseWorker(x.ctx, h5r, 8000); err != nil {
		t.Fatal(err)
	}
	late, err := x.s.AcquireWorker(x.ctx, "late", base.Add(2*time.Second), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// A clean release gives the unused reservation back: LastMs is what the
	// holder says it issued (8000), not its reservation (9000).
	if late.WorkerID != h5.WorkerID || late.LastMs != 8000 || late.Token == h5.Token {
		t.Fatalf("after release of %+v at 8000 got %+v, want its id with LastMs 8000 and a new token", h5r, late)
	}
	// The old holder's renew and release no longer touch the new lease.
	if _, err := x.s.RenewWorker(x.ctx, h5r, 9500, base.Add(3*time.Second), time.Minute); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("renew by the previous holder: %v, want ErrWorkerLeaseLost", err)
	}
	if err := x.s.ReleaseWorker(x.ctx, h5r, 9500); err != nil {
		t.Fatal(err)
	}
	if _, err := x.s.AcquireWorker(x.ctx, "later", base.Add(3*time.Second), time.Minute); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("a stale release freed a live lease: %v", err)
	}
	// Renewing keeps a lease that would have expired live.
	if late, err = x.s.RenewWorker(x.ctx, late, 9100, base.Add(4*time.Second), 10*time.Minute); err != nil {
		t.Fatalf("the new holder's renew: %v", err)
	}
	if late.LastMs != 9500 {
		// The stale release raised last_ms to 9500: never lowered since.
		t.Fatalf("late's LastMs = %d, want 9500", late.LastMs)
	}
	// At base+2m exactly the short leases have expired: they, and only
	// they, can be taken over, and their previous holders lose them.
	now := base.Add(2 * time.Minute)
	taken := map[int]persist.WorkerLease{}
	for i := 0; i < short; i++ {
		l, err := x.s.AcquireWorker(x.ctx, fmt.Sprintf("t%d", i), now, time.Minute)
		if err != nil {
			t.Fatalf("takeover %d: %v", i, err)
		}
		if _, ok := shortIDs[l.WorkerID]; !ok || taken[l.WorkerID].Holder != "" {
			t.Fatalf("takeover %d got live or repeated id %d", i, l.WorkerID)
		}
		if l.LastMs != 0 {
			t.Fatalf("takeover %d of id %d: LastMs %d, want 0", i, l.WorkerID, l.LastMs)
		}
		taken[l.WorkerID] = l
	}
	if _, err := x.s.AcquireWorker(x.ctx, "one-too-many", now, time.Minute); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
		t.Fatalf("acquire with every id live again: %v", err)
	}
	for id, old := range shortIDs {
		if _, err := x.s.RenewWorker(x.ctx, old, 1, now, time.Minute); !errors.Is(err, sequencer.ErrWorkerLeaseLost) {
			t.Fatalf("renew after takeover of id %d: %v", id, err)
		}
		if _, err := x.s.RenewWorker(x.ctx, taken[id], 1, now.Add(time.Second), time.Minute); err != nil {
			t.Fatalf("the new holder's renew of id %d: %v", id, err)
		}
		break
	}
}

func testWorkerLeasesConcurrent(x *suite) {
	t := x.t
	const goroutines, each = 6, 12
	var mu sync.Mutex
	got := map[int]string{}
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				holder := fmt.Sprintf("g%d-%d", g, i)
				l, err := x.s.AcquireWorker(x.ctx, holder, base, time.Minute)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if prev, dup := got[l.WorkerID]; dup {
					mu.Unlock()
					errs <- fmt.Errorf("worker id %d leased to both %s and %s", l.WorkerID, prev, holder)
					return
				}
				got[l.WorkerID] = holder
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(got) != goroutines*each {
		t.Fatalf("%d distinct ids for %d acquires", len(got), goroutines*each)
	}
	ids := make([]int, 0, len(got))
	for id := range got {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	if ids[0] < 0 || ids[len(ids)-1] > 1023 {
		t.Fatalf("ids out of range: %v", ids)
	}
}

// positions returns the store's persist.ReadPositions: every store has them.
func (x *suite) positions() persist.ReadPositions {
	x.t.Helper()
	rp, ok := x.s.(persist.ReadPositions)
	if !ok {
		x.t.Fatalf("store %T does not implement persist.ReadPositions", x.s)
	}
	return rp
}

// mark marks uid's position in conv at seq and checks the answer.
func (x *suite) mark(conv string, uid, seq, wantRead, wantHead uint64) {
	x.t.Helper()
	got, err := x.positions().MarkRead(x.ctx, conv, uid, seq)
	if err != nil {
		x.t.Fatalf("MarkRead(%q, %d, %d): %v", conv, uid, seq, err)
	}
	want := persist.ReadState{ConvID: conv, ReadSeq: wantRead, Head: wantHead}
	if got != want {
		x.t.Fatalf("MarkRead(%q, %d, %d) = %+v, want %+v", conv, uid, seq, got, want)
	}
}

// states reads uid's states of convs.
func (x *suite) states(uid uint64, convs ...string) []persist.ReadState {
	x.t.Helper()
	got, err := x.positions().ReadStates(x.ctx, uid, convs)
	if err != nil {
		x.t.Fatalf("ReadStates(%d, %d convs): %v", uid, len(convs), err)
	}
	if len(got) != len(convs) {
		x.t.Fatalf("ReadStates(%d, %d convs) answered %d states", uid, len(convs), len(got))
	}
	return got
}

// expectState checks uid's stored state of conv.
func (x *suite) expectState(conv string, uid, read, head uint64) {
	x.t.Helper()
	got := x.states(uid, conv)[0]
	if want := (persist.ReadState{ConvID: conv, ReadSeq: read, Head: head}); got != want {
		x.t.Fatalf("state of uid %d in %q = %+v, want %+v", uid, conv, got, want)
	}
}

func testReadPositionNeverBackwards(x *suite) {
	t := x.t
	c := x.conv()
	x.mustCommit(batch(c, 0, 5))
	x.expectState(c, 42, 0, 5)
	x.mark(c, 42, 3, 3, 5)
	x.mark(c, 42, 2, 3, 5) // lower: unchanged
	x.mark(c, 42, 0, 3, 5) // zero: unchanged
	x.mark(c, 42, 3, 3, 5) // same: unchanged
	x.mark(c, 43, 1, 1, 5) // another user: their own position
	x.expectState(c, 42, 3, 5)
	x.expectState(c, 43, 1, 5)
	if u := x.states(42, c)[0].Unread(); u != 2 {
		t.Fatalf("unread = %d, want 2", u)
	}
	x.mustCommit(batch(c, 5, 3))
	x.expectState(c, 42, 3, 8)
	x.mark(c, 42, 8, 8, 8)
	if u := x.states(42, c)[0].Unread(); u != 0 {
		t.Fatalf("unread after marking the head = %d, want 0", u)
	}
}

func testReadPositionClampedToHead(x *suite) {
	c := x.conv()
	x.mustCommit(batch(c, 0, 4))
	x.mark(c, 7, 9, 4, 4)
	x.mark(c, 8, sequencer.MaxID-1, 4, 4) // the largest valid seq
	x.expectState(c, 7, 4, 4)
	// The clamp used the head of that moment: a later message is unread.
	x.mustCommit(batch(c, 4, 2))
	x.expectState(c, 7, 4, 6)
	x.mark(c, 7, 100, 6, 6)
}

func testReadPositionHeadZero(x *suite) {
	c := x.conv()
	x.mark(c, 9, 5, 0, 0) // nothing to read: nothing stored
	x.expectState(c, 9, 0, 0)
	x.mustCommit(batch(c, 0, 3))
	x.expectState(c, 9, 0, 3) // the early mark did not pre-read seqs 1..3
	x.mark(c, 9, 2, 2, 3)
}

func testReadPositionInvalid(x *suite) {
	t := x.t
	c := x.conv()
	x.mustCommit(batch(c, 0, 3))
	rp := x.positions()
	invalid := func(what string, err error) {
		t.Helper()
		if err == nil || sequencer.ErrorCode(err) != sequencer.CodeInvalidArgument {
			t.Fatalf("%s: got %v, want invalid_argument", what, err)
		}
	}
	for _, tc := range []struct {
		name     string
		conv     string
		uid, seq uint64
	}{
		{"uid 0", c, 0, 1},
		{"uid 2^63", c, sequencer.MaxID, 1},
		{"uid max", c, math.MaxUint64, 1},
		{"seq 2^63", c, 5, sequencer.MaxID},
		{"empty conv", "", 5, 1},
		{"long conv", strings.Repeat("x", 65), 5, 1},
		{"control conv", "g:\x01", 5, 1},
		{"bad utf-8 conv", "g:\xff", 5, 1},
	} {
		_, err := rp.MarkRead(x.ctx, tc.conv, tc.uid, tc.seq)
		invalid("MarkRead "+tc.name, err)
	}
	_, err := rp.ReadStates(x.ctx, 5, nil)
	invalid("ReadStates of no conversations", err)
	_, err = rp.ReadStates(x.ctx, 0, []string{c})
	invalid("ReadStates uid 0", err)
	_, err = rp.ReadStates(x.ctx, sequencer.MaxID, []string{c})
	invalid("ReadStates uid 2^63", err)
	_, err = rp.ReadStates(x.ctx, 5, []string{c, ""})
	invalid("ReadStates with an empty conv_id", err)
	_, err = rp.ReadStates(x.ctx, 5, make([]string, sequencer.MaxReadStateConvs+1))
	invalid("ReadStates of 1001 conversations", err)
	x.expectState(c, 5, 0, 3) // nothing was stored
}

func testReadPositionConcurrent(x *suite) {
	t := x.t
	c := x.conv()
	const head, devices, marks = 60, 6, 20
	x.mustCommit(batch(c, 0, head))
	var wg sync.WaitGroup
	errs := make(chan error, devices)
	for d := 0; d < devices; d++ {
		wg.Add(1)
		go func(d int) {
			defer wg.Done()
			prev := uint64(0)
			for i := 0; i < marks; i++ {
				// Each device marks a scrambled sequence of seqs, some past the head.
				seq := uint64((i*7+d*13)%(head+10)) + 1
				got, err := x.positions().MarkRead(x.ctx, c, 77, seq)
				if err != nil {
					errs <- fmt.Errorf("device %d: %w", d, err)
					return
				}
				if got.ReadSeq < min(seq, head) || got.ReadSeq < prev || got.ReadSeq > head || got.Head != head {
					errs <- fmt.Errorf("device %d marked %d after seeing %d: answer %+v", d, seq, prev, got)
					return
				}
				prev = got.ReadSeq
			}
		}(d)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var want uint64
	for d := 0; d < devices; d++ {
		for i := 0; i < marks; i++ {
			want = max(want, min(uint64((i*7+d*13)%(head+10))+1, head))
		}
	}
	x.expectState(c, 77, want, head)
}

func testReadStatesMany(x *suite) {
	t := x.t
	const n = sequencer.MaxReadStateConvs
	convs := make([]string, n)
	var bs []persist.ConvBatch
	heads := map[string]uint64{}
	for i := range convs {
		convs[i] = x.conv()
		if i%3 != 2 { // every third conversation is never written
			h := uint64(i%5 + 1)
			bs = append(bs, batch(convs[i], 0, int(h)))
			heads[convs[i]] = h
		}
	}
	for len(bs) > 0 {
		k := min(len(bs), 200)
		x.mustCommit(bs[:k]...)
		bs = bs[k:]
	}
	reads := map[string]uint64{}
	for i := 0; i < n; i += 7 {
		c := convs[i]
		x.mark(c, 5, 2, min(2, heads[c]), heads[c])
		reads[c] = min(2, heads[c])
	}
	// The order given, with duplicates and unknown conversations mixed in.
	ask := append([]string{}, convs...)
	ask[10], ask[11] = convs[0], fmt.Sprintf("u:%d", nextID.Add(1))
	ask[n-1] = convs[7]
	got := x.states(5, ask...)
	for i, c := range ask {
		want := persist.ReadState{ConvID: c, ReadSeq: reads[c], Head: heads[c]}
		if got[i] != want {
			t.Fatalf("state %d = %+v, want %+v", i, got[i], want)
		}
	}
	// Another user has read nothing.
	for i, s := range x.states(6, ask...) {
		if s.ReadSeq != 0 || s.Head != heads[ask[i]] || s.ConvID != ask[i] {
			t.Fatalf("uid 6 state %d = %+v", i, s)
		}
	}
}

func testReadPositionsSurviveRetention(x *suite) {
	a, b := x.conv(), x.conv()
	x.mustCommit(batch(a, 0, 4), batch(b, 0, 3))
	x.mark(a, 11, 3, 3, 4)
	x.mark(b, 11, 3, 3, 3)
	if err := x.s.Trim(x.ctx, a, 4); err != nil {
		x.t.Fatalf("Trim: %v", err)
	}
	x.trimPass(serverAt.Add(time.Hour), 1000) // deletes every row
	x.expectStored(a, 4, nil)
	x.expectStored(b, 3, nil)
	x.expectState(a, 11, 3, 4)
	x.expectState(b, 11, 3, 3)
	x.mark(a, 11, 4, 4, 4)
	x.mark(b, 11, 1, 3, 3)
}

// LargeCommits commits n rows to each of convs (at least three
// conversations) twice, in one commit each time (n times the conversations
// from a store's large-commit threshold on: its COPY path), the second time
// first with one resend-key conflict: a ConflictError naming that row, with
// nothing written.
func LargeCommits(t *testing.T, s persist.Store, convs []string, n int) {
	t.Helper()
	ctx := context.Background()
	msgs := func(conv string, prev uint64, firstID uint64) persist.ConvBatch { return Rows(conv, prev, n, firstID) }
	var bs []persist.ConvBatch
	for i, c := range convs {
		bs = append(bs, msgs(c, 0, uint64(1+i*2*n)))
	}
	if err := s.Commit(ctx, bs); err != nil {
		t.Fatal(err)
	}
	var next []persist.ConvBatch
	for i, c := range convs {
		next = append(next, msgs(c, uint64(n), uint64(100_000+i*2*n)))
	}
	dup := &next[2].Messages[7]
	dup.ClientMsgID = bs[2].Messages[3].ClientMsgID
	dup.FromUID = bs[2].Messages[3].FromUID
	ce, ok := persist.AsConflict(s.Commit(ctx, next))
	if !ok || len(ce.Conflicts) != 1 || ce.Conflicts[0].Key != persist.KeyClientMsgID || ce.Conflicts[0].MsgID != dup.MsgID {
		t.Fatalf("conflict in a large commit: %+v", ce)
	}
	for _, c := range convs {
		if h, err := s.LoadHead(ctx, c); err != nil || h != uint64(n) {
			t.Fatalf("head of %s = %d, %v", c, h, err)
		}
	}
	dup.ClientMsgID = "fresh"
	if err := s.Commit(ctx, next); err != nil {
		t.Fatal(err)
	}
	ms, err := s.ReadRange(ctx, convs[2], 0, 4*n)
	if err != nil || len(ms) != 2*n {
		t.Fatalf("%s holds %d rows, %v", convs[2], len(ms), err)
	}
}

// Rows is a batch of n messages of conv after prev, msg_ids from firstID
// on, each with its own resend key.
func Rows(conv string, prev uint64, n int, firstID uint64) persist.ConvBatch {
	b := persist.ConvBatch{ConvID: conv, PrevHead: prev}
	for i := 0; i < n; i++ {
		id := firstID + uint64(i)
		b.Messages = append(b.Messages, sequencer.Message{MsgID: id, ConvID: conv, Seq: prev + uint64(i) + 1,
			FromUID: 1, MsgType: 1, Body: []byte("x"), ClientMsgID: fmt.Sprintf("%s-%d", conv, id),
			ServerAt: time.Now()})
	}
	return b
}
