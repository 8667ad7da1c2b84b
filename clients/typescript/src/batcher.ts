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
  maxQueuedItems: number; // past these an enqueue waits for room
  maxQueuedBytes: number;
  timeoutMs: number; // each request's deadline
}

/** itemSize is what an item counts against the byte bounds (as the Go SDK counts it). */
export function itemSize(req: SendRequest): number {
  return req.body.length + Buffer.byteLength(req.convId) + Buffer.byteLength(req.clientMsgId) + 32;
}

/**
 * Batcher sends the attempts queued for one node: while one SendBatch to the
 * node is in flight the next attempts wait, and go out together when it
 * returns, at most maxItems items and about maxBytes per request. A call that
 * finds the node idle goes out at the end of the current tick, so sends made
 * in one synchronous burst share a request. A full queue makes enqueue wait
 * for room. A node that answers SendBatch unimplemented (an older server)
 * gets every later item as a unary Send.
 */
export class Batcher {
  private queue: Pending[] = [];
  private bytes = 0;
  private inFlight = false;
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
    if (this.inFlight || this.scheduled) {
      return;
    }
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      void this.flush();
    });
  }

  private take(): Pending[] {
    const out: Pending[] = [];
    let bytes = 0;
    while (this.queue.length > 0 && out.length < this.limits.maxItems) {
      const p = this.queue[0];
      if (p.done) {
        this.queue.shift();
        this.bytes -= p.size;
        continue;
      }
      if (out.length > 0 && bytes + p.size > this.limits.maxBytes) {
        break;
      }
      this.queue.shift();
      this.bytes -= p.size;
      out.push(p);
      bytes += p.size;
    }
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) {
      w();
    }
    return out;
  }

  private async flush(): Promise<void> {
    if (this.inFlight) {
      return;
    }
    const batch = this.take();
    if (batch.length === 0) {
      return;
    }
    this.inFlight = true;
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
      this.inFlight = false;
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
