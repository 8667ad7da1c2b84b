package api

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
	"github.com/sequencer-im/sequencer/persist"
)

func TestConnectCodeRoundTrip(t *testing.T) {
	want := map[sequencer.Code]connect.Code{
		sequencer.CodeInvalidArgument:    connect.CodeInvalidArgument,
		sequencer.CodeNotFound:           connect.CodeNotFound,
		sequencer.CodeAlreadyExists:      connect.CodeAlreadyExists,
		sequencer.CodeUnavailable:        connect.CodeUnavailable,
		sequencer.CodeResourceExhausted:  connect.CodeResourceExhausted,
		sequencer.CodeCanceled:           connect.CodeCanceled,
		sequencer.CodeDeadlineExceeded:   connect.CodeDeadlineExceeded,
		sequencer.CodeUnauthenticated:    connect.CodeUnauthenticated,
		sequencer.CodePermissionDenied:   connect.CodePermissionDenied,
		sequencer.CodeFailedPrecondition: connect.CodeFailedPrecondition,
		sequencer.CodeInternal:           connect.CodeInternal,
		sequencer.Code(99):               connect.CodeInternal,
	}
	for dc, cc := range want {
		if got := ConnectCode(dc); got != cc {
			t.Errorf("ConnectCode(%v) = %v, want %v", dc, got, cc)
		}
		if dc != sequencer.Code(99) {
			if back := DomainCode(cc); back != dc {
				t.Errorf("DomainCode(%v) = %v, want %v", cc, back, dc)
			}
		}
	}
	if got := DomainCode(connect.CodeAborted); got != sequencer.CodeInternal {
		t.Errorf("DomainCode(aborted) = %v, want internal", got)
	}
}

func TestToConnectError(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	bg := context.Background()
	secret := errors.New("dial tcp 10.1.2.3:5432: password=hunter2")
	tests := []struct {
		name     string
		ctx      context.Context
		err      error
		wantCode connect.Code
		wantMsg  string // exact message the client reads
	}{
		{"validation", bg, sequencer.Errorf(sequencer.CodeInvalidArgument, "conv_id: must be 1..64 bytes, got 65"), connect.CodeInvalidArgument, "conv_id: must be 1..64 bytes, got 65"},
		{"not found wrapped", bg, fmt.Errorf("get 7: %w", sequencer.ErrNotFound), connect.CodeNotFound, "get 7: not found"},
		{"already exists", bg, fmt.Errorf("send: %w", sequencer.ErrAlreadyExists), connect.CodeAlreadyExists, "send: client_msg_id was already used for different content (another conversation, msg_type or body)"},
		{"invalid argument hides its cause", bg, sequencer.Wrap(sequencer.CodeInvalidArgument, secret, "conv_id: rejected by the store"), connect.CodeInvalidArgument, "conv_id: rejected by the store"},
		{"invalid argument keeps the request's context", bg, fmt.Errorf("conv %q: %w", "g:1", sequencer.Wrap(sequencer.CodeInvalidArgument, secret, "conv_id: rejected")), connect.CodeInvalidArgument, `conv "g:1": conv_id: rejected`},
		{"a store refusal hides the store's text", bg, fmt.Errorf("postgres: commit: %w (%w)", persist.ErrRejected, errors.New(`ERROR: duplicate key (client_msg_id)=(other-user) (SQLSTATE 23505)`)), connect.CodeInvalidArgument, "postgres: commit: the store refused this message"},
		{"already exists hides its cause", bg, fmt.Errorf("send: %w", sequencer.Wrap(sequencer.CodeAlreadyExists, errors.New("key used in conversation g:secret"), "client_msg_id already used")), connect.CodeAlreadyExists, "send: client_msg_id already used"},
		{"store unavailable hides cause", bg, sequencer.Wrap(sequencer.CodeUnavailable, secret, "store unavailable"), connect.CodeUnavailable, "store unavailable"},
		{"store sentinel wrapped", bg, fmt.Errorf("commit g:1 (%v): %w", secret, sequencer.ErrStoreUnavailable), connect.CodeUnavailable, "store unavailable"},
		{"unknown outcome", bg, sequencer.ErrUnknownOutcome, connect.CodeUnavailable, "commit outcome unknown"},
		{"clock moved back", bg, sequencer.ErrClockMovedBackwards, connect.CodeUnavailable, "clock moved backwards"},
		{"worker lease lost", bg, sequencer.ErrWorkerLeaseLost, connect.CodeUnavailable, "worker id lease not held"},
		{"stale epoch", bg, &persist.StaleFenceError{Fences: []persist.Fence{{Partition: 3, Owner: "n1", Epoch: 2}}}, connect.CodeUnavailable, "partition epoch is stale (fenced)"},
		{"not owner", bg, sequencer.ErrNotOwner, connect.CodeUnavailable, "this node does not own the conversation"},
		{"ownership moving", bg, sequencer.ErrOwnershipMoving, connect.CodeUnavailable, "conversation ownership is moving"},
		{"head mismatch", bg, &persist.HeadMismatchError{ConvIDs: []string{"g:1"}}, connect.CodeUnavailable, "conversation head changed under the writer"},
		{"shutting down", bg, sequencer.ErrShuttingDown, connect.CodeUnavailable, "node is shutting down"},
		{"overloaded", bg, fmt.Errorf("mailbox full: %w", sequencer.ErrOverloaded), connect.CodeResourceExhausted, "overloaded"},
		{"context canceled", bg, fmt.Errorf("send: %w", context.Canceled), connect.CodeCanceled, "request canceled"},
		{"context deadline", bg, fmt.Errorf("send: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded, "deadline exceeded"},
		{"domain canceled", bg, sequencer.Errorf(sequencer.CodeCanceled, "x"), connect.CodeCanceled, "request canceled"},
		{"plain error from a canceled ctx", canceled, errors.New("conn closed"), connect.CodeCanceled, "request canceled"},
		{"internal hides everything", bg, fmt.Errorf("scan row: %w", secret), connect.CodeInternal, "internal error"},
		{"conflict error is internal", bg, &persist.ConflictError{Conflicts: []persist.Conflict{{Key: persist.KeyConvSeq, ConvID: "g:1", Seq: 2}}}, connect.CodeInternal, "internal error"},
		{"forwarded connect error", bg, fmt.Errorf("forward: %w", connect.NewError(connect.CodeUnavailable, errors.New("ownership is moving"))), connect.CodeUnavailable, "ownership is moving"},
		{"forwarded internal hides message", bg, connect.NewError(connect.CodeInternal, secret), connect.CodeInternal, "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ToConnectError(tt.ctx, tt.err)
			if got.Code() != tt.wantCode {
				t.Fatalf("code = %v, want %v", got.Code(), tt.wantCode)
			}
			if got.Message() != tt.wantMsg {
				t.Fatalf("message = %q, want %q", got.Message(), tt.wantMsg)
			}
			if strings.Contains(got.Message(), "hunter2") {
				t.Fatalf("message leaks the cause: %q", got.Message())
			}
		})
	}
}
