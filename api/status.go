package api

import (
	"context"
	"errors"
	"strings"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
)

// This file is the ONE place where a domain error becomes a transport status.

// codePairs is the mapping both ways; codes not listed are internal.
var codePairs = [...]struct {
	domain  sequencer.Code
	connect connect.Code
}{
	{sequencer.CodeInvalidArgument, connect.CodeInvalidArgument},
	{sequencer.CodeNotFound, connect.CodeNotFound},
	{sequencer.CodeAlreadyExists, connect.CodeAlreadyExists},
	{sequencer.CodeUnavailable, connect.CodeUnavailable},
	{sequencer.CodeResourceExhausted, connect.CodeResourceExhausted},
	{sequencer.CodeCanceled, connect.CodeCanceled},
	{sequencer.CodeDeadlineExceeded, connect.CodeDeadlineExceeded},
	{sequencer.CodeUnauthenticated, connect.CodeUnauthenticated},
	{sequencer.CodePermissionDenied, connect.CodePermissionDenied},
	{sequencer.CodeFailedPrecondition, connect.CodeFailedPrecondition},
}

// ConnectCode maps a domain code to the Connect code the client sees.
func ConnectCode(c sequencer.Code) connect.Code {
	for _, p := range codePairs {
		if p.domain == c {
			return p.connect
		}
	}
	return connect.CodeInternal
}

// DomainCode is the inverse of ConnectCode, for clients that read a Connect
// error (codes the server never sends map to CodeInternal).
func DomainCode(c connect.Code) sequencer.Code {
	for _, p := range codePairs {
		if p.connect == c {
			return p.domain
		}
	}
	return sequencer.CodeInternal
}

// CodeOf classifies err (non-nil) for the client: the code of the first
// *sequencer.Error in its chain; otherwise context.Canceled and
// context.DeadlineExceeded in the chain, or a done ctx (the caller gave up
// and the error is a side effect of that), give CodeCanceled /
// CodeDeadlineExceeded; a *connect.Error (from a forwarded call) keeps its
// code; anything else is CodeInternal.
func CodeOf(ctx context.Context, err error) sequencer.Code {
	var se *sequencer.Error
	if errors.As(err, &se) {
		return se.Code
	}
	if c, ok := contextCode(err); ok {
		return c
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return DomainCode(ce.Code())
	}
	if ctx != nil {
		if c, ok := contextCode(ctx.Err()); ok {
			return c
		}
	}
	return sequencer.CodeInternal
}

func contextCode(err error) (sequencer.Code, bool) {
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, context.DeadlineExceeded):
		return sequencer.CodeDeadlineExceeded, true
	case errors.Is(err, context.Canceled):
		return sequencer.CodeCanceled, true
	}
	return 0, false
}

// ToConnectError turns err (non-nil) into the error a handler returns. The
// message the client reads is:
//   - invalid_argument, not_found, already_exists: err's text down to the
//     end of the first *sequencer.Error's Msg (built from the request: field,
//     rule, length, the request's own ids), without anything after it (a
//     store's or another node's text never reaches the client);
//   - unavailable, resource_exhausted: the short domain reason only (e.g.
//     "store unavailable"), never the cause below it (addresses, SQL);
//   - canceled, deadline_exceeded: a fixed text;
//   - internal: "internal error" only; the caller logs the detail.
func ToConnectError(ctx context.Context, err error) *connect.Error {
	code := CodeOf(ctx, err)
	var se *sequencer.Error
	var ce *connect.Error
	if code != sequencer.CodeInternal && !errors.As(err, &se) && errors.As(err, &ce) {
		// A forwarded call's error: its code and message were already shaped
		// by a sequencer edge.
		return connect.NewError(ConnectCode(code), errors.New(ce.Message()))
	}
	ce = connect.NewError(ConnectCode(code), errors.New(clientMessage(code, err)))
	var oe *sequencer.OwnerElsewhere
	if errors.As(err, &oe) {
		ce.Meta().Set(HeaderOwner, oe.NodeID)
		ce.Meta().Set(HeaderOwnerAddr, oe.Addr)
	}
	return ce
}

func clientMessage(code sequencer.Code, err error) string {
	switch code {
	case sequencer.CodeInvalidArgument, sequencer.CodeNotFound, sequencer.CodeAlreadyExists,
		sequencer.CodePermissionDenied, sequencer.CodeFailedPrecondition:
		return withoutCause(err)
	case sequencer.CodeUnavailable, sequencer.CodeResourceExhausted:
		var se *sequencer.Error
		if errors.As(err, &se) {
			return se.Msg
		}
		return code.String()
	case sequencer.CodeCanceled:
		return "request canceled"
	case sequencer.CodeDeadlineExceeded:
		return "deadline exceeded"
	default:
		return "internal error"
	}
}

// withoutCause is err's text up to the end of its first *sequencer.Error's
// Msg: the wrappers above it (context about the request) and the domain
// message stay; whatever follows (a wrapped cause, or a store's error joined
// beside it as in "%w (%w)") is dropped.
func withoutCause(err error) string {
	text := err.Error()
	var se *sequencer.Error
	if !errors.As(err, &se) || se.Msg == "" {
		return text
	}
	if i := strings.Index(text, se.Msg); i >= 0 {
		return text[:i+len(se.Msg)]
	}
	return se.Msg
}
