// Package memstore is an in-memory persist.Store for tests and simulations:
// the same rules as persist/postgres and persist/sqlite (fenced,
// all-or-nothing commits, head compare-and-set, the unique keys, retention
// that never moves a head, worker-id leases), checked by the same
// conformance suite (persist/storetest), without a database.
//
// It is NOT durable: everything is lost with the process. It is never a
// production store: persist/open does not offer it for --store.
//
// Beyond persist.Store it has a few methods that arrange states the
// interface cannot reach (partition leases, a head behind its rows, a
// worker lease held by someone else) and one that inspects a worker lease.
// Fault injection is not its job: wrap it (persist/faulty, or a test's own
// wrapper).
package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/clock"
	"github.com/sequencer-im/sequencer/membership"
	"github.com/sequencer-im/sequencer/persist"
)

// workerIDs is how many snowflake worker ids exist (0..1023), as in the
// real stores' worker_lease table.
const workerIDs = 1024

// maxText is the schema's limit on conv_id and client_msg_id, in
// characters (VARCHAR(64) in PostgreSQL, a CHECK in SQLite).
const maxText = 64

// Store is an in-memory persist.Store. The zero value is not usable: call
// New. Safe for concurrent use; every call is atomic.
type Store struct {
	// Mem is the cluster's member and partition-lease table
	// (membership.Store): commits are fenced against its leases, atomically
	// with Acquire and Release, as PostgreSQL's FOR SHARE does.
	*membership.Mem

	mu     sync.Mutex // taken before Mem's lock, never after
	closed bool
	convs  map[string]*conv
	byID   map[uint64]sequencer.Message
	byKey  map[sequencer.ClientKey]uint64  // resend key -> msg_id
	reads  map[readKey]uint64              // read positions (never lowered, never past the head)
	outbox map[outboxKey]persist.OutboxRow // the firehose's outbox (outbox.go)
	// workers are the worker-id leases; a zero expires means free.
	workers [workerIDs]worker
}

// conv is one conversation: its head (never lowered) and its stored rows,
// ascending by seq.
type conv struct {
	head uint64
	rows []sequencer.Message
}

// readKey names one user's read position in one conversation.
type readKey struct {
	conv string
	uid  uint64
}

type worker struct {
	holder  string
	token   uint64
	expires time.Time
	lastMs  int64
}

var (
	_ persist.Store         = (*Store)(nil)
	_ persist.ReadPositions = (*Store)(nil)
	_ membership.Store      = (*Store)(nil)
	_ membership.Provider   = (*Store)(nil)
)

// New returns an empty store whose member leases follow the real clock.
func New() *Store { return NewWithClock(nil) }

// NewWithClock returns an empty store whose member leases follow c (a fake
// clock in simulations; nil: the real one).
func NewWithClock(c clock.Clock) *Store {
	return &Store{Mem: membership.NewMem(c), convs: map[string]*conv{}, byID: map[uint64]sequencer.Message{},
		byKey: map[sequencer.ClientKey]uint64{}, reads: map[readKey]uint64{}, outbox: map[outboxKey]persist.OutboxRow{}}
}

// Membership implements membership.Provider: the store's own table.
func (s *Store) Membership() membership.Store { return s.Mem }

// enter locks the store for one call; it fails (nothing done) when ctx has
// ended or the store is closed.
func (s *Store) enter(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %s: %w: %w", op, sequencer.ErrStoreUnavailable, err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("memstore: %s: store closed: %w", op, sequencer.ErrStoreUnavailable)
	}
	return nil
}

// stored is m as the real stores give it back: server_at in UTC with
// millisecond precision, a non-nil body of its own.
func stored(m sequencer.Message) sequencer.Message {
	m.ServerAt = m.ServerAt.UTC().Truncate(time.Millisecond)
	m.Body = append([]byte{}, m.Body...)
	return m
}

// out is a copy of a stored row for a caller (who may change its body).
func out(m sequencer.Message) sequencer.Message {
	m.Body = append([]byte{}, m.Body...)
	return m
}

// find returns the index of the first row of rows with seq > after.
func find(rows []sequencer.Message, after uint64) int {
	if after == ^uint64(0) {
		return len(rows)
	}
	i, _ := slices.BinarySearchFunc(rows, after+1, func(m sequencer.Message, seq uint64) int { return cmp.Compare(m.Seq, seq) })
	return i
}

