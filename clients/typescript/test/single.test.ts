// Cases of docs/CLIENTS.md against one real node (embedded store in a temp dir).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";

import { SequencerClient, SequencerError, jsonReplacer, toJSON, MAX_BATCH_ITEMS, MAX_READ_STATE_CONVS, type SendInput, type SendResult } from "../src/index.js";
import { startSingle, type NodeProc } from "./harness.js";

let node: NodeProc;
let stop: () => Promise<void>;

before(async () => {
  ({ node, stop } = await startSingle());
});
after(async () => {
  await stop?.();
});

/** calls records the RPCs a client made: procedure name and SendBatch sizes. */
function recorder() {
  const calls: { method: string; items: number; keys: string[] }[] = [];
  const icpt: Interceptor = (next) => async (req) => {
    const msg = req.message as { items?: { clientMsgId: string }[] };
    calls.push({ method: req.method.name, items: msg.items?.length ?? 0, keys: msg.items?.map((i) => i.clientMsgId) ?? [] });
    return next(req);
  };
  return { calls, icpt, count: (m: string) => calls.filter((c) => c.method === m).length };
}

function client(extra: Partial<ConstructorParameters<typeof SequencerClient>[0]> = {}) {
  return new SequencerClient({ addrs: [node.addr], ...extra });
}

