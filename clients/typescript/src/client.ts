// The sequencer client for Node.js: the rules of docs/CLIENTS.md over the
// generated API (src/gen) and connect-node's HTTP/2 transports.
import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { ConnectError, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { compressionGzip, createConnectTransport, createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { randomUUID } from "node:crypto";
import type { SecureClientSessionOptions } from "node:http2";

import {
  SequencerService,
  SendRequestSchema,
  type SendResponse,
} from "./gen/sequencer/v1/sequencer_pb.js";
import { Batcher, itemSize, type BatchLimits, type Pending } from "./batcher.js";
import { classify, RouteMoved, SequencerError, type ErrorCode, type Failure } from "./errors.js";
import { RouteCache, type Route } from "./route.js";
import { messageFromPb, pullLatest, pullMany, subscribe, type Cursor, type FeedEvent, type FeedHost, type SubscribeOptions } from "./feed.js";

/** Retry budget of one call (docs/CLIENTS.md, "Retries"). */
export interface RetryOptions {
  /** Attempts per call, the first included; 0 = no count limit (default); 1 disables retries. */
  maxAttempts?: number;
  /** Budget of one call, every attempt and wait included (default 30 000 ms). */
  deadlineMs?: number;
  /** One attempt (Route lookup plus the RPC); past it the attempt is retried (default 10 000 ms). */
  attemptTimeoutMs?: number;
  /** First wait; doubles per attempt, jittered into [d/2, d] (default 20 ms). */
  baseBackoffMs?: number;
  /** Cap of the wait; also how long an unreachable node is avoided (default 1 000 ms). */
  maxBackoffMs?: number;
  /**
   * A send attempt not answered within this asks another node Route, and
   * again every routeCheckMs while it waits; an answer naming another owner
   * ends the attempt and the send goes there at once, same key (default 250 ms).
   */
  routeCheckMs?: number;
}

/** TLS options for https:// addresses (Node's http2.connect options). */
export type TlsOptions = Pick<SecureClientSessionOptions, "ca" | "cert" | "key" | "servername" | "rejectUnauthorized">;

export interface ClientOptions {
  /** Node API addresses: "host:port" (cleartext HTTP/2) or "http(s)://host:port". Entry points only. */
  addrs: string[];
  /** Bearer token sent as `Authorization: Bearer <token>` on every RPC (server flag --auth-token-file). */
  token?: string;
  /** TLS options for https:// addresses (a private CA, a client certificate for --client-ca). */
  tls?: TlsOptions;
  /** Wire protocol: "grpc" (default) or "connect"; both over HTTP/2. */
  protocol?: "grpc" | "connect";
  retry?: RetryOptions;
  /** Conversations whose partition is remembered (default 65 536, least recently used forgotten). */
  routeCacheSize?: number;
  /** Send everything to `addrs` (they forward): for a load balancer that hides the nodes. */
  disableRouting?: boolean;
  /** Most items in one SendBatch (default and maximum 1000, the server's limit). */
  maxBatchItems?: number;
  /** About the most bytes in one SendBatch (default 3 MiB; the server's default limit is 4 MiB). */
  maxBatchBytes?: number;
  /**
   * Most SendBatch requests in flight to one node (default 4, 1..64; 1 = one
   * at a time). The items of one conversation are never in two of them at once.
   */
  maxBatchesInFlight?: number;
  /** Bounds of what waits for one node (default 10 000 items, 32 MiB); past them send waits for room. */
  maxQueuedItems?: number;
  maxQueuedBytes?: number;
  /** Send every message in its own Send RPC (no SendBatch). */
  disableBatching?: boolean;
  /**
   * Ask the nodes to gzip answers above 1 KiB (default false, as the Go
   * SDK's Config.Gzip). On a LAN gzip costs both sides more CPU than the
   * bytes save: a pullMany of 1,000 conversations x 10 messages took 60-63
   * ms with it, 49-51 ms without (docs/BENCHMARKS.md).
   */
  gzip?: boolean;
  /** More Connect interceptors (after the bearer token one). */
  interceptors?: Interceptor[];
  /** Debug log of retries and route changes (default: none). */
  debug?: (msg: string, fields: Record<string, unknown>) => void;
}

/** A message to send. Ids are bigint or decimal strings, never JS numbers. */
export interface SendInput {
  convId: string;
  fromUid: bigint | string;
  /** The resend key; when empty the client generates a UUID and keeps it across its retries. */
  clientMsgId?: string;
  /** 0 or absent means 1. */
  msgType?: number;
  /** Opaque payload; a string is sent as its UTF-8 bytes. */
  body?: Uint8Array | string;
}

export interface SendResult {
  msgId: bigint;
  seq: bigint;
  serverAt: Date | undefined;
  /** This was a resend: the ids are the first send's. */
  duplicate: boolean;
  /** The resend key used (generated when the input had none). */
  clientMsgId: string;
}

export type SendOutcome = { ok: true; result: SendResult } | { ok: false; error: SequencerError };

/** What a message is: an ordinary one, or an event that edits or recalls targetMsgId. */
export type MessageKindName = "message" | "edit" | "recall";

export interface Message {
  msgId: bigint;
  convId: string;
  seq: bigint;
  fromUid: bigint;
  msgType: number;
  body: Uint8Array;
  clientMsgId: string;
  serverAt: Date | undefined;
  /** "edit" or "recall": this message is an event changing targetMsgId (docs/API.md, "Edit and Recall"). */
  kind: MessageKindName;
  /** The message an edit or recall event changes; 0n for an ordinary message. */
  targetMsgId: bigint;
  /** Recalled: the body is gone for good. */
  recalled: boolean;
  /** Edits applied to this message, and when the last one was stored. */
  editCount: number;
  editedAt: Date | undefined;
}

/** An edit of an earlier message (the new body), or a recall (no body). */
export interface EventInput {
  convId: string;
  /** The target's sender, unless asModerator. */
  fromUid: bigint | string;
  /** The event's resend key; generated (and kept across retries) when empty. */
  clientMsgId?: string;
  targetMsgId: bigint | string;
  /** Set only for a user your logic layer authorized as a moderator. */
  asModerator?: boolean;
}

export interface EditInput extends EventInput {
  body: Uint8Array | string;
}

export interface PullResult {
  messages: Message[];
  headSeq: bigint;
  hasMore: boolean;
}

/**
 * ReadState is one user's read position in one conversation: readSeq (0n if
 * never marked), the conversation's headSeq (0n if never written) and
 * unread = headSeq - readSeq, exact because seqs have no holes.
 */
export interface ReadState {
  convId: string;
  readSeq: bigint;
  headSeq: bigint;
  unread: bigint;
}

/** One user's read position in a conversation (listReadPositions). */
export interface ReadPosition {
  uid: bigint;
  readSeq: bigint;
}

/** The most conversations one readState call may name. */
export const MAX_READ_STATE_CONVS = 1000;

export interface CallOptions {
  /** Ends the call (and its retries) early: the error's code is then canceled. */
  signal?: AbortSignal;
}

export type { Route };

/** The header of a send's answer naming the answering node's membership version (docs/API.md, "Route"). */
const headerMembershipVersion = "sequencer-membership-version";

/** The server's limit of items per SendBatch. */
export const MAX_BATCH_ITEMS = 1000;

/** The most maxBatchesInFlight allows. */
export const MAX_BATCHES_IN_FLIGHT = 64;

const defaults = {
  deadlineMs: 30_000,
  attemptTimeoutMs: 10_000,
  baseBackoffMs: 20,
  maxBackoffMs: 1_000,
  routeCheckMs: 250,
  routeCacheSize: 65_536,
  maxBatchBytes: 3 << 20,
  maxBatchesInFlight: 4,
  maxQueuedItems: 10_000,
  maxQueuedBytes: 32 << 20,
};

/** newClientMsgId returns a random UUID. */
export function newClientMsgId(): string {
  return randomUUID();
}

/** One node the client talks to: a configured entry point or an owner learned from Route. */
class Node {
  downUntil = 0;
  readonly rpc: Client<typeof SequencerService>;
  readonly batcher: Batcher;
  constructor(
    readonly url: string,
    readonly seed: boolean,
    private readonly sessions: Http2SessionManager,
    transport: Transport,
    limits: BatchLimits,
    readonly onHeader: (headers: Headers) => void,
  ) {
    this.rpc = createClient(SequencerService, transport);
    this.batcher = new Batcher(
      async (items, signal) => {
        const resp = await this.rpc.sendBatch({ items }, { signal, onHeader });
        return resp.results.map((r) =>
          r.outcome.case === "ok" ? { ok: r.outcome.value }
          : r.outcome.case === "error" ? { error: r.outcome.value }
          : {},
        );
      },
      (item, signal) => this.rpc.send(item, { signal, onHeader }),
      limits,
    );
  }
  down(now: number): boolean {
    return now < this.downUntil;
  }
  close(): void {
    this.sessions.abort();
  }
}

function baseURL(addr: string): string {
  if (addr.startsWith("http://") || addr.startsWith("https://")) {
    const u = new URL(addr);
    return `${u.protocol}//${u.host}`;
  }
  const u = new URL(`http://${addr}`);
  if (!u.port) {
    throw new SequencerError("invalid_argument", `address ${JSON.stringify(addr)}: want host:port or http(s)://host:port`);
  }
  return `http://${u.host}`;
}

/**
 * ownerURL is where to reach an owner whose API address Route named; an
 * unspecified host is the host of the node that answered. (Internal; exported for tests.)
 */
export function ownerURL(addr: string, answeredBy: string): string {
  if (addr === "") {
    return "";
  }
  if (addr.startsWith("http://") || addr.startsWith("https://")) {
    return baseURL(addr);
  }
  const i = addr.lastIndexOf(":");
  if (i < 0 || i === addr.length - 1) {
    return "";
  }
  let host = addr.slice(0, i);
  const port = addr.slice(i + 1);
  const via = new URL(answeredBy);
  if (host === "" || host === "0.0.0.0" || host === "[::]" || host === "::") {
    host = via.hostname;
  }
  return `${via.protocol}//${host}:${port}`;
}

/**
 * backoffMs is the wait after the attempt-th failed attempt: base doubled per
 * attempt, capped at max, jittered into [d/2, d]. (Internal; exported for tests.)
 */
export function backoffMs(attempt: number, base: number, max: number): number {
  let d = base;
  for (let i = 1; i < attempt && d < max; i++) {
    d *= 2;
  }
  d = Math.min(d, max);
  const half = d / 2;
  return half + Math.random() * (d - half);
}

const maxUint64 = (1n << 64n) - 1n;

// A local check failed: nothing was sent (0 attempts).
function invalid(msg: string): SequencerError {
  return new SequencerError("invalid_argument", msg, { attempts: 0 });
}

function toUint64(v: bigint | string, field: string): bigint {
  let n: bigint | undefined;
  if (typeof v === "bigint") {
    n = v;
  } else if (typeof v === "string" && /^[0-9]{1,20}$/.test(v)) {
    n = BigInt(v);
  }
  if (n === undefined || n < 0n || n > maxUint64) {
    throw invalid(`${field}: want a bigint or a decimal string in 0..2^64-1, got ${typeof v} ${String(v)}`);
  }
  return n;
}

function checkInt(v: number, lo: number, hi: number, field: string): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < lo || v > hi) {
    throw invalid(`${field}: want an integer in ${lo}..${hi}, got ${typeof v} ${String(v)}`);
  }
  return v;
}