// Commit implements persist.Store: the fences, then the heads, then the
// unique keys are checked, and either every row is stored or none.
func (s *Store) Commit(ctx context.Context, batches []persist.ConvBatch) error {
	if err := persist.CheckBatches(batches); err != nil {
		return err
	}
	if len(batches) == 0 {
		return nil
	}
	if err := s.enter(ctx, "commit"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	for i := range batches {
		for j := range batches[i].Messages {
			m := &batches[i].Messages[j]
			if utf8.RuneCountInString(m.ConvID) > maxText || utf8.RuneCountInString(m.ClientMsgID) > maxText {
				return fmt.Errorf("memstore: commit: conv_id or client_msg_id longer than %d characters: %w", maxText, persist.ErrRejected)
			}
		}
	}
	fences, unfenced := persist.Fences(batches)
	return s.Mem.FencedCommit(fences, unfenced, func() error { return s.write(batches) })
}

// write checks the heads and the unique keys and stores every row, or none
// (s.mu and the lease table held).
func (s *Store) write(batches []persist.ConvBatch) error {
	if err := persist.CheckHeads(batches, s.head); err != nil {
		return err
	}
	if err := s.checkStoredKeys(batches); err != nil {
		return err
	}
	for i := range batches {
		b := &batches[i]
		if len(b.Messages) == 0 {
			continue
		}
		c := s.convs[b.ConvID]
		if c == nil {
			c = &conv{}
			s.convs[b.ConvID] = c
		}
		for _, m := range b.Messages {
			m = stored(m)
			c.rows = slices.Insert(c.rows, find(c.rows, m.Seq-1), m)
			s.byID[m.MsgID] = m
			s.byKey[m.Key()] = m.MsgID
			if m.IsEvent() {
				s.applyEvent(c, &m, b.RecallsOfUnedited)
			}
		}
		c.head = b.LastSeq()
	}
	s.writeOutbox(batches)
	for _, m := range persist.SenderMarks(batches) {
		if k := (readKey{m.ConvID, m.UID}); m.Seq > s.reads[k] {
			s.reads[k] = m.Seq
		}
	}
	return nil
}

// applyEvent updates the target of the event ev in c (persist.ApplyEvent).
// With unedited (the batch's RecallsOfUnedited) a recall leaves edit events
// alone, as the SQL stores do, which skip looking for them: so a writer
// that sets the flag wrongly leaves bodies behind here too, where the
// conv package's model tests see them.
func (s *Store) applyEvent(c *conv, ev *sequencer.Message, unedited bool) {
	for i := range c.rows {
		r := &c.rows[i]
		switch {
		case r.MsgID == ev.TargetMsgID:
			persist.ApplyEvent(r, ev)
		case !unedited && persist.RecallsEdit(ev, r):
			r.Body, r.Recalled = []byte{}, true
		default:
			continue
		}
		s.byID[r.MsgID] = *r
	}
}

func (s *Store) head(convID string) uint64 {
	if c := s.convs[convID]; c != nil {
		return c.head
	}
	return 0
}

// checkStoredKeys reports every row that hits a unique key of a stored row
// (rows colliding within the batches were caught by persist.CheckBatches),
// ordered like the real stores' reports.
func (s *Store) checkStoredKeys(batches []persist.ConvBatch) error {
	var conflicts []persist.Conflict
	for i := range batches {
		for _, m := range batches[i].Messages {
			c := persist.Conflict{ConvID: m.ConvID, Seq: m.Seq, MsgID: m.MsgID, FromUID: m.FromUID, ClientMsgID: m.ClientMsgID}
			if _, ok := s.byID[m.MsgID]; ok {
				c.Key = persist.KeyMsgID
				conflicts = append(conflicts, c)
			}
			if cv := s.convs[m.ConvID]; cv != nil {
				if k := find(cv.rows, m.Seq-1); k < len(cv.rows) && cv.rows[k].Seq == m.Seq {
					c.Key = persist.KeyConvSeq
					conflicts = append(conflicts, c)
				}
			}
			if _, ok := s.byKey[m.Key()]; ok {
				c.Key = persist.KeyClientMsgID
				conflicts = append(conflicts, c)
			}
		}
	}
	if len(conflicts) == 0 {
		return nil
	}
	slices.SortStableFunc(conflicts, func(a, b persist.Conflict) int {
		return cmp.Or(cmp.Compare(a.ConvID, b.ConvID), cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.Key, b.Key))
	})
	return &persist.ConflictError{Conflicts: conflicts}
}

