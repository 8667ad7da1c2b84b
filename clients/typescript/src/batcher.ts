// Per-node batching of sends into SendBatch (docs/CLIENTS.md, "Batching").
import { Code, ConnectError } from "@connectrpc/connect";
import type { SendRequest, SendResponse } from "./gen/sequencer/v1/sequencer_pb.js";
import { AttemptTimeout, ItemError, parseCode, transportError } from "./errors.js";

/** One queued send attempt. */
export interface Pending {
  req: SendRequest;
  size: number; // what the item counts against the byte bounds
  done: boolean; // settled (answered, timed out or abandoned): skip it
  resolve: (r: SendResponse) => void;
  reject: (e: unknown) => void;
}

export type BatchRpc = (items: SendRequest[], signal: AbortSignal) => Promise<Array<{ ok?: SendResponse; error?: { code: string; message: string } }>>;
export type UnaryRpc = (item: SendRequest, signal: AbortSignal) => Promise<SendResponse>;

export interface BatchLimits {
  maxItems: number; // most items in one request
  maxBytes: number; // about the most bytes in one request
  maxInFlight: number; // most requests in flight at once
  maxQueuedItems: number; // past these an enqueue waits for room
  maxQueuedBytes: number;
  timeoutMs: number; // each request's deadline
}

/** itemSize is what an item counts against the byte bounds (as the Go SDK counts it). */
export function itemSize(req: SendRequest): number {
  return req.body.length + Buffer.byteLength(req.convId) + Buffer.byteLength(req.clientMsgId) + 32;
}

/**
 * Batcher sends the attempts queued for one node as SendBatch requests, at
 * most maxItems items and about maxBytes each, with up to maxInFlight
 * requests in flight. While fewer are in flight, queued attempts go out at
 * the end of the current tick, so sends made in one synchronous burst share
 * a request; at the limit they wait, and the next request to return makes
 * room for the next request.
 *
 * Order guard: the items of one conversation are never in two requests in
 * flight at once. A request skips (leaves queued, in order) every item whose
 * conversation is in a request still in flight, and the items of one
 * conversation it takes go in queue order; the node gives seqs in item
 * order, so attempts of one conversation queued in order get increasing
 * seqs in that order. A request's answer releases its conversations and
 * the queue is scanned again.
 *
 * A full queue makes enqueue wait for room. A node that answers SendBatch
 * unimplemented (an older server) gets every later item as a unary Send.
 */
export class Batcher {
  private queue: Pending[] = [];
  private bytes = 0;
  private inFlight = 0;
  /** Conversations with items in a request in flight. */
  private busy = new Set<string>();
  private scheduled = false;
  private waiters: Array<() => void> = [];
  /** The node has no SendBatch: items go as unary Sends. */
  unsupported = false;

  constructor(
    private readonly rpc: BatchRpc,
    private readonly unary: UnaryRpc,
    private readonly limits: BatchLimits,
  ) {}

  /** enqueue queues p, first waiting for room in a full queue (or signal). */
  async enqueue(p: Pending, signal: AbortSignal): Promise<void> {
    while (this.queue.length > 0 && (this.queue.length >= this.limits.maxQueuedItems || this.bytes + p.size > this.limits.maxQueuedBytes)) {
      await new Promise<void>((resolve, reject) => {
        const onAbort = () => reject(signal.reason);
        if (signal.aborted) {
          onAbort();
          return;
        }
        signal.addEventListener("abort", onAbort, { once: true });
        this.waiters.push(() => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        });
      });
    }
    if (this.unsupported) {
      this.sendEach([p]);
      return;
    }
    this.queue.push(p);
    this.bytes += p.size;
    this.kick();
  }

  private kick(): void {
    if (this.scheduled || this.inFlight >= this.limits.maxInFlight) {
      return;
    }
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      this.flush();
    });
  }

  // flush sends what the queue allows while fewer than maxInFlight requests
  // are in flight.
  private flush(): void {
    if (this.unsupported) {
      this.sendEach(this.drain());
      return;
    }
    while (this.inFlight < this.limits.maxInFlight) {
      const batch = this.take();
      if (batch.length === 0) {
        return;
      }
      void this.send(batch);
    }
  }

  // take removes the next request's items from the queue: in queue order,
  // skipping settled items and the items of busy conversations, up to
  // maxItems and about maxBytes.
  private take(): Pending[] {
    const out: Pending[] = [];
    const rest: Pending[] = [];
    let bytes = 0;
    let removed = false;
    const q = this.queue;
    let i = 0;
    for (; i < q.length; i++) {
      const p = q[i];
      if (p.done) {
        this.bytes -= p.size;
        removed = true;
        continue;
      }
      if (this.busy.has(p.req.convId)) {
        rest.push(p);
        continue;
      }
      if (out.length >= this.limits.maxItems || (out.length > 0 && bytes + p.size > this.limits.maxBytes)) {
        break; // full: this item and every later one wait, so no conversation's order changes
      }
      this.bytes -= p.size;
      removed = true;
      out.push(p);
      bytes += p.size;
    }
    if (removed) {
      this.queue = i < q.length ? rest.concat(q.slice(i)) : rest;
      this.wake();
    }
    return out;
  }

  // drain removes every unsettled item from the queue.
  private drain(): Pending[] {
    const out = this.queue.filter((p) => !p.done);
    this.queue = [];
    this.bytes = 0;
    this.wake();
    return out;
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) {
      w();
    }
  }

  private async send(batch: Pending[]): Promise<void> {
    this.inFlight++;
    const convs = new Set(batch.map((p) => p.req.convId));
    for (const c of convs) {
      this.busy.add(c);
    }
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(new Error("SendBatch attempt timed out")), this.limits.timeoutMs);
    try {
      const results = await this.rpc(batch.map((p) => p.req), ac.signal);
      batch.forEach((p, i) => {
        const r = results[i];
        if (r?.ok) {
          p.resolve(r.ok);
        } else if (r?.error) {
          p.reject(new ItemError(parseCode(r.error.code), r.error.message));
        } else {
          p.reject(new ItemError("internal", `SendBatch answered ${results.length} results for ${batch.length} items`));
        }
      });
    } catch (e) {
      if (e instanceof ConnectError && e.code === Code.Unimplemented && !transportError(e)) {
        // An older node: nothing was stored; these and later items go one by one.
        this.unsupported = true;
        this.sendEach(batch);
      } else {
        const err = ac.signal.aborted ? new AttemptTimeout(`SendBatch of ${batch.length} items: no answer in ${this.limits.timeoutMs} ms`, e) : e;
        for (const p of batch) {
          p.reject(err);
        }
      }
    } finally {
      clearTimeout(timer);
      this.inFlight--;
      for (const c of convs) {
        this.busy.delete(c);
      }
      if (this.queue.length > 0) {
        this.kick();
      }
    }
  }

  private sendEach(items: Pending[]): void {
    for (const p of items) {
      const signal = AbortSignal.timeout(this.limits.timeoutMs);
      this.unary(p.req, signal).then(p.resolve, (e: unknown) =>
        p.reject(signal.aborted ? new AttemptTimeout(`Send: no answer in ${this.limits.timeoutMs} ms`, e) : e));
    }
  }
}
