package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/sequencer-im/sequencer"
)

// failure is what the client learned from one failed attempt.
type failure struct {
	code      sequencer.Code // the domain code the caller sees if this is the last attempt
	retry     bool           // resending (same client_msg_id) may succeed
	transport bool           // the node was not reached or the answer was lost
	timeout   bool           // the attempt ran past AttemptTimeout
	moved     bool           // given up because the owner moved (RouteCheck): the next attempt goes at once
}

// classify reads a failed attempt. attemptTimedOut tells that the attempt's
// own deadline passed while the call's budget remained.
func classify(err error, attemptTimedOut bool) failure {
	if errors.Is(err, errRouteMoved) {
		// Given up while waiting: the outcome is unknown, like a timeout.
		return failure{code: sequencer.CodeDeadlineExceeded, retry: true, timeout: true, moved: true}
	}
	if errors.Is(err, errAttemptTimedOut) {
		// A request that ran out of its own time (a SendBatch carrying
		// this attempt), whether or not the attempt's context has noticed
		// its own deadline yet; the caller's end is told apart by ctx.
		return failure{code: sequencer.CodeDeadlineExceeded, retry: true, timeout: true}
	}
	if ie, ok := asItemError(err); ok {
		// A batch item the node answered: the same rules as a Send's answer.
		return answered(ie.code)
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		// Not from connect: our own errors carry a domain code.
		var se *sequencer.Error
		if errors.As(err, &se) {
			return failure{code: se.Code, retry: se.Code.Retryable()}
		}
		if attemptTimedOut {
			return failure{code: sequencer.CodeDeadlineExceeded, retry: true, timeout: true}
		}
		if c, ok := contextCode(err); ok {
			return failure{code: c}
		}
		if transportErr(err) {
			return failure{code: sequencer.CodeUnavailable, retry: true, transport: true}
		}
		return failure{code: sequencer.CodeInternal}
	}
	if connect.IsWireError(err) {
		// The node answered. unavailable and resource_exhausted are retryable
		// by contract; deadline_exceeded is the node seeing the attempt's
		// deadline (propagated by the protocol) pass.
		return answered(sequencer.ParseCode(ce.Code().String()))
	}
	// Synthesized by the client: the request failed locally or in transit.
	if tlsRefused(err) {
		// A certificate the other side refuses will be refused again.
		return failure{code: sequencer.CodeUnavailable}
	}
	switch ce.Code() {
	case connect.CodeCanceled, connect.CodeDeadlineExceeded:
		if _, byContext := contextCode(err); !byContext && transportErr(err) {
			// The node died under the request (connect reports a reset
			// HTTP/2 connection as canceled): not the caller's doing.
			return failure{code: sequencer.CodeUnavailable, retry: true, transport: true}
		}
		if attemptTimedOut {
			return failure{code: sequencer.CodeDeadlineExceeded, retry: true, timeout: true}
		}
		return failure{code: sequencer.ParseCode(ce.Code().String())}
	case connect.CodeUnavailable:
		// Connection refused, reset before an answer, GOAWAY, HTTP 502/503/504.
		return failure{code: sequencer.CodeUnavailable, retry: true, transport: true}
	case connect.CodeUnknown, connect.CodeInternal:
		// An answer cut short (reset, unexpected EOF while reading it).
		if transportErr(err) {
			return failure{code: sequencer.CodeUnavailable, retry: true, transport: true}
		}
	}
	return failure{code: sequencer.ParseCode(ce.Code().String())}
}

// answered classifies a code a node answered: unavailable and
// resource_exhausted are retryable by contract; deadline_exceeded is the
// node seeing the attempt's deadline (propagated by the protocol) pass.
func answered(code sequencer.Code) failure {
	switch {
	case code.Retryable():
		return failure{code: code, retry: true}
	case code == sequencer.CodeDeadlineExceeded:
		return failure{code: code, retry: true, timeout: true}
	default:
		return failure{code: code}
	}
}

// tlsRefused reports a TLS handshake that failed on a certificate: the
// node's did not verify here, or the node refused ours (a TLS alert such as
// "certificate required" or "unknown certificate authority").
func tlsRefused(err error) bool {
	var (
		cv  *tls.CertificateVerificationError
		ua  x509.UnknownAuthorityError
		he  x509.HostnameError
		ci  x509.CertificateInvalidError
		ope *net.OpError
	)
	if errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci) {
		return true
	}
	return errors.As(err, &ope) && ope.Op == "remote error" && ope.Err != nil && strings.HasPrefix(ope.Err.Error(), "tls: ")
}

// transportErr reports errors of the connection rather than of the request.
func transportErr(err error) bool {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	// net/http's HTTP/2 client closes a connection to a node that went away
	// (GOAWAY, shutdown) with unexported errors; connect reports an answer cut
	// short that way as an incomplete envelope.
	msg := err.Error()
	return strings.Contains(msg, "http2: client connection") || strings.Contains(msg, "incomplete envelope") ||
		strings.Contains(msg, "http2: server sent GOAWAY")
}

func contextCode(err error) (sequencer.Code, bool) {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return sequencer.CodeDeadlineExceeded, true
	case errors.Is(err, context.Canceled):
		return sequencer.CodeCanceled, true
	}
	return 0, false
}

// backoff is the wait after the attempt-th failed attempt: BaseBackoff
// doubled per attempt, capped at MaxBackoff, jittered into [d/2, d].
func (p RetryPolicy) backoff(attempt int) time.Duration {
	d := p.BaseBackoff
	for i := 1; i < attempt && d < p.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, p.MaxBackoff)
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// call names the operation of a retried call for errors and logs.
type call struct {
	op      string // "send", "pull", ...
	convID  string // "" when the call is not about one conversation
	subject string // what the error message names, e.g. `conv_id "g:1"`
	// A send names its key; its subject is built only for an error.
	send        bool
	fromUID     uint64
	clientMsgID string
}

