// Package persist defines what the sequencer needs from durable storage, and
// nothing more, as role-sized interfaces (Committer, ConvReader, Reader,
// Retention, WorkerLeases, ReadPositions; Store is all of them): load a
// conversation's head, commit one atomic batch spanning many conversations
// (fenced), find a message by its resend key, read a seq range, get a
// message by msg_id, trim old messages, lease worker ids, keep read
// positions. The cluster's membership and partition-lease table is package
// membership's interface, which the shared stores implement too.
//
// Implementations: persist/postgres (pgx; also Citus's distributed mode),
// persist/mysql (MySQL / MariaDB, database/sql) and persist/sqlite
// (embedded, modernc.org/sqlite), and for tests persist/memstore (in
// memory, not durable, never offered by persist/open, but every role
// including membership). ONE conformance suite (persist/storetest) runs
// against all of them. persist/faulty wraps any Store to inject failures.
//
// A Store never assigns seqs or msg_ids and never decides ownership: it only
// refuses a commit that would break contiguity (head compare-and-set, unique
// keys) or that carries a stale fence.
package persist

import (
	"context"
	"time"

	"github.com/sequencer-im/sequencer"
)

// Fence and ConvBatch are the root package's (the cores use them without
// importing persist): what a commit carries.
type (
	Fence     = sequencer.Fence
	ConvBatch = sequencer.ConvBatch
)

// The roles a store plays, each the size of what one consumer needs. Every
// store implements all of them (Store) and pins it at compile time
// (var _ persist.Store = (*Store)(nil)); a consumer asks for its role only.
//
//   - Committer: the group-commit writer (package commit);
//   - ConvStore: a conversation's writer (package actor): Committer + ConvReader;
//   - Reader: the API's reads (package api);
//   - Retention: the retention pass (TrimAll) and `admin trim`;
//   - WorkerLeases: the snowflake worker-id lease (package idgen);
//   - ReadPositions: users' read positions;
//   - membership.Store: the cluster's member and partition-lease table
//     (the stores a cluster can share; see membership.Provider).

// Committer commits batches of many conversations, all or nothing.
//
// Commit's error is one of:
//   - nil: everything is durably stored (fsync'd / committed);
//   - *ConflictError: a unique key (uk_conv_seq, uk_from_client, msg_id) is
//     already taken; nothing was written;
//   - an error wrapping sequencer.ErrHeadMismatch (*HeadMismatchError) or
//     sequencer.ErrStaleEpoch (*StaleFenceError): nothing was written;
//   - an error wrapping sequencer.ErrUnknownOutcome: the commit may or may
//     not have landed (connection lost during COMMIT, timeout), and may even
//     land later; the caller must call Settle, then re-read the truth, before
//     it answers the senders or assigns another seq;
//   - an error wrapping sequencer.ErrStoreUnavailable: nothing was written
//     (failed before the commit was sent).
//
// OutcomeOf is the one place that reads these.
type Committer interface {
	// Commit writes all batches in one transaction, checking each batch's
	// Fence and PrevHead inside it.
	Commit(ctx context.Context, batches []ConvBatch) error
}

// ConvReader is what a conversation's writer reads: the head it continues
// from, the truth after an unknown outcome, and stored resend keys.
type ConvReader interface {
	// LoadHead returns the highest seq ever committed in conv, 0 if none. It
	// never goes backwards, even after Trim deleted rows.
	LoadHead(ctx context.Context, convID string) (uint64, error)
	// FindByClientKey returns the stored message with this resend key, or
	// sequencer.ErrNotFound.
	FindByClientKey(ctx context.Context, key sequencer.ClientKey) (sequencer.Message, error)
	// ReadRange returns up to limit messages of conv with seq > afterSeq,
	// ascending.
	ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error)
	// GetMessage returns the message with msgID, or sequencer.ErrNotFound
	// (the writer reads the targets of edits and recalls with it).
	GetMessage(ctx context.Context, msgID uint64) (sequencer.Message, error)
	// Settle returns once every transaction of an earlier Commit that
	// returned sequencer.ErrUnknownOutcome is finished on the server
	// (committed or rolled back), so that reads made after it see the final
	// outcome: a transaction that outlived its connection (a stalled backend
	// that ignored the cancel) cannot commit after Settle returned. It fails
	// (retryably) when it cannot tell yet. The in-memory store returns nil
	// at once. SQLite's commits cannot outlive the Commit call, but a
	// COMMIT that failed after writing its -wal frames may be found by a
	// recovery: it commits a transaction over them first (persist/sqlite,
	// settle.go).
	Settle(ctx context.Context) error
}

// ConvStore is the store of a node's conversation writers (package actor):
// its commits go through the group-commit writer.
type ConvStore interface {
	Committer
	ConvReader
}