// LoadHead implements persist.Store.
func (s *Store) LoadHead(ctx context.Context, convID string) (uint64, error) {
	if err := s.enter(ctx, "load head"); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	return s.head(convID), nil
}

// FindByClientKey implements persist.Store.
func (s *Store) FindByClientKey(ctx context.Context, key sequencer.ClientKey) (sequencer.Message, error) {
	if err := s.enter(ctx, "find by client key"); err != nil {
		return sequencer.Message{}, err
	}
	defer s.mu.Unlock()
	id, ok := s.byKey[key]
	if !ok {
		return sequencer.Message{}, fmt.Errorf("memstore: client key (%d, %q): %w", key.FromUID, key.ClientMsgID, sequencer.ErrNotFound)
	}
	return out(s.byID[id]), nil
}

// GetMessage implements persist.Store.
func (s *Store) GetMessage(ctx context.Context, msgID uint64) (sequencer.Message, error) {
	if err := s.enter(ctx, "get message"); err != nil {
		return sequencer.Message{}, err
	}
	defer s.mu.Unlock()
	m, ok := s.byID[msgID]
	if !ok {
		return sequencer.Message{}, fmt.Errorf("memstore: msg_id %d: %w", msgID, sequencer.ErrNotFound)
	}
	return out(m), nil
}