function checkString(v: unknown, field: string): string {
  if (typeof v !== "string") {
    throw invalid(`${field}: want a string, got ${typeof v}`);
  }
  return v;
}

function bodyBytes(b: unknown): Uint8Array {
  if (b === undefined) {
    return new Uint8Array();
  }
  if (typeof b === "string") {
    return utf8.encode(b);
  }
  if (b instanceof Uint8Array) {
    return b;
  }
  throw invalid(`body: want a Uint8Array or a string, got ${typeof b}`);
}

const utf8 = new TextEncoder();

function sendResult(resp: SendResponse, key: string): SendResult {
  return {
    msgId: resp.msgId,
    seq: resp.seq,
    serverAt: resp.serverAt ? timestampDate(resp.serverAt) : undefined,
    duplicate: resp.duplicate,
    clientMsgId: key,
  };
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}

interface CallInfo {
  op: string;
  convId?: string;
  subject: string;
  clientMsgId?: string;
}

/**
 * SequencerClient talks to a sequencer cluster. Make one per process and
 * share it; close() it at the end. Concurrent send() calls to the same node
 * coalesce into SendBatch requests.
 */
export class SequencerClient {
  private readonly seeds: Node[] = [];
  private readonly learned = new Map<string, Node>();
  private readonly routes: RouteCache<Node>;
  private readonly retry: Required<RetryOptions>;
  private readonly interceptors: Interceptor[];
  private readonly routing = new Map<string, Promise<[Node, Node | undefined]>>();
  private readonly checks = new Map<string, Promise<Node | undefined>>();
  private rr = 0;
  private routingOffUntil = 0;
  private closed = false;