// Reader is what the API reads: heads, seq ranges and messages by msg_id.
type Reader interface {
	LoadHead(ctx context.Context, convID string) (uint64, error)
	ReadRange(ctx context.Context, convID string, afterSeq uint64, limit int) ([]sequencer.Message, error)
	// GetMessage returns the message with msgID, or sequencer.ErrNotFound.
	GetMessage(ctx context.Context, msgID uint64) (sequencer.Message, error)
	PageReader // newest-first pages and many conversations at once (pages.go)
}

// Retention deletes old messages; heads (and read positions) are never
// touched.
type Retention interface {
	// Trim deletes conv's messages with seq <= throughSeq. The head is kept.
	Trim(ctx context.Context, convID string, throughSeq uint64) error
	// TrimBefore is one step of a retention pass over every conversation:
	// for up to limit conversations whose conv_id sorts after `after` (in
	// the store's own conv_id order; "" starts a pass), it deletes the
	// longest prefix of stored messages (lowest seqs first) whose server_at
	// is before `before`. A message at or after `before` and every later seq
	// are kept, so the stored seqs stay one contiguous range ending at the
	// head; heads are never touched. It returns the cursor for the next
	// step ("" when the pass is complete) and the number of rows deleted.
	TrimBefore(ctx context.Context, before time.Time, after string, limit int) (next string, deleted int, err error)
}

// Store is the durable storage of messages, heads and leases: every role.
type Store interface {
	ConvStore
	Reader
	Retention
	WorkerLeases
	ReadPositions

	// Ping checks the store answers.
	Ping(ctx context.Context) error
	// Close releases connections.
	Close() error
}

// WorkerLeases hands out snowflake worker ids (0..1023) so that no two live
// processes share one. Every call takes `now` from the caller's clock so the
// rules are testable without sleeping.
type WorkerLeases interface {
	// AcquireWorker leases a worker id for holder until now+ttl: a free id, or
	// one whose lease expired before now. It never takes an id whose lease is
	// live. The returned lease carries LastMs, the highest unix-ms any earlier
	// holder may have issued ids for under that id; the new holder must not
	// issue ids while its clock is at or below LastMs. Returns
	// sequencer.ErrWorkerLeaseLost (wrapped) when all 1024 ids are live.
	AcquireWorker(ctx context.Context, holder string, now time.Time, ttl time.Duration) (WorkerLease, error)
	// RenewWorker extends a lease to now+ttl and records lastMs (the highest
	// unix-ms the holder may issue ids for until the next renew; it never
	// lowers the stored value). It fails with sequencer.ErrWorkerLeaseLost if
	// the lease was taken over or expired before now.
	RenewWorker(ctx context.Context, lease WorkerLease, lastMs int64, now time.Time, ttl time.Duration) (WorkerLease, error)
	// ReleaseWorker ends the lease if still held and sets LastMs to lastMs,
	// the highest unix-ms the holder actually issued ids for: the unused
	// part of its reservation is given back, so a successor is not held off
	// by a future reservation. A release of a lease no longer held (taken
	// over, expired, released) only raises the stored LastMs.
	ReleaseWorker(ctx context.Context, lease WorkerLease, lastMs int64) error
}

// WorkerLease is a held worker id.
type WorkerLease struct {
	WorkerID int
	Holder   string
	Token    uint64    // bumped on every acquire; renew/release must match it
	Expires  time.Time // lease end
	LastMs   int64     // see AcquireWorker / RenewWorker
	// StoreMs is the store's own clock (unix ms) when it answered, 0 when
	// the store has no clock apart from this machine's (the embedded store).
	// The lease checks that its clock is not behind it.
	StoreMs int64
	// HighWaterMs (AcquireWorker only) is the highest LastMs recorded for
	// any worker id under this holder (on the embedded store, which one
	// process uses at a time: under any holder). A clock well below it moved
	// back since an earlier run, even when the lease is for another id.
	HighWaterMs int64
}

// The commit errors are the root package's (sequencer.ConflictError and
// the rest), so the cores read them without importing persist.
type (
	ConflictKey       = sequencer.ConflictKey
	Conflict          = sequencer.Conflict
	ConflictError     = sequencer.ConflictError
	HeadMismatchError = sequencer.HeadMismatchError
	StaleFenceError   = sequencer.StaleFenceError
	Outcome           = sequencer.Outcome
)

const (
	KeyConvSeq     = sequencer.KeyConvSeq
	KeyClientMsgID = sequencer.KeyClientMsgID
	KeyMsgID       = sequencer.KeyMsgID

	Landed    = sequencer.OutcomeLanded
	NotLanded = sequencer.OutcomeNotLanded
	Unknown   = sequencer.OutcomeUnknown
)

