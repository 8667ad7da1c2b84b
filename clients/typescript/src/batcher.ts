// Per-node batching of sends into SendBatch (docs/CLIENTS.md, "Batching").
import type { SendRequest, SendResponse } from "./gen/sequencer/v1/sequencer_pb.js";
import { AttemptTimeout, ItemError, parseCode } from "./errors.js";

/** One queued send attempt. */
export interface Pending {
  req: SendRequest;
  size: number; // approximate encoded size
  done: boolean; // settled (answered, timed out or abandoned): skip it
  resolve: (r: SendResponse) => void;
  reject: (e: unknown) => void;
}

export type BatchRpc = (items: SendRequest[], signal: AbortSignal) => Promise<Array<{ ok?: SendResponse; error?: { code: string; message: string } }>>;

/**
 * Batcher sends the attempts queued for one node: while one SendBatch to the
 * node is in flight the next attempts wait, and go out together when it
 * returns, at most maxItems items and about maxBytes per request. A call that
 * finds the node idle goes out at the end of the current tick, so sends made
 * in one synchronous burst share a request.
 */
export class Batcher {
  private queue: Pending[] = [];
  private inFlight = false;
  private scheduled = false;

  constructor(
    private readonly rpc: BatchRpc,
    private readonly maxItems: number,
    private readonly maxBytes: number,
    private readonly timeoutMs: number,
  ) {}

  enqueue(p: Pending): void {
    this.queue.push(p);
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
    while (this.queue.length > 0 && out.length < this.maxItems) {
      const p = this.queue[0];
      if (p.done) {
        this.queue.shift();
        continue;
      }
      if (out.length > 0 && bytes + p.size > this.maxBytes) {
        break;
      }
      this.queue.shift();
      out.push(p);
      bytes += p.size;
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
    const timer = setTimeout(() => ac.abort(new Error("SendBatch attempt timed out")), this.timeoutMs);
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
      const err = ac.signal.aborted ? new AttemptTimeout(`SendBatch of ${batch.length} items: no answer in ${this.timeoutMs} ms`, e) : e;
      for (const p of batch) {
        p.reject(err);
      }
    } finally {
      clearTimeout(timer);
      this.inFlight = false;
      if (this.queue.length > 0) {
        this.kick();
      }
    }
  }
}