  constructor(private readonly opts: ClientOptions) {
    if (!opts.addrs || opts.addrs.length === 0) {
      throw new SequencerError("invalid_argument", "sequencer client: addrs: at least one address needed");
    }
    this.retry = {
      maxAttempts: opts.retry?.maxAttempts ?? 0,
      deadlineMs: opts.retry?.deadlineMs ?? defaults.deadlineMs,
      attemptTimeoutMs: opts.retry?.attemptTimeoutMs ?? defaults.attemptTimeoutMs,
      baseBackoffMs: opts.retry?.baseBackoffMs ?? defaults.baseBackoffMs,
      maxBackoffMs: opts.retry?.maxBackoffMs ?? defaults.maxBackoffMs,
      routeCheckMs: opts.retry?.routeCheckMs ?? defaults.routeCheckMs,
    };
    if (!(this.retry.routeCheckMs > 0)) {
      throw new SequencerError("invalid_argument", `sequencer client: retry.routeCheckMs: must be > 0, got ${this.retry.routeCheckMs}`);
    }
    const maxItems = opts.maxBatchItems ?? MAX_BATCH_ITEMS;
    if (maxItems < 1 || maxItems > MAX_BATCH_ITEMS) {
      throw new SequencerError("invalid_argument", `sequencer client: maxBatchItems: must be 1..${MAX_BATCH_ITEMS}, got ${maxItems}`);
    }
    const inFlight = opts.maxBatchesInFlight ?? defaults.maxBatchesInFlight;
    if (!Number.isInteger(inFlight) || inFlight < 1 || inFlight > MAX_BATCHES_IN_FLIGHT) {
      throw new SequencerError("invalid_argument", `sequencer client: maxBatchesInFlight: must be 1..${MAX_BATCHES_IN_FLIGHT}, got ${inFlight}`);
    }
    this.interceptors = [];
    if (opts.token !== undefined) {
      const auth = `Bearer ${opts.token}`;
      this.interceptors.push((next) => (req) => {
        req.header.set("Authorization", auth);
        return next(req);
      });
    }
    this.interceptors.push(...(opts.interceptors ?? []));
    this.routes = new RouteCache<Node>(opts.routeCacheSize ?? defaults.routeCacheSize);
    const seen = new Set<string>();
    for (const a of opts.addrs) {
      const u = baseURL(a);
      if (!seen.has(u)) {
        seen.add(u);
        this.seeds.push(this.newNode(u, true));
      }
    }
  }