// ReadRange implements persist.Store. A limit <= 0 returns none.
func (s *Store) ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error) {
	if err := s.enter(ctx, "read range"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	c := s.convs[convID]
	if c == nil || limit <= 0 {
		return nil, nil
	}
	rows := c.rows[find(c.rows, afterSeq):]
	rows = rows[:min(limit, len(rows))]
	if len(rows) == 0 {
		return nil, nil
	}
	msgs := make([]sequencer.Message, len(rows))
	for i, m := range rows {
		msgs[i] = out(m)
	}
	return msgs, nil
}

// Trim implements persist.Store: the head is kept.
func (s *Store) Trim(ctx context.Context, convID string, throughSeq uint64) error {
	if err := s.enter(ctx, "trim"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if c := s.convs[convID]; c != nil {
		s.drop(c, find(c.rows, throughSeq))
	}
	return nil
}

// drop deletes c's first n rows.
func (s *Store) drop(c *conv, n int) {
	for _, m := range c.rows[:n] {
		delete(s.byID, m.MsgID)
		delete(s.byKey, m.Key())
	}
	c.rows = slices.Delete(c.rows, 0, n)
}

// TrimBefore implements persist.Store (retention): conversations in byte
// order of conv_id, as SQLite's BINARY collation.
func (s *Store) TrimBefore(ctx context.Context, before time.Time, after string, limit int) (string, int, error) {
	if limit < 1 {
		return "", 0, errors.New("memstore: trim: limit must be >= 1")
	}
	if err := s.enter(ctx, "trim before"); err != nil {
		return "", 0, err
	}
	defer s.mu.Unlock()
	var ids []string
	for id := range s.convs {
		if id > after {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	ids = ids[:min(limit, len(ids))]
	deleted := 0
	for _, id := range ids {
		c := s.convs[id]
		// Keep the first row at or after `before` and all later rows; when
		// every row is older, delete every row up to the head.
		keep := slices.IndexFunc(c.rows, func(m sequencer.Message) bool { return !m.ServerAt.Before(before) })
		if keep < 0 {
			keep = find(c.rows, c.head)
		}
		deleted += keep
		s.drop(c, keep)
	}
	if len(ids) < limit {
		return "", deleted, nil
	}
	return ids[len(ids)-1], deleted, nil
}

// Settle implements persist.Store: a commit never outlives its call.
func (s *Store) Settle(ctx context.Context) error {
	if err := s.enter(ctx, "settle"); err != nil {
		return err
	}
	s.mu.Unlock()
	return nil
}

// Ping implements persist.Store: it fails once the store is closed.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.enter(ctx, "ping"); err != nil {
		return err
	}
	s.mu.Unlock()
	return nil
}

// Close implements persist.Store: every later call fails with
// sequencer.ErrStoreUnavailable. The contents are gone.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// leaseEnd is now+ttl as the real stores keep it: UTC, truncated to the
// millisecond (never later than asked).
func leaseEnd(now time.Time, ttl time.Duration) time.Time {
	return now.Add(ttl).UTC().Truncate(time.Millisecond)
}

// free reports whether w may be taken at now: never used, released, or
// expired before now.
func (w *worker) free(now time.Time) bool { return w.expires.IsZero() || w.expires.Before(now) }

// AcquireWorker implements persist.WorkerLeases: the free id with the
// lowest LastMs, then the lowest id. HighWaterMs is the highest LastMs of
// the ids this holder held before (as PostgreSQL: the store may be shared by
// several simulated processes). StoreMs is 0: no clock of its own.
func (s *Store) AcquireWorker(ctx context.Context, holder string, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	if err := s.enter(ctx, "acquire worker id"); err != nil {
		return persist.WorkerLease{}, err
	}
	defer s.mu.Unlock()
	best, high := -1, int64(0)
	for id := range s.workers {
		w := &s.workers[id]
		if w.holder == holder {
			high = max(high, w.lastMs)
		}
		if w.free(now) && (best < 0 || w.lastMs < s.workers[best].lastMs) {
			best = id
		}
	}
	if best < 0 {
		return persist.WorkerLease{}, fmt.Errorf("memstore: acquire worker id for %q: every id is leased: %w", holder, sequencer.ErrWorkerLeaseLost)
	}
	w := &s.workers[best]
	w.holder, w.expires = holder, leaseEnd(now, ttl)
	w.token++
	return persist.WorkerLease{WorkerID: best, Holder: holder, Token: w.token, Expires: w.expires, LastMs: w.lastMs, HighWaterMs: high}, nil
}

// held returns lease's row if lease is still the row's current lease (the
// same holder and token, not released); nil otherwise.
func (s *Store) held(lease persist.WorkerLease) *worker {
	if lease.WorkerID < 0 || lease.WorkerID >= workerIDs {
		return nil
	}
	w := &s.workers[lease.WorkerID]
	if w.holder != lease.Holder || w.token != lease.Token || w.expires.IsZero() {
		return nil
	}
	return w
}

// RenewWorker implements persist.WorkerLeases.
func (s *Store) RenewWorker(ctx context.Context, lease persist.WorkerLease, lastMs int64, now time.Time, ttl time.Duration) (persist.WorkerLease, error) {
	if err := s.enter(ctx, "renew worker id"); err != nil {
		return persist.WorkerLease{}, err
	}
	defer s.mu.Unlock()
	w := s.held(lease)
	if w == nil || w.expires.Before(now) {
		return persist.WorkerLease{}, fmt.Errorf("memstore: renew worker id %d for %q: taken over, released or expired: %w",
			lease.WorkerID, lease.Holder, sequencer.ErrWorkerLeaseLost)
	}
	w.expires, w.lastMs = leaseEnd(now, ttl), max(w.lastMs, lastMs)
	lease.Expires, lease.LastMs, lease.StoreMs, lease.HighWaterMs = w.expires, w.lastMs, 0, 0
	return lease, nil
}

// ReleaseWorker implements persist.WorkerLeases.
func (s *Store) ReleaseWorker(ctx context.Context, lease persist.WorkerLease, lastMs int64) error {
	if err := s.enter(ctx, "release worker id"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if w := s.held(lease); w != nil {
		w.lastMs, w.expires = lastMs, time.Time{}
	} else if lease.WorkerID >= 0 && lease.WorkerID < workerIDs {
		w := &s.workers[lease.WorkerID]
		w.lastMs = max(w.lastMs, lastMs)
	}
	return nil
}

// Worker returns the stored lease of worker id (Expires zero: free), for
// tests that check what a holder recorded.
func (s *Store) Worker(id int) persist.WorkerLease {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.workers[id]
	return persist.WorkerLease{WorkerID: id, Holder: w.holder, Token: w.token, Expires: w.expires, LastMs: w.lastMs}
}

// PutWorkerLeaseForTest overwrites the lease of worker id l.WorkerID with
// l.Holder, l.Expires (zero: free) and l.LastMs, bumping its token like an
// acquire: the previous holder loses it. It returns the stored lease. Tests
// use it for a takeover behind a holder's back, or for the row a previous
// holder left.
func (s *Store) PutWorkerLeaseForTest(l persist.WorkerLease) persist.WorkerLease {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := &s.workers[l.WorkerID]
	w.holder, w.lastMs = l.Holder, l.LastMs
	w.expires = time.Time{}
	if !l.Expires.IsZero() {
		w.expires = l.Expires.UTC().Truncate(time.Millisecond)
	}
	w.token++
	l.Token, l.Expires = w.token, w.expires
	return l
}

// PutPartitionLeaseForTest makes partition f.Partition held by f.Owner at
// f.Epoch (f.Owner "": released), as the cluster's lease table would; fenced
// commits are checked against it (storetest.Hooks).
func (s *Store) PutPartitionLeaseForTest(ctx context.Context, f persist.Fence) error {
	if err := s.enter(ctx, "put partition lease"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.Mem.PutLeaseForTest(f)
	return nil
}

// SetHeadForTest overwrites convID's head, e.g. to put it behind its rows
// as imported data might be (storetest.Hooks).
func (s *Store) SetHeadForTest(ctx context.Context, convID string, head uint64) error {
	if err := s.enter(ctx, "set head"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	c := s.convs[convID]
	if c == nil {
		c = &conv{}
		s.convs[convID] = c
	}
	c.head = head
	return nil
}

// MarkRead implements persist.ReadPositions.
func (s *Store) MarkRead(ctx context.Context, convID string, uid, seq uint64) (persist.ReadState, error) {
	if err := sequencer.CheckMarkRead(convID, uid, seq); err != nil {
		return persist.ReadState{}, err
	}
	if err := s.enter(ctx, "mark read"); err != nil {
		return persist.ReadState{}, err
	}
	defer s.mu.Unlock()
	head := s.head(convID)
	k := readKey{convID, uid}
	if to := min(seq, head); to > s.reads[k] {
		s.reads[k] = to
	}
	return persist.ReadState{ConvID: convID, ReadSeq: s.reads[k], Head: head}, nil
}

// ReadStates implements persist.ReadPositions.
func (s *Store) ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]persist.ReadState, error) {
	if err := sequencer.CheckReadStates(uid, convIDs); err != nil {
		return nil, err
	}
	if err := s.enter(ctx, "read states"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := make([]persist.ReadState, len(convIDs))
	for i, c := range convIDs {
		out[i] = persist.ReadState{ConvID: c, ReadSeq: s.reads[readKey{c, uid}], Head: s.head(c)}
	}
	return out, nil
}

// ReadCounts implements persist.ReadPositions (a scan of every position:
// the in-memory store is for tests).
func (s *Store) ReadCounts(ctx context.Context, convID string, bounds []uint64) ([]uint64, error) {
	return persist.ReadCountsOf(convID, bounds, func() ([]persist.BucketCount, error) {
		if err := s.enter(ctx, "read counts"); err != nil {
			return nil, err
		}
		defer s.mu.Unlock()
		var out []persist.BucketCount
		for k, seq := range s.reads {
			if k.conv == convID {
				b, found := slices.BinarySearch(bounds, seq)
				if found {
					b++
				}
				out = append(out, persist.BucketCount{Bucket: b, Users: 1})
			}
		}
		return out, nil
	})
}

// ReadPositionsPage implements persist.ReadPositions.
func (s *Store) ReadPositionsPage(ctx context.Context, convID string, afterUID uint64, limit int) ([]persist.ReadPosition, bool, error) {
	return persist.ReadPage(convID, afterUID, limit, func(n int) ([]persist.ReadPosition, error) {
		if err := s.enter(ctx, "read positions"); err != nil {
			return nil, err
		}
		defer s.mu.Unlock()
		var all []persist.ReadPosition
		for k, seq := range s.reads {
			if k.conv == convID && k.uid > afterUID {
				all = append(all, persist.ReadPosition{UID: k.uid, ReadSeq: seq})
			}
		}
		slices.SortFunc(all, func(a, b persist.ReadPosition) int { return cmp.Compare(a.UID, b.UID) })
		return all[:min(n, len(all))], nil
	})
}
