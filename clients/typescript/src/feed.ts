// The change feed and catch-up reads of the TypeScript client: subscribe (a
// resuming async iterator), pullMany and pullLatest (docs/CLIENTS.md).
import type { Client } from "@connectrpc/connect";
import { timestampDate } from "@bufbuild/protobuf/wkt";

import { classify, SequencerError } from "./errors.js";
import type { Message as PbMessage, PullResponse, SequencerService } from "./gen/sequencer/v1/sequencer_pb.js";
import type { CallOptions, Message, MessageKindName, PullResult } from "./client.js";

/** One conversation to follow and the highest seq already held (0 for none). */
export interface Cursor {
  convId: string;
  afterSeq: bigint;
}

/** One item of a subscription: a stored message, or a notice that retention removed seqs. */
export type FeedEvent =
  | { message: Message; truncated?: undefined; readPosition?: undefined }
  | { message?: undefined; truncated: { convId: string; oldestSeq: bigint }; readPosition?: undefined }
  | { message?: undefined; truncated?: undefined; readPosition: ReadPositionChanged };

/**
 * A user's read position in a followed conversation changed (MarkRead, or
 * the user's own message): with SubscribeOptions.readPositions only. Keep
 * the highest per (convId, uid): ticks may arrive out of order.
 */
export interface ReadPositionChanged {
  convId: string;
  uid: bigint;
  readSeq: bigint;
}

export interface SubscribeOptions {
  /** Ends the subscription. */
  signal?: AbortSignal;
  /**
   * Also yield the live read-position changes of the followed conversations
   * (readPosition events). Live only: ticks made while no stream is
   * attached (between resumes) are not repeated; read the positions of now
   * with listReadPositions or getReadReceipts after a resume.
   */
  readPositions?: boolean;
}

/** How long a stream may stay silent (the server sends heartbeats every 15 s) before it is taken for dead. */
export const SUBSCRIBE_IDLE_MS = 45_000;

/** What the feed needs of the client (SequencerClient.feedHost). */
export interface FeedHost {
  pick(avoid?: unknown): { rpc: Client<typeof SequencerService> };
  markDown(node: unknown): void;
  retried<T>(op: string, subject: string, opts: CallOptions, f: (rpc: Client<typeof SequencerService>, signal: AbortSignal) => Promise<T>): Promise<T>;
  backoff(attempt: number): number;
  isClosed(): boolean;
}

export function messageFromPb(m: PbMessage): Message {
  return {
    msgId: m.msgId, convId: m.convId, seq: m.seq, fromUid: m.fromUid, msgType: m.msgType, body: m.body,
    clientMsgId: m.clientMsgId, serverAt: m.serverAt ? timestampDate(m.serverAt) : undefined,
    kind: kindNames[m.kind] ?? "message", targetMsgId: m.targetMsgId, recalled: m.recalled,
    editCount: m.editCount, editedAt: m.editedAt ? timestampDate(m.editedAt) : undefined,
  };
}

const kindNames: Record<number, MessageKindName> = { 0: "message", 1: "edit", 2: "recall" };

function pullResult(p: PullResponse): PullResult {
  return { messages: p.messages.map(messageFromPb), headSeq: p.headSeq, hasMore: p.hasMore };
}

/**
 * subscribe yields, per conversation, every stored message above its cursor
 * in seq order, each once, backlog then live; it resumes by itself (at the
 * next node, from the last seq yielded) after a retryable end, a transport
 * break or SUBSCRIBE_IDLE_MS of silence. A final error (invalid_argument,
 * unauthenticated, ...) is thrown as a SequencerError.
 */