  private newNode(url: string, seed: boolean): Node {
    // DATA frames up to 1 MiB, not HTTP/2's default 16 KiB: a 2 MB PullMany
    // answer comes in a few frames instead of about 130.
    const settings = { maxFrameSize: 1 << 20 };
    const nodeOptions: SecureClientSessionOptions = url.startsWith("https://") ? { ...this.opts.tls, settings } : { settings };
    const sessions = new Http2SessionManager(url, { pingIntervalMs: 15_000, pingTimeoutMs: 5_000, idleConnectionTimeoutMs: 60_000 }, nodeOptions);
    const common = {
      baseUrl: url,
      httpVersion: "2" as const,
      sessionManager: sessions,
      interceptors: this.interceptors,
      acceptCompression: this.opts.gzip ? [compressionGzip] : [],
    };
    const transport = this.opts.protocol === "connect" ? createConnectTransport(common) : createGrpcTransport(common);
    return new Node(url, seed, sessions, transport, {
      maxItems: this.opts.maxBatchItems ?? MAX_BATCH_ITEMS,
      maxBytes: this.opts.maxBatchBytes ?? defaults.maxBatchBytes,
      maxInFlight: this.opts.maxBatchesInFlight ?? defaults.maxBatchesInFlight,
      maxQueuedItems: this.opts.maxQueuedItems ?? defaults.maxQueuedItems,
      maxQueuedBytes: this.opts.maxQueuedBytes ?? defaults.maxQueuedBytes,
      timeoutMs: this.retry.attemptTimeoutMs,
    }, this.sawView);
  }

  // sawView notes the membership version a send's answer carries (header
  // Sequencer-Membership-Version): cached owners of older views are asked again.
  private readonly sawView = (headers: Headers): void => {
    const v = headers.get(headerMembershipVersion);
    if (v !== null && /^[0-9]{1,20}$/.test(v)) {
      this.routes.saw(BigInt(v));
    }
  };

  private debug(msg: string, fields: Record<string, unknown>): void {
    this.opts.debug?.(msg, fields);
  }

  /** close stops the client: later calls fail with canceled; open connections are closed. */
  close(): void {
    this.closed = true;
    for (const n of [...this.seeds, ...this.learned.values()]) {
      n.close();
    }
  }

  /**
   * send stores one message and resolves with its ids once it is durably
   * committed. It goes to the conversation's owner, in a SendBatch shared
   * with the other sends to that node, and retries retryable failures with
   * the same client_msg_id (a stored attempt whose answer was lost comes
   * back with duplicate true and the first ids).
   */
  async send(input: SendInput, opts: CallOptions = {}): Promise<SendResult> {
    // Only what protobuf cannot encode is checked here (one unencodable
    // item would fail its whole SendBatch); the server checks the rest.
    const key = input.clientMsgId ? checkString(input.clientMsgId, "clientMsgId") : newClientMsgId();
    const req = create(SendRequestSchema, {
      convId: checkString(input.convId, "convId"),
      fromUid: toUint64(input.fromUid, "fromUid"),
      clientMsgId: key,
      msgType: checkInt(input.msgType ?? 0, -(2 ** 31), 2 ** 31 - 1, "msgType"),
      body: bodyBytes(input.body),
    });
    const size = itemSize(req);
    const call: CallInfo = {
      op: "send",
      convId: req.convId,
      clientMsgId: key,
      subject: `conv_id ${JSON.stringify(req.convId)} from_uid ${req.fromUid} client_msg_id ${JSON.stringify(key)}`,
    };
    const resp = await this.withRetry(call, opts, async (at) => {
      const target = await this.sendTarget(req.convId, at.signal);
      at.target = target;
      const watch = this.watchRoute(req.convId, target, at.signal);
      try {
        if (this.opts.disableBatching) {
          return await target.rpc.send(req, { signal: watch.signal, onHeader: this.sawView });
        }
        let p!: Pending;
        const answer = new Promise<SendResponse>((resolve, reject) => {
          p = {
            req, size, done: false,
            resolve: (r) => { p.done = true; resolve(r); },
            reject: (e) => { p.done = true; reject(e); },
          };
        });
        answer.catch(() => {}); // observed below, or dropped when enqueue fails first
        watch.signal.addEventListener("abort", () => p.reject(watch.signal.reason), { once: true });
        await target.batcher.enqueue(p, watch.signal);
        return await answer;
      } catch (e) {
        throw watch.signal.reason instanceof RouteMoved ? watch.signal.reason : e;
      } finally {
        watch.stop();
      }
    });
    return sendResult(resp, key);
  }

  /**
   * edit appends an edit event (a new msgId and seq) and replaces the
   * target's body in the same commit; it resolves with the event's ids.
   * Routed and retried like send with one resend key. Refusals (not
   * retried): not_found, permission_denied (another user's message without
   * asModerator), failed_precondition (recalled, or past --edit-window).
   */
  edit(input: EditInput, opts: CallOptions = {}): Promise<SendResult> {
    return this.event("edit", input, opts, (rpc, req, o) =>
      rpc.edit({ ...req, body: bodyBytes(input.body) }, o));
  }

  /** recall appends a recall event and removes the target's body for good; see edit. */
  recall(input: EventInput, opts: CallOptions = {}): Promise<SendResult> {
    return this.event("recall", input, opts, (rpc, req, o) => rpc.recall(req, o));
  }

