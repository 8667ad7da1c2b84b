package sequencer

import (
	"context"
	"errors"
	"fmt"
)

// Code classifies an error for the client. Only the API edge (package api) maps
// a Code to a transport status; everything below speaks Codes and sentinels.
type Code int

const (
	CodeInternal          Code = iota // a bug or an unexpected store answer
	CodeInvalidArgument               // the request breaks a validation rule; consumes no seq
	CodeNotFound                      // no such message
	CodeAlreadyExists                 // the resend key is used in another conversation
	CodeUnavailable                   // retryable: store down, clock moved back, ownership moving, lease lost
	CodeResourceExhausted             // retryable: overload, queues full
	CodeCanceled                      // the caller gave up
	CodeDeadlineExceeded              // the caller's deadline passed; outcome reported only after resolution
	// CodeUnauthenticated: the node needs a bearer token and the call had
	// none or a wrong one (only the API edge and clients see it).
	CodeUnauthenticated
	// CodePermissionDenied: the user may not do this (an edit or recall of
	// another user's message without as_moderator).
	CodePermissionDenied
	// CodeFailedPrecondition: the target's state refuses it (an edit or
	// recall of a recalled message, or outside the server's window).
	CodeFailedPrecondition
	// CodeOK is ErrorCode(nil): no error. No error carries it.
	CodeOK
)

func (c Code) String() string {
	switch c {
	case CodeInvalidArgument:
		return "invalid_argument"
	case CodeNotFound:
		return "not_found"
	case CodeAlreadyExists:
		return "already_exists"
	case CodeUnavailable:
		return "unavailable"
	case CodeResourceExhausted:
		return "resource_exhausted"
	case CodeCanceled:
		return "canceled"
	case CodeDeadlineExceeded:
		return "deadline_exceeded"
	case CodeUnauthenticated:
		return "unauthenticated"
	case CodePermissionDenied:
		return "permission_denied"
	case CodeFailedPrecondition:
		return "failed_precondition"
	case CodeOK:
		return "ok"
	default:
		return "internal"
	}
}

// Retryable reports whether a client should resend (with the same client_msg_id).
func (c Code) Retryable() bool {
	return c == CodeUnavailable || c == CodeResourceExhausted
}

// Error is an error with a domain code. Sentinels below are *Error values, so
// errors.Is works on them, and wrapping keeps the code.
type Error struct {
	Code Code
	Msg  string
	Err  error // optional cause
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with code c.
func Errorf(c Code, format string, args ...any) error {
	return &Error{Code: c, Msg: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error with code c and msg that wraps err (err may be a sentinel).
func Wrap(c Code, err error, msg string) error {
	return &Error{Code: c, Msg: msg, Err: err}
}

// Sentinel errors of the domain. Test with errors.Is; read the code with ErrorCode.
var (
	ErrNotFound            = &Error{Code: CodeNotFound, Msg: "not found"}
	ErrAlreadyExists       = &Error{Code: CodeAlreadyExists, Msg: "client_msg_id was already used for different content (another conversation, msg_type or body)"}
	ErrStoreUnavailable    = &Error{Code: CodeUnavailable, Msg: "store unavailable"}
	ErrUnknownOutcome      = &Error{Code: CodeUnavailable, Msg: "commit outcome unknown"}
	ErrClockMovedBackwards = &Error{Code: CodeUnavailable, Msg: "clock moved backwards"}
	ErrWorkerLeaseLost     = &Error{Code: CodeUnavailable, Msg: "worker id lease not held"}
	ErrStaleEpoch          = &Error{Code: CodeUnavailable, Msg: "partition epoch is stale (fenced)"}
	ErrNotOwner            = &Error{Code: CodeUnavailable, Msg: "this node does not own the conversation"}
	ErrOwnershipMoving     = &Error{Code: CodeUnavailable, Msg: "conversation ownership is moving"}
	ErrHeadMismatch        = &Error{Code: CodeUnavailable, Msg: "conversation head changed under the writer"}
	ErrOverloaded          = &Error{Code: CodeResourceExhausted, Msg: "overloaded"}
	ErrShuttingDown        = &Error{Code: CodeUnavailable, Msg: "node is shutting down"}
	// ErrHeadRegressed: the store's head of a conversation is below a seq
	// this node acked, so the store lost acknowledged messages (an
	// asynchronous replica was promoted, a backup was restored over live
	// data). The conversation refuses sends until an operator repairs it.
	ErrHeadRegressed = &Error{Code: CodeUnavailable, Msg: "conversation head went backwards in the store (acknowledged messages lost)"}
)

// ErrorCode returns the Code of the first *Error in err's chain, CodeInternal
// for other non-nil errors, and CodeOK ("ok") for nil.
func ErrorCode(err error) Code {
	if err == nil {
		return CodeOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// OwnerElsewhere wraps a send's error when this node could not reach the
// conversation's owner over the cluster link (its link is down, or it made
// no progress), while a client may: Addr is the owner's client API
// address. The API edge tells the client where to go (the
// Sequencer-Owner header, and for plain Connect clients an HTTP 307 to
// the owner: docs/API.md "Redirects"). The wrapped error's code is the
// answer's code; resending there with the same client_msg_id is exact.
type OwnerElsewhere struct {
	NodeID string
	Addr   string
	Err    error
}

func (e *OwnerElsewhere) Error() string { return e.Err.Error() }
func (e *OwnerElsewhere) Unwrap() error { return e.Err }

type followsRedirectsKey struct{}

// WithRedirects marks ctx as the call of a client that follows an HTTP
// redirect to the owner (the API edge sets it): routing may answer such a
// send with OwnerElsewhere at once instead of forwarding it over a slow link.
func WithRedirects(ctx context.Context) context.Context {
	return context.WithValue(ctx, followsRedirectsKey{}, true)
}

// FollowsRedirects reports whether ctx was marked by WithRedirects.
func FollowsRedirects(ctx context.Context) bool {
	v, _ := ctx.Value(followsRedirectsKey{}).(bool)
	return v
}

type outcomeUnknownKey struct{}

// WithEarlierOutcomeUnknown marks ctx as the resend of a send whose earlier
// attempt got no answer, so it may be stored already: the API edge sets it
// on a send that another node redirected to the owner after its own attempt
// there ended without an answer (deadline_exceeded). The node answering it
// then never says "not stored" (a retryable error): only a result, a final
// error, or deadline_exceeded again.
func WithEarlierOutcomeUnknown(ctx context.Context) context.Context {
	return context.WithValue(ctx, outcomeUnknownKey{}, true)
}

// EarlierOutcomeUnknown reports whether ctx was marked by WithEarlierOutcomeUnknown.
func EarlierOutcomeUnknown(ctx context.Context) bool {
	v, _ := ctx.Value(outcomeUnknownKey{}).(bool)
	return v
}
