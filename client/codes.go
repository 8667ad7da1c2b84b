package client

import "github.com/sequencer-im/sequencer"

// Code is the domain code of an error a call returns (sequencer.Code, so
// the codes below and sequencer's are the same values); its String is the
// wire's name ("not_found", "unavailable", ...).
type Code = sequencer.Code

// The codes a call's error can carry, readable without importing the root
// package. CodeOK is ErrorCode(nil).
const (
	CodeOK                 = sequencer.CodeOK
	CodeInvalidArgument    = sequencer.CodeInvalidArgument
	CodeNotFound           = sequencer.CodeNotFound
	CodeAlreadyExists      = sequencer.CodeAlreadyExists
	CodeUnavailable        = sequencer.CodeUnavailable
	CodeResourceExhausted  = sequencer.CodeResourceExhausted
	CodeCanceled           = sequencer.CodeCanceled
	CodeDeadlineExceeded   = sequencer.CodeDeadlineExceeded
	CodeUnauthenticated    = sequencer.CodeUnauthenticated
	CodePermissionDenied   = sequencer.CodePermissionDenied
	CodeFailedPrecondition = sequencer.CodeFailedPrecondition
	CodeInternal           = sequencer.CodeInternal
)

// ErrorCode returns the code of an error a call returned: CodeOK for nil
// (a SendMany item that succeeded), the domain code the SDK attached
// otherwise, CodeInternal for an error that carries none.
func ErrorCode(err error) Code { return sequencer.ErrorCode(err) }