  private async event(
    op: string, input: EventInput, opts: CallOptions,
    call: (rpc: Node["rpc"], req: { convId: string; fromUid: bigint; clientMsgId: string; targetMsgId: bigint; asModerator: boolean },
      o: { signal: AbortSignal; onHeader: (h: Headers) => void }) => Promise<SendResponse>,
  ): Promise<SendResult> {
    const key = input.clientMsgId ? checkString(input.clientMsgId, "clientMsgId") : newClientMsgId();
    const req = {
      convId: checkString(input.convId, "convId"),
      fromUid: toUint64(input.fromUid, "fromUid"),
      clientMsgId: key,
      targetMsgId: toUint64(input.targetMsgId, "targetMsgId"),
      asModerator: input.asModerator ?? false,
    };
    const info: CallInfo = {
      op, convId: req.convId, clientMsgId: key,
      subject: `conv_id ${JSON.stringify(req.convId)} from_uid ${req.fromUid} client_msg_id ${JSON.stringify(key)}`,
    };
    const resp = await this.withRetry(info, opts, async (at) => {
      const target = await this.sendTarget(req.convId, at.signal);
      at.target = target;
      const watch = this.watchRoute(req.convId, target, at.signal);
      try {
        return await call(target.rpc, req, { signal: watch.signal, onHeader: this.sawView });
      } catch (e) {
        throw watch.signal.reason instanceof RouteMoved ? watch.signal.reason : e;
      } finally {
        watch.stop();
      }
    });
    return sendResult(resp, key);
  }

  /**
   * sendMany sends every input (each with send's rules) and answers each on
   * its own, in input order; one failed item never fails the others. Items
   * to the same node go out in shared SendBatch requests.
   */
  sendMany(inputs: SendInput[], opts: CallOptions = {}): Promise<SendOutcome[]> {
    return Promise.all(
      inputs.map((input) =>
        this.send(input, opts).then(
          (result): SendOutcome => ({ ok: true, result }),
          (error: unknown): SendOutcome => ({ ok: false, error: error instanceof SequencerError ? error : new SequencerError("internal", String(error), { cause: error }) }),
        ),
      ),
    );
  }

  /**
   * pull returns the messages of convId with seq > afterSeq, ascending, at
   * most limit (0 means the server's default 100; above 1000 is clamped).
   * Any node answers it.
   */
  async pull(convId: string, afterSeq: bigint | string, limit = 0, opts: CallOptions = {}): Promise<PullResult> {
    const after = toUint64(afterSeq, "afterSeq");
    checkInt(limit, 0, 2 ** 32 - 1, "limit");
    const call: CallInfo = { op: "pull", convId, subject: `conv_id ${JSON.stringify(convId)} after_seq ${after}` };
    const resp = await this.withRetry(call, opts, (at) => {
      at.target = this.anyNode();
      return at.target.rpc.pull({ convId, afterSeq: after, limit }, { signal: at.signal });
    });
    return { messages: resp.messages.map(messageFromPb), headSeq: resp.headSeq, hasMore: resp.hasMore };
  }

  /**
   * subscribe follows the conversations of cursors (1..10,000): every stored
   * message above each cursor, in seq order, each once, backlog then live,
   * resuming by itself across node deaths (feed.ts).
   */
  subscribe(cursors: Cursor[], opts: SubscribeOptions = {}): AsyncGenerator<FeedEvent> {
    return subscribe(this.feedHost(), cursors, opts);
  }

  /** pullMany catches up on up to 1,000 conversations in one call; pages[i] answers cursors[i]. */
  pullMany(cursors: Cursor[], limit = 0, maxBytes = 0, opts: CallOptions = {}): Promise<PullResult[]> {
    return pullMany(this.feedHost(), cursors, limit, maxBytes, opts);
  }

  /** pullLatest loads the newest limit messages below beforeSeq (0n: from the head), ascending. */
  pullLatest(convId: string, beforeSeq = 0n, limit = 0, opts: CallOptions = {}): Promise<PullResult> {
    return pullLatest(this.feedHost(), convId, beforeSeq, limit, opts);
  }

  private feedHost(): FeedHost {
    return {
      pick: (avoid) => this.anyNode(avoid as Node | undefined),
      markDown: (n) => {
        (n as Node).downUntil = Date.now() + this.retry.maxBackoffMs;
      },
      retried: (op, subject, opts, f) =>
        this.withRetry({ op, subject }, opts, (at) => {
          at.target = this.anyNode();
          return f(at.target.rpc, at.signal);
        }),
      backoff: (n) => this.backoff(n),
      isClosed: () => this.closed,
    };
  }

  /** getHead returns the highest committed seq of convId (0n if none). */
  async getHead(convId: string, opts: CallOptions = {}): Promise<bigint> {
    const resp = await this.withRetry({ op: "get head", convId, subject: `conv_id ${JSON.stringify(convId)}` }, opts, (at) => {
      at.target = this.anyNode();
      return at.target.rpc.getHead({ convId }, { signal: at.signal });
    });
    return resp.headSeq;
  }

  /** getMessage returns one message by id; an unknown id fails with code not_found. */
  async getMessage(msgId: bigint | string, opts: CallOptions = {}): Promise<Message> {
    const id = toUint64(msgId, "msgId");
    const resp = await this.withRetry({ op: "get message", subject: `msg_id ${id}` }, opts, (at) => {
      at.target = this.anyNode();
      return at.target.rpc.getMessage({ msgId: id }, { signal: at.signal });
    });
    if (!resp.message) {
      throw new SequencerError("internal", `get message msg_id ${id}: empty answer`);
    }
    return messageFromPb(resp.message);
  }