// what is the subject an error message names.
func (cl call) what() string {
	if cl.send {
		return fmt.Sprintf("conv_id %q from_uid %d client_msg_id %q", cl.convID, cl.fromUID, cl.clientMsgID)
	}
	return cl.subject
}

// attemptFunc makes one attempt under ctx (bounded by AttemptTimeout) and
// returns the node it talked to last (nil if none) and the attempt's error.
type attemptFunc func(ctx context.Context) (*node, error)

// retry runs attempts of cl until one succeeds, a failure is not retryable,
// or the policy's budget (attempts, Deadline, ctx) runs out. The returned
// error is a *sequencer.Error with the domain code, wrapping the last
// attempt's error (a *connect.Error when the node answered).
func (c *Client) retry(ctx context.Context, cl call, attempt attemptFunc) error {
	if c.closed.Load() {
		return fmt.Errorf("%s %s: %w", cl.op, cl.what(), ErrClosed)
	}
	p := c.cfg.Retry
	// The budget is a time, not a context: each attempt gets one context
	// (ctx bounded by the earlier of the budget and AttemptTimeout), so a
	// call costs one timer, not two. spent reports what a context of the
	// budget would: ctx ended or the budget's deadline passed.
	budget := time.Now().Add(p.Deadline)
	spent := func() bool { return ctx.Err() != nil || !time.Now().Before(budget) }
	var prevErr error
	var prevF failure
	for n := 1; ; n++ {
		actx, acancel := context.WithDeadline(ctx, earliest(budget, time.Now().Add(p.AttemptTimeout)))
		target, err := attempt(actx)
		timedOut := err != nil && errors.Is(actx.Err(), context.DeadlineExceeded) && !spent()
		acancel()
		if err == nil {
			return nil
		}
		f := classify(err, timedOut)
		c.noteFailure(target, cl.convID, f)
		if ctx.Err() == nil && spent() && (f.code == sequencer.CodeDeadlineExceeded || f.code == sequencer.CodeCanceled) {
			// The client's own retry budget ran out during this attempt, not
			// the caller's: report the retryable failure that spent it.
			if prevErr != nil {
				err, f = prevErr, prevF
			} else {
				f.code = sequencer.CodeUnavailable
			}
		}
		prevErr, prevF = err, f
		last := func(why string) error { return c.giveUp(ctx, cl, n, err, f, why) }
		switch {
		case !f.retry:
			return last("")
		case ctx.Err() != nil:
			return last("")
		case spent():
			return last(fmt.Sprintf("retry budget %v spent", p.Deadline))
		case p.MaxAttempts > 0 && n >= p.MaxAttempts:
			return last("max attempts reached")
		}
		wait := p.backoff(n)
		if f.moved {
			wait = 0 // the owner is known: no reason to wait
		}
		dl := budget
		if cdl, ok := ctx.Deadline(); ok {
			dl = earliest(dl, cdl)
		}
		if time.Until(dl) < wait {
			// No time for another attempt: stop now rather than sleep into
			// the deadline.
			if cdl, ok := ctx.Deadline(); ok && !cdl.After(dl) {
				f.code = sequencer.CodeDeadlineExceeded
				err = fmt.Errorf("%w (last attempt: %w)", context.DeadlineExceeded, err)
				return last("the caller's deadline would pass before the next attempt")
			}
			return last(fmt.Sprintf("retry budget %v would be spent", p.Deadline))
		}
		c.log.DebugContext(ctx, "sequencer client: retrying", "op", cl.op, "conv_id", cl.convID, "attempt", n,
			"node", nodeURL(target), "code", f.code.String(), "backoff", wait, "err", err)
		if wait == 0 {
			continue
		}
		// The wait ends before the budget (checked above): only ctx can
		// cut it short.
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return last("")
		}
	}
}

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// giveUp builds the error of a call that will not be retried again.
func (c *Client) giveUp(ctx context.Context, cl call, attempts int, err error, f failure, why string) error {
	code := f.code
	cause := err
	if ce := ctx.Err(); ce != nil {
		// The caller gave up: that is the outcome, the last attempt's error
		// stays in the chain.
		code, _ = contextCode(ce)
		if !errors.Is(err, ce) {
			cause = fmt.Errorf("%w (last attempt: %w)", ce, err)
		}
	}
	msg := cl.op + " " + cl.what()
	if attempts > 1 {
		msg += fmt.Sprintf(" (%d attempts", attempts)
		if why != "" {
			msg += ", " + why
		}
		msg += ")"
	}
	c.log.DebugContext(ctx, "sequencer client: call failed", "op", cl.op, "conv_id", cl.convID,
		"attempts", attempts, "code", code.String(), "err", err)
	return sequencer.Wrap(code, cause, msg)
}

// noteFailure updates what the client knows about nodes and owners after a
// failed attempt on target.
func (c *Client) noteFailure(target *node, convID string, f failure) {
	switch {
	case f.moved:
		// The new owner was just learned: keep it.
	case f.transport && target != nil:
		// Unreachable: avoid it for a while and re-route its conversations.
		target.markDown(time.Now().Add(c.cfg.Retry.MaxBackoff))
		if dropped := c.routes.forgetNode(target); dropped > 0 {
			c.log.Debug("sequencer client: node unreachable, routes dropped", "node", target.url, "partitions", dropped)
		}
	case f.timeout || f.code == sequencer.CodeUnavailable:
		// The owner may be moving, stuck or fenced: ask again next time.
		if convID != "" {
			c.routes.forgetConv(convID)
		}
	}
}

func nodeURL(n *node) string {
	if n == nil {
		return ""
	}
	return n.url
}