var (
	ErrUnfenced = sequencer.ErrUnfenced // see sequencer.ErrUnfenced
	ErrRejected = sequencer.ErrRejected // see sequencer.ErrRejected
)

// OutcomeOf is sequencer.OutcomeOf: what a Commit's error means.
func OutcomeOf(err error) Outcome { return sequencer.OutcomeOf(err) }

// AsConflict is sequencer.AsConflict.
func AsConflict(err error) (*ConflictError, bool) { return sequencer.AsConflict(err) }

// ReadState is sequencer.ReadState: one user's read position in one
// conversation, with the conversation's committed head (Head - ReadSeq is
// exactly the unread count).
type ReadState = sequencer.ReadState

// ReadPositions stores users' read positions (the seed's third use of seq).
// Positions live in their own table: retention (Trim, TrimBefore) never
// touches them. MarkRead writes them, and so does a Commit of batches with
// MarkSendersRead (the own-send rule: each sender's position is raised to
// their last seq in the commit, in the same transaction; SenderMarks; the
// embedded store logs the marks there and applies them later, its reads
// adding the ones not yet applied).
//
// Both methods first check their arguments with sequencer.CheckMarkRead /
// sequencer.CheckReadStates (the API's rules) and refuse bad ones with an
// error of code invalid_argument, touching nothing. A position needs no
// single writer: it only moves up (GREATEST in SQL), so any node may call
// MarkRead for any conversation, also during a handoff or after a failover,
// and the store's row decides.
type ReadPositions interface {
	// MarkRead raises uid's read position in convID to min(seq, head), the
	// head read in the same transaction (a seq above the head is clamped,
	// not refused); a lower seq leaves it unchanged (never backwards). It
	// returns the position stored after the call and the head, and is
	// durable before it returns. Concurrent calls end at the highest of
	// them. Marking a conversation whose head is 0 stores nothing and
	// answers {ReadSeq: 0, Head: 0}.
	MarkRead(ctx context.Context, convID string, uid uint64, seq uint64) (ReadState, error)
	// ReadStates returns uid's position and the head of each convID, in the
	// order given (duplicates allowed, unknown conversations as zeros), in
	// one round trip to the store.
	ReadStates(ctx context.Context, uid uint64, convIDs []string) ([]ReadState, error)
	// ReadCounts returns, for 1..100 ascending distinct bounds, how many
	// users' positions in convID fall in each bucket: counts[i] for
	// bounds[i] <= read_seq < bounds[i+1] (the last: >= it), in one read
	// of the conversation's positions (the range conv_id of the primary
	// key (conv_id, uid): never a scan of other conversations); the
	// counting is done by the store (BucketSQL), so at most 100 rows come
	// back. ReadReceipts sums them.
	ReadCounts(ctx context.Context, convID string, bounds []uint64) ([]uint64, error)
	// ReadPositionsPage returns up to limit (>= 1) positions of convID with
	// uid > afterUID, ascending by uid, and whether more follow.
	ReadPositionsPage(ctx context.Context, convID string, afterUID uint64, limit int) ([]ReadPosition, bool, error)
}

// ConvSettler is an optional ability of a Store that knows which
// conversations each commit of unknown outcome may hold: SettleConvs is
// Settle for the commits that may hold rows of convIDs only (the others are
// left to a later call). A writer that re-reads one conversation after an
// unknown outcome needs only its own commits finished; on a distributed
// store that keeps a conversation on a live worker from waiting for an
// unknown commit on a worker that is down. It fails (retryably) when it
// cannot tell yet.
type ConvSettler interface {
	SettleConvs(ctx context.Context, convIDs []string) error
}

// ConvScopedKeys is an optional ability of a Store whose resend key
// (from_uid, client_msg_id) is unique per conversation only (distributed
// mode on Citus, where every unique key must hold the distribution column:
// docs/API.md "Distributed mode"). When ClientKeysPerConversation is true,
// the same key in another conversation is a new message of that
// conversation (no ConflictError), and resends are looked up with
// FindByClientKeyIn.
type ConvScopedKeys interface {
	ClientKeysPerConversation() bool
	// FindByClientKeyIn returns convID's stored message with this resend
	// key, or sequencer.ErrNotFound.
	FindByClientKeyIn(ctx context.Context, convID string, key sequencer.ClientKey) (sequencer.Message, error)
}

// KeysPerConversation reports whether s scopes resend keys per
// conversation (see ConvScopedKeys).
func KeysPerConversation(s Store) bool {
	c, ok := s.(ConvScopedKeys)
	return ok && c.ClientKeysPerConversation()
}