describe("single node", () => {
  test("C01 send, C02 resend: duplicate with the first ids", async () => {
    const c = client();
    try {
      const req: SendInput = { convId: "ts:c01", fromUid: 1001n, clientMsgId: "c01-hello", body: "hi" };
      const first = await c.send(req);
      assert.equal(typeof first.msgId, "bigint");
      assert.equal(typeof first.seq, "bigint");
      assert.equal(first.seq, 1n);
      assert.equal(first.duplicate, false);
      assert.ok(first.msgId > 0n);
      assert.ok(first.serverAt instanceof Date);
      const again = await c.send({ ...req, fromUid: "1001" }); // a decimal string is the same uid
      assert.equal(again.duplicate, true);
      assert.equal(again.msgId, first.msgId);
      assert.equal(again.seq, first.seq);
      assert.equal(again.serverAt?.getTime(), first.serverAt?.getTime());
      assert.equal(await c.getHead("ts:c01"), 1n);
    } finally {
      c.close();
    }
  });

  test("C01 over the Connect protocol (HTTP/2) too", async () => {
    const c = client({ protocol: "connect" });
    try {
      const r = await c.send({ convId: "ts:c01-connect", fromUid: 1n, clientMsgId: "k1", body: "hi" });
      assert.equal(r.seq, 1n);
      assert.equal((await c.send({ convId: "ts:c01-connect", fromUid: 1n, clientMsgId: "k1", body: "hi" })).duplicate, true);
      await assert.rejects(c.getMessage(1n), { code: "not_found" });
    } finally {
      c.close();
    }
  });

  test("C01 with batching disabled: one Send RPC per message", async () => {
    const rec = recorder();
    const c = client({ disableBatching: true, interceptors: [rec.icpt] });
    try {
      const out = await c.sendMany([1, 2, 3].map((i): SendInput => ({ convId: "ts:c01-unary", fromUid: 1n, body: `m${i}` })));
      assert.deepEqual(out.map((o) => (o.ok ? o.result.seq : -1n)).sort(), [1n, 2n, 3n]);
      assert.equal(rec.count("Send"), 3);
      assert.equal(rec.count("SendBatch"), 0);
    } finally {
      c.close();
    }
  });

  test("C03 a lost answer is retried with the same generated key and stored once", async () => {
    let lose = 1;
    const lossy: Interceptor = (next) => async (req) => {
      const res = await next(req); // the node stored it ...
      if (req.method.name === "SendBatch" && lose-- > 0) {
        // ... and the answer is lost on the way back.
        throw new ConnectError("read ECONNRESET", Code.Unavailable, undefined, undefined, Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }));
      }
      return res;
    };
    const rec = recorder();
    const c = client({ interceptors: [lossy, rec.icpt] });
    try {
      const res = await c.send({ convId: "ts:c03", fromUid: 7n, body: "once" });
      assert.equal(res.duplicate, true, "the retry finds the first attempt stored");
      assert.equal(res.seq, 1n);
      const batches = rec.calls.filter((x) => x.method === "SendBatch");
      assert.equal(batches.length, 2);
      assert.equal(batches[0].keys[0], batches[1].keys[0], "same client_msg_id on the retry");
      assert.equal(batches[0].keys[0], res.clientMsgId);
      const page = await c.pull("ts:c03", 0n);
      assert.equal(page.messages.length, 1);
      assert.equal(page.headSeq, 1n);
    } finally {
      c.close();
    }
  });

  test("C04 an invalid item: typed error, not retried", async () => {
    const rec = recorder();
    const c = client({ interceptors: [rec.icpt] });
    try {
      await assert.rejects(c.send({ convId: "ts:c04", fromUid: 0n, clientMsgId: "k", body: "x" }), (e: unknown) => {
        assert.ok(e instanceof SequencerError);
        assert.equal(e.code, "invalid_argument");
        assert.equal(e.attempts, 1);
        assert.equal(e.clientMsgId, "k");
        assert.match(e.message, /from_uid/);
        return true;
      });
      assert.equal(rec.count("SendBatch"), 1, "not retried");
      assert.equal(await c.getHead("ts:c04"), 0n, "no seq consumed");
      // A body above the limit is invalid_argument too, never retryable.
      await assert.rejects(c.send({ convId: "ts:c04", fromUid: 1n, body: new Uint8Array(65_537) }), { code: "invalid_argument" });
      // JS numbers are refused for ids: they would round above 2^53. What
      // protobuf cannot encode fails before anything is sent (0 attempts),
      // and never fails the other items of a burst.
      const before = rec.count("SendBatch");
      const burst = await c.sendMany([
        { convId: "ts:c04", fromUid: 5 as unknown as bigint, body: "x" },
        { convId: "ts:c04", fromUid: -1n, body: "x" },
        { convId: "ts:c04", fromUid: 1n << 64n, body: "x" },
        { convId: "ts:c04", fromUid: 1n, msgType: 1.5, body: "x" },
        { convId: "ts:c04", fromUid: 1n, body: 42 as unknown as string },
        { convId: 7 as unknown as string, fromUid: 1n, body: "x" },
        { convId: "ts:c04", fromUid: 1n, clientMsgId: "c04-ok", body: "fine" },
      ]);
      assert.deepEqual(burst.map((o) => (o.ok ? "ok" : `${o.error.code}/${o.error.attempts}`)),
        ["invalid_argument/0", "invalid_argument/0", "invalid_argument/0", "invalid_argument/0", "invalid_argument/0", "invalid_argument/0", "ok"]);
      assert.equal(rec.count("SendBatch") - before, 1, "only the good item was sent");
      await assert.rejects(c.pull("ts:c04", 0n, -1), { code: "invalid_argument" });
    } finally {
      c.close();
    }
  });

  test("C05 already_exists and C06 not_found are not retried", async () => {
    const rec = recorder();
    const c = client({ interceptors: [rec.icpt] });
    try {
      await c.send({ convId: "ts:c05a", fromUid: 5n, clientMsgId: "c05", body: "a" });
      await assert.rejects(c.send({ convId: "ts:c05b", fromUid: 5n, clientMsgId: "c05", body: "a" }), { code: "already_exists", attempts: 1 });
      assert.equal(rec.count("SendBatch"), 2);
      await assert.rejects(c.getMessage("123456789012345678"), { code: "not_found", attempts: 1 });
      assert.equal(rec.count("GetMessage"), 1);
      // The message says the code once and the subject once.
      await assert.rejects(c.getMessage(1n), (e: SequencerError) => {
        assert.equal(e.message, "get message msg_id 1: not_found: not found");
        return true;
      });
    } finally {
      c.close();
    }
  });

  test("C07 pull: ascending, contiguous, head and hasMore; ids survive 2^53", async () => {
    const c = client();
    try {
      const n = 5;
      for (let i = 0; i < n; i++) {
        await c.send({ convId: "ts:c07", fromUid: 9_007_199_254_740_993n, body: `m${i}` }); // 2^53 + 1
      }
      const page = await c.pull("ts:c07", 1n, 2);
      assert.deepEqual(page.messages.map((m) => m.seq), [2n, 3n]);
      assert.equal(page.headSeq, 5n);
      assert.equal(page.hasMore, true);
      assert.equal(page.messages[0].fromUid, 9_007_199_254_740_993n);
      assert.equal(new TextDecoder().decode(page.messages[0].body), "m1");
      const rest = await c.pull("ts:c07", "3");
      assert.deepEqual(rest.messages.map((m) => m.seq), [4n, 5n]);
      assert.equal(rest.hasMore, false);
      const one = await c.getMessage(rest.messages[1].msgId);
      assert.equal(one.seq, 5n);
      assert.equal(one.convId, "ts:c07");
      // Results print as JSON: ids as decimal strings (past 2^53 exact), bodies base64.
      assert.throws(() => JSON.stringify(one), /BigInt/);
      const printed = JSON.parse(toJSON(page)) as { headSeq: string; messages: { fromUid: string; seq: string; body: string }[] };
      assert.equal(printed.headSeq, "5");
      assert.equal(printed.messages[0].fromUid, "9007199254740993");
      assert.equal(printed.messages[0].seq, "2");
      assert.equal(Buffer.from(printed.messages[0].body, "base64").toString(), "m1");
      assert.equal(JSON.parse(JSON.stringify(one, jsonReplacer)).msgId, one.msgId.toString());
    } finally {
      c.close();
    }
  });

  test("C08 batch: mixed valid and invalid items, per-item results, seqs in item order", async () => {
    const rec = recorder();
    const c = client({ interceptors: [rec.icpt] });
    try {
      const items: SendInput[] = [
        { convId: "ts:c08", fromUid: 1n, clientMsgId: "c08-0", body: "a" },
        { convId: "ts:c08", fromUid: 1n, clientMsgId: "", body: "generated key" },
        { convId: "ts:c08", fromUid: 0n, clientMsgId: "c08-2", body: "bad uid" },
        { convId: "ts:c08", fromUid: 1n, clientMsgId: "c08-3", body: "b" },
        { convId: "ts:c08-other", fromUid: 1n, clientMsgId: "k".repeat(65), body: "key too long" },
        { convId: "ts:c08-other", fromUid: 1n, clientMsgId: "c08-5", body: "c" },
      ];
      // Routes are known (as in a running client), so the burst goes out at once.
      await c.route("ts:c08");
      await c.route("ts:c08-other");
      const out = await c.sendMany(items);
      assert.equal(rec.count("SendBatch"), 1, "one request for the whole burst");
      assert.deepEqual(out.map((o) => o.ok), [true, true, false, true, false, true]);
      const seqs = out.flatMap((o, i) => (o.ok && items[i].convId === "ts:c08" ? [o.result.seq] : []));
      assert.deepEqual(seqs, [1n, 2n, 3n], "increasing in item order, no seq for the bad item");
      const bad = out[2];
      assert.ok(!bad.ok && bad.error instanceof SequencerError && bad.error.code === "invalid_argument");
      const bad2 = out[4];
      assert.ok(!bad2.ok && bad2.error.code === "invalid_argument");
      assert.ok(out[1].ok && out[1].result.clientMsgId.length === 36, "a UUID was generated");
      const page = await c.pull("ts:c08", 0n);
      assert.deepEqual(page.messages.map((m) => new TextDecoder().decode(m.body)), ["a", "generated key", "b"]);
    } finally {
      c.close();
    }
  });

  test("C09 coalescing: up to maxBatchesInFlight (default 4) SendBatch requests in flight per node, one conversation never in two; with 1, sends queue behind the one in flight; each conversation's seqs contiguous and in call order; at most 1000 items per request", async () => {
    // flight watches SendBatch requests between the client and the node:
    // how many are in flight at most, and whether a conversation is in two.
    const flight = { now: 0, max: 0, convs: new Set<string>(), overlaps: [] as string[], holding: false, held: [] as Array<() => void> };
    const watch: Interceptor = (next) => async (req) => {
      if (req.method.name !== "SendBatch") {
        return next(req);
      }
      const convs = new Set((req.message as unknown as { items: { convId: string }[] }).items.map((i) => i.convId));
      for (const c of convs) {
        if (flight.convs.has(c)) {
          flight.overlaps.push(c);
        }
        flight.convs.add(c);
      }
      flight.max = Math.max(flight.max, ++flight.now);
      try {
        if (flight.holding) {
          await new Promise<void>((r) => flight.held.push(r));
        }
        return await next(req);
      } finally {
        flight.now--;
        for (const c of convs) {
          flight.convs.delete(c);
        }
      }
    };
    const releaseAll = () => {
      flight.holding = false;
      for (const r of flight.held.splice(0)) {
        r();
      }
    };
    const tick = () => new Promise((r) => setImmediate(r));
    const until = async (what: string, cond: () => boolean) => {
      for (const end = Date.now() + 5000; !cond(); await new Promise((r) => setTimeout(r, 5))) {
        assert.ok(Date.now() < end, `timed out waiting for ${what}`);
      }
    };
    const batches = (rec: ReturnType<typeof recorder>) => rec.calls.filter((x) => x.method === "SendBatch");

    // maxBatchesInFlight 1: sends to other conversations wait behind the request in flight, then go together.
    const rec1 = recorder();
    const one = client({ maxBatchesInFlight: 1, interceptors: [rec1.icpt, watch] });
    try {
      await Promise.all(Array.from({ length: 11 }, (_, i) => one.route(`ts:c09-one-${i}`)));
      flight.holding = true;
      const first = one.send({ convId: "ts:c09-one-0", fromUid: 1n, body: "first" });
      await until("the first request", () => flight.held.length === 1);
      const more = Array.from({ length: 10 }, (_, i) => one.send({ convId: `ts:c09-one-${i + 1}`, fromUid: 1n, body: `more ${i}` }));
      await tick();
      await tick();
      assert.equal(rec1.count("SendBatch"), 1, "queued behind the in-flight request");
      releaseAll();
      const res = await Promise.all([first, ...more]);
      assert.deepEqual(batches(rec1).map((x) => x.items), [1, 10]);
      assert.ok(res.every((r) => r.seq === 1n));
      assert.equal(flight.max, 1);
    } finally {
      releaseAll();
      one.close();
    }

    // The default: 4 requests in flight, not 5; a conversation in flight waits for its answer.
    flight.max = 0;
    const rec = recorder();
    const c = client({ interceptors: [rec.icpt, watch] });
    try {
      const convs = Array.from({ length: 5 }, (_, i) => `ts:c09-four-${i}`);
      await Promise.all(convs.map((cv) => c.route(cv)));
      flight.holding = true;
      const sent: Array<Promise<SendResult>> = [];
      for (let i = 0; i < 4; i++) {
        sent.push(c.send({ convId: convs[i], fromUid: 1n, body: `${i}` }));
        await until(`request ${i + 1} in flight`, () => flight.held.length === i + 1);
      }
      sent.push(c.send({ convId: convs[4], fromUid: 1n, body: "fifth" }), c.send({ convId: convs[0], fromUid: 1n, body: "again" }));
      await tick();
      await tick();
      assert.equal(rec.count("SendBatch"), 4, "4 in flight: the next sends queue");
      releaseAll();
      const res = await Promise.all(sent);
      assert.deepEqual(res.map((r) => r.seq), [1n, 1n, 1n, 1n, 1n, 2n]);
      assert.equal(flight.max, 4, "4 requests were in flight at once, never 5");
      assert.deepEqual(batches(rec).slice(4).flatMap((x) => x.keys).sort(), [res[4].clientMsgId, res[5].clientMsgId].sort(), "both went after an answer");

      // Many concurrent sends over 64 conversations, in waves across ticks;
      // a wave's 8 conversations differ from the previous waves', so requests overlap.
      const n = 64;
      await Promise.all(Array.from({ length: n }, (_, i) => c.route(`ts:c09-load-${i}`)));
      flight.max = 0;
      const calls: Array<{ conv: number; p: Promise<SendResult> }> = [];
      for (let w = 0; w < 60; w++) {
        for (let i = 0; i < 100; i++) {
          const conv = (w * 8 + (i % 8) + (w >> 3)) % n;
          calls.push({ conv, p: c.send({ convId: `ts:c09-load-${conv}`, fromUid: 2n, body: `${w}/${i}` }) });
        }
        await tick();
      }
      const res2 = await Promise.all(calls.map((x) => x.p));
      for (let conv = 0; conv < n; conv++) {
        const seqs = res2.filter((_, k) => calls[k].conv === conv).map((r) => r.seq);
        assert.deepEqual(seqs, seqs.map((_, k) => BigInt(k + 1)), `conversation ${conv}: seqs contiguous, in call order`);
        assert.equal(await c.getHead(`ts:c09-load-${conv}`), BigInt(seqs.length));
      }
      assert.ok(res2.every((r) => !r.duplicate), "no retries");

      // A burst above the cap: at most 1000 items per request.
      await Promise.all(Array.from({ length: 50 }, (_, i) => c.route(`ts:c09-${i}`)));
      const before = rec.count("SendBatch");
      const big = Array.from({ length: 2 * MAX_BATCH_ITEMS + 500 }, (_, i): SendInput => ({ convId: `ts:c09-${i % 50}`, fromUid: 2n, body: "x" }));
      const out = await c.sendMany(big);
      assert.ok(out.every((o) => o.ok));
      assert.deepEqual(batches(rec).slice(before).map((x) => x.items), [1000, 1000, 500], "each request holds all 50 conversations: one at a time");
      assert.ok(batches(rec).every((x) => x.items <= MAX_BATCH_ITEMS));
      // A burst of one conversation whose route is not cached yet shares one Route and keeps its order.
      const fresh = await c.sendMany(Array.from({ length: 20 }, (): SendInput => ({ convId: "ts:c09-fresh", fromUid: 3n, body: "y" })));
      assert.deepEqual(fresh.map((o) => (o.ok ? o.result.seq : -1n)), Array.from({ length: 20 }, (_, i) => BigInt(i + 1)));
      assert.ok(flight.max <= 4, `${flight.max} requests in flight`);
      assert.deepEqual(flight.overlaps, [], "no conversation in two requests in flight");
    } finally {
      releaseAll();
      c.close();
    }
  });

  test("C10 unavailable and C11 resource_exhausted are retried with the same key", async () => {
    const fail = [Code.Unavailable, Code.ResourceExhausted, Code.Unavailable];
    const flaky: Interceptor = (next) => async (req) => {
      if (req.method.name === "SendBatch" && fail.length > 0) {
        throw new ConnectError("injected", fail.shift()); // answered without storing
      }
      return next(req);
    };
    const rec = recorder();
    const c = client({ interceptors: [rec.icpt, flaky] });
    try {
      const res = await c.send({ convId: "ts:c10", fromUid: 3n, body: "x" });
      assert.equal(res.seq, 1n);
      assert.equal(res.duplicate, false);
      const keys = rec.calls.filter((x) => x.method === "SendBatch").map((x) => x.keys[0]);
      assert.equal(keys.length, 4);
      assert.ok(keys.every((k) => k === res.clientMsgId));
    } finally {
      c.close();
    }
  });

  test("C12 budget: an unreachable cluster fails unavailable after retries; the caller's signal cancels", async () => {
    const dead = new SequencerClient({ addrs: ["127.0.0.1:1"], retry: { deadlineMs: 400, baseBackoffMs: 10, maxBackoffMs: 50 } });
    try {
      await assert.rejects(dead.send({ convId: "ts:c12", fromUid: 1n, body: "x" }), (e: unknown) => {
        assert.ok(e instanceof SequencerError);
        assert.equal(e.code, "unavailable");
        assert.ok(e.attempts > 1, `attempts ${e.attempts}`);
        assert.ok(e.clientMsgId);
        return true;
      });
      const ac = new AbortController();
      const p = dead.send({ convId: "ts:c12", fromUid: 1n, body: "x" }, { signal: ac.signal });
      setTimeout(() => ac.abort(), 30);
      await assert.rejects(p, { code: "canceled" });
      await assert.rejects(dead.getHead("ts:c12", { signal: AbortSignal.timeout(30) }), { code: "deadline_exceeded" });
    } finally {
      dead.close();
    }
    const once = new SequencerClient({ addrs: ["127.0.0.1:1"], retry: { maxAttempts: 3, baseBackoffMs: 1, maxBackoffMs: 2 } });
    try {
      await assert.rejects(once.getHead("x"), { code: "unavailable", attempts: 3 });
    } finally {
      once.close();
    }
  });

  test("C13 an unreachable first address falls back to the next", async () => {
    const c = new SequencerClient({ addrs: ["127.0.0.1:1", node.addr] });
    try {
      for (let i = 0; i < 4; i++) {
        const r = await c.send({ convId: "ts:c13", fromUid: 1n, body: `x${i}` });
        assert.equal(r.seq, BigInt(i + 1));
      }
    } finally {
      c.close();
    }
  });

  test("C17 the bearer token goes on every RPC", async () => {
    const seen: (string | null)[] = [];
    const look: Interceptor = (next) => async (req) => {
      seen.push(req.header.get("Authorization"));
      return next(req);
    };
    const c = client({ token: "s3cret", interceptors: [look] });
    try {
      await c.send({ convId: "ts:c17", fromUid: 1n, body: "x" });
      await c.pull("ts:c17", 0n);
      assert.ok(seen.length >= 3); // Route, SendBatch, Pull
      assert.ok(seen.every((h) => h === "Bearer s3cret"));
    } finally {
      c.close();
    }
  });

  test("C23 read positions: own sends are read, never backwards, clamped, many conversations in order, invalid not retried", async () => {
    const rec = recorder();
    const c = client({ interceptors: [rec.icpt] });
    try {
      let last: SendResult | undefined;
      for (let i = 0; i < 3; i++) {
        last = await c.send({ convId: "ts:c23", fromUid: 1001n, body: "x" });
      }
      const states = await c.readState(1001n, ["ts:c23", "ts:c23-none", "ts:c23"]);
      assert.deepEqual(states, [
        { convId: "ts:c23", readSeq: 3n, headSeq: 3n, unread: 0n },
        { convId: "ts:c23-none", readSeq: 0n, headSeq: 0n, unread: 0n },
        { convId: "ts:c23", readSeq: 3n, headSeq: 3n, unread: 0n },
      ]);
      assert.deepEqual(await c.markRead("ts:c23", 1001n, last!.seq), { convId: "ts:c23", readSeq: 3n, headSeq: 3n, unread: 0n });
      assert.deepEqual(await c.markRead("ts:c23", "1001", 1n), { convId: "ts:c23", readSeq: 3n, headSeq: 3n, unread: 0n }, "never backwards");
      assert.deepEqual(await c.markRead("ts:c23", 1002n, 2n), { convId: "ts:c23", readSeq: 2n, headSeq: 3n, unread: 1n });
      assert.deepEqual(await c.markRead("ts:c23", 1003n, 99n), { convId: "ts:c23", readSeq: 3n, headSeq: 3n, unread: 0n }, "clamped to the head");

      const before = rec.count("MarkRead");
      await assert.rejects(c.markRead("ts:c23", 0n, 1n), { code: "invalid_argument" });
      await assert.rejects(c.markRead("ts:c23", 1n, 2n ** 63n), { code: "invalid_argument" });
      assert.equal(rec.count("MarkRead"), before + 2, "invalid marks are not retried");
      await assert.rejects(c.readState(1n, []), { code: "invalid_argument" });
      const many = Array.from({ length: MAX_READ_STATE_CONVS }, (_, i) => `ts:c23-${i}`);
      await assert.rejects(c.readState(1n, [...many, "one-more"]), { code: "invalid_argument" });
      const all = await c.readState(1n, many);
      assert.equal(all.length, MAX_READ_STATE_CONVS);
      assert.equal(all[999].convId, "ts:c23-999");
    } finally {
      c.close();
    }
  });

  test("C31 edit and recall: events at the next seqs, a resend is a duplicate, refusals not retried, pull shows the target's state", async () => {
    const rec = recorder();
    const c = client({ interceptors: [rec.icpt] });
    try {
      const m = await c.send({ convId: "ts:c31", fromUid: 7n, body: "hi" });
      const e = await c.edit({ convId: "ts:c31", fromUid: 7n, targetMsgId: m.msgId, body: "hi!" });
      assert.equal(e.seq, 2n);
      const again = await c.edit({ convId: "ts:c31", fromUid: "7", clientMsgId: e.clientMsgId, targetMsgId: m.msgId.toString(), body: "hi!" });
      assert.equal(again.duplicate, true);
      assert.equal(again.msgId, e.msgId);
      const before = rec.count("Edit");
      await assert.rejects(c.edit({ convId: "ts:c31", fromUid: 8n, targetMsgId: m.msgId, body: "x" }), { code: "permission_denied" });
      assert.equal(rec.count("Edit"), before + 1, "a refusal is not retried");
      const r = await c.recall({ convId: "ts:c31", fromUid: 8n, targetMsgId: m.msgId, asModerator: true });
      assert.equal(r.seq, 3n);
      await assert.rejects(c.recall({ convId: "ts:c31", fromUid: 7n, targetMsgId: m.msgId }), { code: "failed_precondition" });
      await assert.rejects(c.recall({ convId: "ts:c31-other", fromUid: 7n, targetMsgId: m.msgId }), { code: "not_found" });
      const page = await c.pull("ts:c31", 0n);
      assert.equal(page.headSeq, 3n);
      const [target, edit, recall] = page.messages;
      assert.equal(target.recalled, true);
      assert.equal(target.body.length, 0);
      assert.equal(target.editCount, 1);
      assert.ok(target.editedAt instanceof Date);
      assert.equal(target.kind, "message");
      assert.equal(edit.kind, "edit");
      assert.equal(edit.targetMsgId, m.msgId);
      assert.equal(recall.kind, "recall");
      assert.equal(recall.targetMsgId, m.msgId);
      assert.equal(recall.fromUid, 8n);
    } finally {
      c.close();
    }
  });

  test("C24 a mark read whose answer was lost is retried, harmlessly", async () => {
    let lose = 1;
    const lossy: Interceptor = (next) => async (req) => {
      const res = await next(req); // the node stored the position ...
      if (req.method.name === "MarkRead" && lose-- > 0) {
        // ... and the answer is lost on the way back.
        throw new ConnectError("read ECONNRESET", Code.Unavailable, undefined, undefined, Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }));
      }
      return res;
    };
    const rec = recorder();
    const c = client({ interceptors: [lossy, rec.icpt] });
    try {
      for (let i = 0; i < 4; i++) {
        await c.send({ convId: "ts:c24", fromUid: 1n, body: "x" });
      }
      assert.deepEqual(await c.markRead("ts:c24", 9n, 2n), { convId: "ts:c24", readSeq: 2n, headSeq: 4n, unread: 2n });
      assert.equal(rec.count("MarkRead"), 2);
    } finally {
      c.close();
    }
  });
});