  /**
   * markRead raises uid's read position in convId to seq and returns the
   * stored position with the head and the unread count. The position never
   * goes backwards (a lower seq changes nothing) and a seq above the head is
   * clamped to the head; it is durable when the promise resolves. A user's
   * own send moves their position to its seq (unless the server runs with
   * --send-marks-read=false: then mark the seq send returned to keep one's
   * own messages from counting as unread). Any node answers it; retries are
   * harmless (a mark only moves up).
   */
  async markRead(convId: string, uid: bigint | string, seq: bigint | string, opts: CallOptions = {}): Promise<ReadState> {
    const u = toUint64(uid, "uid");
    const s = toUint64(seq, "seq");
    const call: CallInfo = { op: "mark read", subject: `conv_id ${JSON.stringify(convId)} uid ${u} seq ${s}` };
    const resp = await this.withRetry(call, opts, (at) => {
      at.target = this.anyNode();
      return at.target.rpc.markRead({ convId, uid: u, seq: s }, { signal: at.signal });
    });
    return { convId, readSeq: resp.readSeq, headSeq: resp.headSeq, unread: resp.unread };
  }

  /**
   * readState returns uid's read state in each of convIds (1..1000), in the
   * order given; a conversation never written or never marked has zeros.
   * One call, answered by one query on the server.
   */
  async readState(uid: bigint | string, convIds: string[], opts: CallOptions = {}): Promise<ReadState[]> {
    const u = toUint64(uid, "uid");
    const call: CallInfo = { op: "get read state", subject: `uid ${u} (${convIds.length} conversations)` };
    const resp = await this.withRetry(call, opts, (at) => {
      at.target = this.anyNode();
      return at.target.rpc.getReadState({ uid: u, convIds }, { signal: at.signal });
    });
    if (resp.states.length !== convIds.length) {
      throw new SequencerError("internal", `get read state: the server answered ${resp.states.length} states for ${convIds.length} conversations`);
    }
    return resp.states.map((st, i) => ({ convId: convIds[i], readSeq: st.readSeq, headSeq: st.headSeq, unread: st.unread }));
  }

  /**
   * getReadReceipts returns, for each of seqs (1..100, any order) of convId,
   * how many users have read up to it (a stored read position >= seq; the
   * sender included, since a send marks its sender's position). One call,
   * one query on the server; retried like a read.
   */
  async getReadReceipts(convId: string, seqs: (bigint | string)[], opts: CallOptions = {}): Promise<bigint[]> {
    const ss = seqs.map((s) => toUint64(s, "seq"));
    const call: CallInfo = { op: "get read receipts", subject: `conv_id ${JSON.stringify(convId)} (${ss.length} seqs)` };
    const resp = await this.withRetry(call, opts, (at) => {
      at.target = this.anyNode();
      return at.target.rpc.getReadReceipts({ convId, seqs: ss }, { signal: at.signal });
    });
    if (resp.readBy.length !== ss.length) {
      throw new SequencerError("internal", `get read receipts: the server answered ${resp.readBy.length} counts for ${ss.length} seqs`);
    }
    return resp.readBy;
  }

  /**
   * listReadPositions returns a page of convId's read positions with uid >
   * afterUid, ascending by uid (limit 0 = 100, clamped to 1,000 by the
   * server), and whether more follow (ask again from the last uid).
   */
  async listReadPositions(convId: string, afterUid: bigint | string = 0n, limit = 0, opts: CallOptions = {}): Promise<{ positions: ReadPosition[]; hasMore: boolean }> {
    const after = toUint64(afterUid, "after_uid");
    const call: CallInfo = { op: "list read positions", subject: `conv_id ${JSON.stringify(convId)} after uid ${after}` };
    const resp = await this.withRetry(call, opts, (at) => {
      at.target = this.anyNode();
      return at.target.rpc.listReadPositions({ convId, afterUid: after, limit }, { signal: at.signal });
    });
    return { positions: resp.positions.map((p) => ({ uid: p.uid, readSeq: p.readSeq })), hasMore: resp.hasMore };
  }

  /** route asks a node who owns convId now, and remembers the answer for later sends. */
  async route(convId: string, opts: CallOptions = {}): Promise<Route> {
    return this.withRetry({ op: "route", subject: `conv_id ${JSON.stringify(convId)}` }, opts, async (at) => {
      at.target = this.anyNode();
      const [r] = await this.askRoute(at.target, convId, at.signal);
      return r;
    });
  }

  private async askRoute(asked: Node, convId: string, signal: AbortSignal): Promise<[Route, Node | undefined]> {
    const m = await asked.rpc.route({ convId }, { signal });
    const r: Route = { nodeId: m.nodeId, address: m.address, partition: m.partition, epoch: m.epoch, membershipVersion: m.membershipVersion };
    const owner = this.nodeAt(ownerURL(r.address, asked.url));
    const cached = this.routes.learn(convId, r.partition, { node: owner, nodeId: r.nodeId, epoch: r.epoch, membershipVersion: r.membershipVersion });
    this.debug("route learned", { convId, partition: r.partition, owner: r.nodeId, address: r.address, epoch: r.epoch, via: asked.url });
    return [r, cached];
  }

