// Typed errors and the classification of failed attempts (docs/CLIENTS.md,
// "What is retried").
import { Code, ConnectError } from "@connectrpc/connect";

/** The sequencer's error codes, named as on the wire (RPC code names). */
export type ErrorCode =
  | "invalid_argument"
  | "not_found"
  | "already_exists"
  | "unavailable"
  | "resource_exhausted"
  | "canceled"
  | "deadline_exceeded"
  | "unauthenticated"
  | "permission_denied"
  | "failed_precondition"
  | "internal"
  | "unknown";

const connectToName: Partial<Record<Code, ErrorCode>> = {
  [Code.Canceled]: "canceled",
  [Code.Unknown]: "unknown",
  [Code.InvalidArgument]: "invalid_argument",
  [Code.DeadlineExceeded]: "deadline_exceeded",
  [Code.NotFound]: "not_found",
  [Code.AlreadyExists]: "already_exists",
  [Code.PermissionDenied]: "permission_denied",
  [Code.FailedPrecondition]: "failed_precondition",
  [Code.ResourceExhausted]: "resource_exhausted",
  [Code.Unavailable]: "unavailable",
  [Code.Unauthenticated]: "unauthenticated",
};

/** codeName maps a Connect code to the sequencer's code name. */
export function codeName(c: Code): ErrorCode {
  return connectToName[c] ?? "internal";
}

/** parseCode reads a code name as sent in a SendBatch item's error. */
export function parseCode(s: string): ErrorCode {
  const known: ErrorCode[] = [
    "invalid_argument", "not_found", "already_exists", "unavailable", "resource_exhausted",
    "canceled", "deadline_exceeded", "unauthenticated", "permission_denied", "internal", "unknown",
  ];
  return (known as string[]).includes(s) ? (s as ErrorCode) : "internal";
}

/** retryableCode: the codes the server answers when resending may succeed. */
export function retryableCode(c: ErrorCode): boolean {
  return c === "unavailable" || c === "resource_exhausted";
}

/**
 * SequencerError is every error the client returns. `code` is the outcome's
 * code; `cause` is the last attempt's error (a ConnectError when the node
 * answered, or the item's error of a SendBatch answer). For a send,
 * `clientMsgId` is the resend key used: resending with it is always safe.
 */
export class SequencerError extends Error {
  override name = "SequencerError";
  readonly code: ErrorCode;
  readonly attempts: number;
  readonly clientMsgId?: string;

  constructor(code: ErrorCode, message: string, opts: { cause?: unknown; attempts?: number; clientMsgId?: string } = {}) {
    super(message, { cause: opts.cause });
    this.code = code;
    this.attempts = opts.attempts ?? 1;
    this.clientMsgId = opts.clientMsgId;
  }
}

/** An item's error answered by the server inside a SendBatch response. */
export class ItemError extends Error {
  override name = "ItemError";
  constructor(readonly code: ErrorCode, message: string) {
    super(message);
  }
}

/** An attempt that got no answer in time: its outcome is unknown. */
export class AttemptTimeout extends Error {
  override name = "AttemptTimeout";
  constructor(message: string, cause?: unknown) {
    super(message, { cause });
  }
}

/**
 * An attempt given up because a route check named another owner than the
 * node it waited on (docs/CLIENTS.md, "Routing"): its outcome is unknown.
 */
export class RouteMoved extends Error {
  override name = "RouteMoved";
}

/** What one failed attempt tells the client. */
export interface Failure {
  code: ErrorCode; // the code the caller sees if this is the last attempt
  retry: boolean; // resending (same client_msg_id) may succeed
  transport: boolean; // the node was not reached or the answer was lost
  timeout: boolean; // the attempt ran past its timeout
  moved?: boolean; // given up for an owner that moved: the next attempt goes at once to the owner just learned
}

// Node.js error codes (and message fragments) of a connection rather than a
// request: the node was not reached or went away under the request.
const transportCodes = new Set([
  "ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "EPIPE", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH",
  "ENOTFOUND", "EAI_AGAIN", "ERR_STREAM_DESTROYED", "ERR_STREAM_PREMATURE_CLOSE",
]);
const transportText = /http\/2 stream closed|goaway|session closed|socket hang up|premature close|other side closed|ERR_HTTP2|incomplete envelope|premature EOF|protocol error: missing|unexpected end/i;

/** transportError reports errors of the connection rather than of the request. */
export function transportError(err: unknown): boolean {
  const seen = new Set<unknown>();
  let e: unknown = err;
  while (e instanceof Error && !seen.has(e)) {
    seen.add(e);
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && (transportCodes.has(code) || code.startsWith("ERR_HTTP2"))) {
      return true;
    }
    if (transportText.test(e.message)) {
      return true;
    }
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * classify reads a failed attempt. timedOut: the attempt's own timer fired
 * (the call's budget remains); callerDone: the caller's signal aborted.
 */
export function classify(err: unknown, timedOut: boolean): Failure {
  if (err instanceof RouteMoved) {
    return { code: "deadline_exceeded", retry: true, transport: false, timeout: true, moved: true };
  }
  if (err instanceof ItemError) {
    return { code: err.code, retry: retryableCode(err.code), transport: false, timeout: false };
  }
  if (err instanceof SequencerError) {
    return { code: err.code, retry: retryableCode(err.code), transport: false, timeout: false };
  }
  if (timedOut || err instanceof AttemptTimeout) {
    return { code: "deadline_exceeded", retry: true, transport: false, timeout: true };
  }
  const ce = ConnectError.from(err);
  if (transportError(err)) {
    return { code: "unavailable", retry: true, transport: true, timeout: false };
  }
  switch (ce.code) {
    case Code.Unavailable:
    case Code.ResourceExhausted:
      return { code: codeName(ce.code), retry: true, transport: false, timeout: false };
    case Code.DeadlineExceeded:
      // The node saw the attempt's deadline pass.
      return { code: "deadline_exceeded", retry: true, transport: false, timeout: true };
    case Code.Canceled:
      // Not the caller (checked before): a stream reset by a node going away.
      return { code: "unavailable", retry: true, transport: true, timeout: false };
    default:
      return { code: codeName(ce.code), retry: false, transport: false, timeout: false };
  }
}