export async function* subscribe(host: FeedHost, cursors: Cursor[], opts: SubscribeOptions = {}): AsyncGenerator<FeedEvent> {
  const last = new Map<string, bigint>();
  const order = cursors.map((c) => c.convId); // as given: the server refuses a conversation named twice
  for (const c of cursors) {
    last.set(c.convId, BigInt(c.afterSeq));
  }
  let avoid: unknown;
  let failures = 0;
  while (!opts.signal?.aborted) {
    if (host.isClosed()) {
      throw new SequencerError("canceled", "sequencer client closed");
    }
    const node = host.pick(avoid);
    const ctl = new AbortController();
    const onAbort = () => ctl.abort();
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    let idle = setTimeout(() => ctl.abort(), SUBSCRIBE_IDLE_MS);
    let delivered = false;
    let err: unknown;
    try {
      const req = { cursors: order.map((convId) => ({ convId, afterSeq: last.get(convId)! })), readPositions: opts.readPositions ?? false };
      for await (const ev of node.rpc.subscribe(req, { signal: ctl.signal })) {
        clearTimeout(idle);
        idle = setTimeout(() => ctl.abort(), SUBSCRIBE_IDLE_MS);
        if (ev.event.case === "message") {
          const m = ev.event.value;
          const prev = last.get(m.convId);
          if (prev === undefined || m.seq <= prev) {
            continue;
          }
          if (m.seq !== prev + 1n) {
            throw new SequencerError("unavailable", `subscribe: seq ${m.seq} of ${JSON.stringify(m.convId)} after ${prev}`);
          }
          last.set(m.convId, m.seq);
          delivered = true;
          yield { message: messageFromPb(m) };
        } else if (ev.event.case === "truncated") {
          const t = ev.event.value;
          const prev = last.get(t.convId);
          if (prev === undefined || t.oldestSeq <= prev + 1n) {
            continue;
          }
          last.set(t.convId, t.oldestSeq - 1n);
          delivered = true;
          yield { truncated: { convId: t.convId, oldestSeq: t.oldestSeq } };
        } else if (ev.event.case === "readPosition") {
          const r = ev.event.value;
          if (last.has(r.convId)) {
            yield { readPosition: { convId: r.convId, uid: r.uid, readSeq: r.readSeq } };
          }
        }
      }
      err = new SequencerError("unavailable", "subscribe: the stream ended without a code");
    } catch (e) {
      err = e;
    } finally {
      clearTimeout(idle);
      opts.signal?.removeEventListener("abort", onAbort);
    }
    if (opts.signal?.aborted) {
      return;
    }
    const f = ctl.signal.aborted ? { code: "unavailable" as const, retry: true, transport: true } : classify(err, false);
    if (!f.retry) {
      throw err instanceof SequencerError ? err : new SequencerError(f.code, `subscribe: ${String(err)}`, { cause: err });
    }
    if (f.transport) {
      host.markDown(node);
    }
    failures = delivered ? 1 : failures + 1;
    avoid = node;
    await new Promise((r) => setTimeout(r, host.backoff(failures)));
  }
}

/** pullMany: pages[i] answers cursors[i] (1..1,000), from one store read on the server. */
export function pullMany(host: FeedHost, cursors: Cursor[], limit = 0, maxBytes = 0, opts: CallOptions = {}): Promise<PullResult[]> {
  return host.retried("pull many", `${cursors.length} conversations`, opts, async (rpc, signal) => {
    const resp = await rpc.pullMany({ cursors: cursors.map((c) => ({ convId: c.convId, afterSeq: BigInt(c.afterSeq) })), limit, maxBytes }, { signal });
    if (resp.pages.length !== cursors.length) {
      throw new SequencerError("internal", `pull many: ${resp.pages.length} pages for ${cursors.length} cursors`);
    }
    return resp.pages.map(pullResult);
  });
}

/** pullLatest: the newest limit messages below beforeSeq (0n: from the head), ascending. */
export function pullLatest(host: FeedHost, convId: string, beforeSeq = 0n, limit = 0, opts: CallOptions = {}): Promise<PullResult> {
  const before = beforeSeq === 0n ? 2n ** 64n - 1n : BigInt(beforeSeq);
  return host.retried("pull latest", `conv_id ${JSON.stringify(convId)} before_seq ${before}`, opts, async (rpc, signal) =>
    pullResult(await rpc.pull({ convId, beforeSeq: before, limit }, { signal })));
}