  // sharedRoute asks Route once for all the sends of convId that miss the
  // cache at the same time (so a burst of one conversation is enqueued in
  // call order); each waiter still ends with its own signal. It returns the
  // node asked and the owner node.
  private sharedRoute(asked: Node, convId: string, signal: AbortSignal): Promise<[Node, Node | undefined]> {
    let shared = this.routing.get(convId);
    if (!shared) {
      const mine = this.askRoute(asked, convId, AbortSignal.timeout(this.retry.attemptTimeoutMs))
        .then(([, owner]): [Node, Node | undefined] => [asked, owner])
        .catch((err: unknown) => {
          throw new RouteFailed(asked, err);
        })
        .finally(() => this.routing.delete(convId));
      this.routing.set(convId, mine);
      shared = mine;
    }
    const wait = shared;
    return new Promise((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      wait.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
      if (signal.aborted) {
        onAbort();
        return;
      }
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  // sendTarget picks the node a send attempt goes to: the cached owner of
  // convId; else the owner a Route answer names; else the node that answered
  // Route (it forwards); else any reachable entry node.
  private async sendTarget(convId: string, signal: AbortSignal): Promise<Node> {
    const now = Date.now();
    if (this.opts.disableRouting || now < this.routingOffUntil) {
      return this.anyNode();
    }
    const cached = this.routes.lookup(convId);
    if (cached && !cached.down(now)) {
      return cached;
    }
    let asked = this.anyNode();
    try {
      let owner: Node | undefined;
      [asked, owner] = await this.sharedRoute(asked, convId, signal);
      return owner && !owner.down(Date.now()) ? owner : asked;
    } catch (caught) {
      if (signal.aborted) {
        throw caught;
      }
      let err = caught;
      if (caught instanceof RouteFailed) {
        asked = caught.asked;
        err = caught.cause;
      }
      const f = classify(err, false);
      if (f.code === "invalid_argument") {
        throw err;
      }
      if ((err as { code?: unknown }).code === 12 /* unimplemented */) {
        this.routingOffUntil = Date.now() + 60_000;
        return asked;
      }
      if (f.transport) {
        this.noteFailure(asked, convId, f);
        return this.anyNode(asked);
      }
      // Route is only a shortcut: the node forwards the send itself.
      return asked;
    }
  }

  // watchRoute guards one send attempt of convId to target: every
  // routeCheckMs without an answer it asks another node for the owner
  // (checkRoute: the attempts of one conversation share one Route call), and
  // aborts the returned signal with RouteMoved when the owner cached for
  // convId is now a reachable node other than target. stop ends the guard.
  private watchRoute(convId: string, target: Node, signal: AbortSignal): { signal: AbortSignal; stop: () => void } {
    const every = this.retry.routeCheckMs;
    if (this.opts.disableRouting || Date.now() < this.routingOffUntil) {
      return { signal, stop: () => {} };
    }
    const ac = new AbortController();
    const onAbort = () => ac.abort(signal.reason);
    if (signal.aborted) {
      onAbort();
    } else {
      signal.addEventListener("abort", onAbort, { once: true });
    }
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const check = async () => {
      const owner = await this.checkRoute(convId, target);
      if (stopped) {
        return;
      }
      if (owner && owner !== target && !owner.down(Date.now())) {
        this.debug("owner moved while an attempt waited", { convId, attemptNode: target.url, owner: owner.url });
        ac.abort(new RouteMoved(`the owner of ${JSON.stringify(convId)} is ${owner.url}, not ${target.url} where this attempt waits`));
        return;
      }
      timer = setTimeout(check, every);
    };
    timer = setTimeout(check, every);
    return {
      signal: ac.signal,
      stop: () => {
        stopped = true;
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
      },
    };
  }

  // checkRoute asks a node other than avoid who owns convId now, or shares
  // the answer of such a call that is running or ended less than
  // routeCheckMs ago; it resolves with the owner then cached (undefined when
  // unknown or the call failed).
  private checkRoute(convId: string, avoid: Node): Promise<Node | undefined> {
    let shared = this.checks.get(convId);
    if (!shared) {
      const every = this.retry.routeCheckMs;
      const mine: Promise<Node | undefined> = this.askRoute(this.anyNode(avoid), convId, AbortSignal.timeout(every))
        .then(([, owner]) => owner, () => undefined)
        .finally(() => {
          setTimeout(() => {
            if (this.checks.get(convId) === mine) {
              this.checks.delete(convId);
            }
          }, every).unref();
        });
      this.checks.set(convId, mine);
      shared = mine;
    }
    return shared;
  }

  private anyNode(avoid?: Node): Node {
    const now = Date.now();
    const n = this.seeds.length;
    const start = this.rr++ % n;
    let fallback: Node | undefined;
    for (let i = 0; i < n; i++) {
      const s = this.seeds[(start + i) % n];
      if (s === avoid && n > 1) {
        continue;
      }
      if (!s.down(now)) {
        return s;
      }
      if (!fallback || s.downUntil < fallback.downUntil) {
        fallback = s;
      }
    }
    return fallback ?? this.seeds[0];
  }

  private nodeAt(url: string): Node | undefined {
    if (url === "") {
      return undefined;
    }
    const seed = this.seeds.find((s) => s.url === url);
    if (seed) {
      return seed;
    }
    let n = this.learned.get(url);
    if (!n) {
      if (this.learned.size >= 1024) {
        for (const old of this.learned.values()) {
          this.routes.forgetNode(old);
          old.close();
        }
        this.learned.clear();
      }
      n = this.newNode(url, false);
      this.learned.set(url, n);
    }
    return n;
  }

  private noteFailure(target: Node | undefined, convId: string | undefined, f: Failure): void {
    if (f.moved) {
      return; // the new owner was just learned: keep it
    }
    if (f.transport && target) {
      target.downUntil = Date.now() + this.retry.maxBackoffMs;
      const dropped = this.routes.forgetNode(target);
      this.debug("node unreachable, routes dropped", { node: target.url, partitions: dropped });
    } else if ((f.timeout || f.code === "unavailable") && convId) {
      this.routes.forgetConv(convId);
    }
  }

  private backoff(attempt: number): number {
    return backoffMs(attempt, this.retry.baseBackoffMs, this.retry.maxBackoffMs);
  }

  // withRetry runs attempts until one succeeds, a failure is not retryable,
  // or the budget (maxAttempts, deadlineMs, the caller's signal) runs out.
  private async withRetry<T>(call: CallInfo, opts: CallOptions, attempt: (at: Attempt) => Promise<T>): Promise<T> {
    const fail = (code: ErrorCode, msg: string, cause: unknown, attempts: number) =>
      new SequencerError(code, msg, { cause, attempts, clientMsgId: call.clientMsgId });
    if (this.closed) {
      throw fail("canceled", `${call.op} ${call.subject}: client closed`, undefined, 0);
    }
    const r = this.retry;
    const caller = opts.signal;
    const budgetEnd = Date.now() + r.deadlineMs;
    let prev: { err: unknown; f: Failure } | undefined;
    for (let n = 1; ; n++) {
      const left = budgetEnd - Date.now();
      const ac = new AbortController();
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        ac.abort(new Error(`attempt timed out after ${Math.min(r.attemptTimeoutMs, left)} ms`));
      }, Math.max(0, Math.min(r.attemptTimeoutMs, left)));
      const onCaller = () => ac.abort(caller?.reason);
      caller?.addEventListener("abort", onCaller, { once: true });
      if (caller?.aborted) {
        onCaller();
      }
      const at: Attempt = { signal: ac.signal };
      let err: unknown;
      try {
        return await attempt(at);
      } catch (e) {
        err = e;
      } finally {
        clearTimeout(timer);
        caller?.removeEventListener("abort", onCaller);
      }
      if (caller?.aborted) {
        const code: ErrorCode = caller.reason instanceof DOMException && caller.reason.name === "TimeoutError" ? "deadline_exceeded" : "canceled";
        const count = n > 1 ? ` (${n} attempts)` : "";
        throw fail(code, `${call.op} ${call.subject}${count}: ${code}: the caller's signal aborted`, err, n);
      }
      let f = classify(err, timedOut);
      this.noteFailure(at.target, call.convId, f);
      const budgetSpent = Date.now() >= budgetEnd;
      if (budgetSpent && f.timeout) {
        // The client's own budget ran out during this attempt: report the
        // retryable failure that spent it.
        if (prev) {
          err = prev.err;
          f = prev.f;
        } else {
          f = { ...f, code: "unavailable" };
        }
      }
      prev = { err, f };
      const giveUp = (why: string) => {
        const detail = errorDetail(err, call.subject);
        const count = n > 1 ? ` (${n} attempts${why ? ", " + why : ""})` : "";
        this.debug("call failed", { op: call.op, convId: call.convId, attempts: n, code: f.code });
        return fail(f.code, `${call.op} ${call.subject}${count}: ${f.code}: ${detail}`, err, n);
      };
      if (!f.retry) {
        throw giveUp("");
      }
      if (budgetSpent) {
        throw giveUp(`retry budget ${r.deadlineMs} ms spent`);
      }
      if (r.maxAttempts > 0 && n >= r.maxAttempts) {
        throw giveUp("max attempts reached");
      }
      const wait = f.moved ? 0 : this.backoff(n); // moved: the owner is known, no reason to wait
      if (Date.now() + wait >= budgetEnd) {
        throw giveUp(`retry budget ${r.deadlineMs} ms would be spent`);
      }
      this.debug("retrying", { op: call.op, convId: call.convId, attempt: n, code: f.code, backoffMs: wait });
      const stop = new AbortController();
      const onStop = () => stop.abort();
      caller?.addEventListener("abort", onStop, { once: true });
      await sleep(wait, stop.signal);
      caller?.removeEventListener("abort", onStop);
    }
  }
}

/** A shared Route request failed; cause is its error. */
// errorDetail is the last attempt's error as the end of a SequencerError's
// message: a ConnectError's own message without the "[code] " that
// ConnectError.message adds (the code is already in the message), and
// without the subject when the server's message starts with it, so no part
// is said twice ("get message msg_id 1: not_found: not found").
export function errorDetail(err: unknown, subject: string): string {
  let detail = err instanceof ConnectError ? err.rawMessage : err instanceof Error ? err.message : String(err);
  if (subject && detail.startsWith(subject + ": ")) {
    detail = detail.slice(subject.length + 2);
  }
  return detail;
}

class RouteFailed extends Error {
  constructor(readonly asked: Node, override readonly cause: unknown) {
    super("route failed", { cause });
  }
}

/** One attempt of a call: its signal, and the node it talked to last. */
interface Attempt {
  signal: AbortSignal;
  target?: Node;
}
