// Unit cases of docs/CLIENTS.md that need no server.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { Code, ConnectError } from "@connectrpc/connect";

import { backoffMs, ownerURL, SequencerClient } from "../src/client.js";
import { classify, ItemError, AttemptTimeout, RouteMoved } from "../src/errors.js";
import { RouteCache } from "../src/route.js";
import { Batcher, type Pending } from "../src/batcher.js";
import { create } from "@bufbuild/protobuf";
import { SendRequestSchema, SendResponseSchema, type SendRequest, type SendResponse } from "../src/gen/sequencer/v1/sequencer_pb.js";

type Answer = { ok?: SendResponse; error?: { code: string; message: string } };

/** A SendBatch request the fake node holds until the test answers it. */
interface Held {
  convs: string[]; // each item's conversation, in item order
  bodies: string[];
  /** Answers every item ok (seq = its index + 1), or as given: a seq or an error code per item. */
  answer: (each?: Array<{ ok: bigint } | { error: string }>) => void;
  fail: (e: unknown) => void;
  answered: boolean;
}

/** heldNode is a fake BatchRpc whose requests stay in flight until the test answers them. */
function heldNode() {
  const calls: Held[] = [];
  const rpc = (items: SendRequest[]) =>
    new Promise<Answer[]>((resolve, reject) => {
      const h: Held = {
        convs: items.map((i) => i.convId),
        bodies: items.map((i) => new TextDecoder().decode(i.body)),
        answered: false,
        answer: (each) => {
          h.answered = true;
          resolve(items.map((_, i): Answer => {
            const e = each?.[i] ?? { ok: BigInt(i + 1) };
            return "ok" in e ? { ok: create(SendResponseSchema, { seq: e.ok }) } : { error: { code: e.error, message: "refused" } };
          }));
        },
        fail: (e) => {
          h.answered = true;
          reject(e);
        },
      };
      calls.push(h);
    });
  return { calls, rpc, inFlight: () => calls.filter((h) => !h.answered) };
}

/** putter enqueues one item; its promise gives the answer or the error. */
function putter(b: Batcher) {
  const signal = new AbortController().signal;
  return (convId: string, body = convId, size = 1) =>
    new Promise<unknown>((resolve) => {
      const p: Pending = {
        req: create(SendRequestSchema, { convId, body: new TextEncoder().encode(body) }),
        size, done: false,
        resolve: (r) => { p.done = true; resolve(r); },
        reject: (e) => { p.done = true; resolve(e); },
      };
      void b.enqueue(p, signal);
    });
}

/** settle runs every queued microtask (the batcher schedules with microtasks only). */
const settle = () => new Promise((r) => setImmediate(r));

/** mulberry32 is a small seeded PRNG, so a failing schedule can be replayed. */
function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe("unit", () => {
  test("U1 backoff doubles from 20 ms, caps at 1 s, jittered into [d/2, d]", () => {
    for (const [attempt, d] of [[1, 20], [2, 40], [3, 80], [6, 640], [7, 1000], [30, 1000]] as const) {
      for (let i = 0; i < 200; i++) {
        const w = backoffMs(attempt, 20, 1000);
        assert.ok(w >= d / 2 && w <= d, `attempt ${attempt}: ${w} not in [${d / 2}, ${d}]`);
      }
    }
  });

  test("U2 route cache: an older membership view does not replace a newer owner; forget by conversation and by node", () => {
    const c = new RouteCache<string>(2);
    assert.equal(c.learn("a", 1, { node: "n2", nodeId: "n2", epoch: 3n, membershipVersion: 5n }), "n2");
    assert.equal(c.learn("a", 1, { node: "n1", nodeId: "n1", epoch: 9n, membershipVersion: 4n }), "n2", "lagging node ignored");
    assert.equal(c.learn("b", 1, { node: "n3", nodeId: "n3", epoch: 4n, membershipVersion: 5n }), "n3", "same view, newer epoch");
    assert.equal(c.lookup("a"), "n3", "a and b share partition 1");
    c.forgetConv("a");
    assert.equal(c.lookup("b"), undefined);
    c.learn("c", 2, { node: "n3", nodeId: "n3", epoch: 1n, membershipVersion: 6n });
    assert.equal(c.size, 2, "least recently used conversation forgotten");
    assert.equal(c.forgetNode("n3"), 1);
    assert.equal(c.lookup("c"), undefined);
  });

  test("U3 an owner on an unspecified host is reached on the host that answered", () => {
    assert.equal(ownerURL("[::]:7071", "http://10.0.0.5:7070"), "http://10.0.0.5:7071");
    assert.equal(ownerURL("0.0.0.0:7071", "https://seq.example:7070"), "https://seq.example:7071");
    assert.equal(ownerURL(":7071", "http://10.0.0.5:7070"), "http://10.0.0.5:7071");
    assert.equal(ownerURL("10.0.0.7:7071", "http://10.0.0.5:7070"), "http://10.0.0.7:7071");
    assert.equal(ownerURL("", "http://10.0.0.5:7070"), "");
  });

  test("U4 classify: what is retried", () => {
    const reset = new ConnectError("read ECONNRESET", Code.Aborted, undefined, undefined, Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }));
    const cases: [string, unknown, boolean, { code: string; retry: boolean; transport: boolean; timeout: boolean; moved?: boolean }][] = [
      ["answered unavailable", new ConnectError("moving", Code.Unavailable), false, { code: "unavailable", retry: true, transport: false, timeout: false }],
      ["answered resource_exhausted", new ConnectError("full", Code.ResourceExhausted), false, { code: "resource_exhausted", retry: true, transport: false, timeout: false }],
      ["connection reset", reset, false, { code: "unavailable", retry: true, transport: true, timeout: false }],
      ["stream reset (node died)", new ConnectError("http/2 stream closed with error code CANCEL (0x8)", Code.Canceled), false, { code: "unavailable", retry: true, transport: true, timeout: false }],
      ["attempt timer", new Error("aborted"), true, { code: "deadline_exceeded", retry: true, transport: false, timeout: true }],
      ["batch timeout", new AttemptTimeout("no answer"), false, { code: "deadline_exceeded", retry: true, transport: false, timeout: true }],
      ["invalid_argument", new ConnectError("bad", Code.InvalidArgument), false, { code: "invalid_argument", retry: false, transport: false, timeout: false }],
      ["already_exists", new ConnectError("dup", Code.AlreadyExists), false, { code: "already_exists", retry: false, transport: false, timeout: false }],
      ["not_found", new ConnectError("no", Code.NotFound), false, { code: "not_found", retry: false, transport: false, timeout: false }],
      ["internal", new ConnectError("bug", Code.Internal), false, { code: "internal", retry: false, transport: false, timeout: false }],
      ["unauthenticated", new ConnectError("token", Code.Unauthenticated), false, { code: "unauthenticated", retry: false, transport: false, timeout: false }],
      ["batch item unavailable", new ItemError("unavailable", "moving"), false, { code: "unavailable", retry: true, transport: false, timeout: false }],
      ["batch item invalid", new ItemError("invalid_argument", "bad"), false, { code: "invalid_argument", retry: false, transport: false, timeout: false }],
      ["owner moved while waiting", new RouteMoved("moved"), false, { code: "deadline_exceeded", retry: true, transport: false, timeout: true, moved: true }],
    ];
    for (const [name, err, timedOut, want] of cases) {
      assert.deepEqual(classify(err, timedOut), want, name);
    }
  });

  test("U5 config is checked", () => {
    assert.throws(() => new SequencerClient({ addrs: [] }), { code: "invalid_argument" });
    assert.throws(() => new SequencerClient({ addrs: ["nohost"] }), { code: "invalid_argument" });
    assert.throws(() => new SequencerClient({ addrs: ["127.0.0.1:1"], maxBatchItems: 1001 }), { code: "invalid_argument" });
    assert.throws(() => new SequencerClient({ addrs: ["127.0.0.1:1"], retry: { routeCheckMs: 0 } }), { code: "invalid_argument" });
  });

  test("U6 batcher: up to maxBatchesInFlight requests in flight and not one more; queued items go when one returns", async () => {
    const node = heldNode();
    const b = new Batcher(node.rpc, () => assert.fail("no unary Send"), { maxItems: 2, maxBytes: 1 << 20, maxInFlight: 3, maxQueuedItems: 100, maxQueuedBytes: 1 << 20, timeoutMs: 60_000 });
    const put = putter(b);
    const bodies = () => node.calls.map((h) => h.bodies);
    const all = [put("a", "a1"), put("b", "b1")];
    await settle();
    assert.deepEqual(bodies(), [["a1", "b1"]], "a synchronous burst shares a request");
    all.push(put("c", "c1"));
    await settle();
    assert.deepEqual(bodies(), [["a1", "b1"], ["c1"]], "a free slot: the next item goes without waiting for the first answer");
    all.push(put("d", "d1"), put("e", "e1"));
    await settle();
    assert.equal(node.inFlight().length, 3);
    all.push(put("f", "f1"), put("g", "g1"), put("h", "h1"));
    await settle();
    assert.equal(node.calls.length, 3, "at the limit the next items queue");
    node.calls[1].answer();
    await settle();
    assert.deepEqual(bodies().slice(3), [["f1", "g1"]], "an answer makes room for one request of what queued (maxItems 2)");
    assert.equal(node.inFlight().length, 3);
    node.calls[0].answer();
    await settle();
    assert.deepEqual(bodies().slice(4), [["h1"]]);
    assert.equal(node.inFlight().length, 3);
    for (const h of node.inFlight()) {
      h.answer();
    }
    const out = await Promise.all(all);
    assert.ok(out.every((r) => typeof (r as { seq?: unknown }).seq === "bigint"), "every item answered");
    assert.equal(node.calls.length, 5);
  });

  test("U6 batcher with maxBatchesInFlight 1: one request in flight, items and bytes bounded, abandoned items skipped, a failed request fails each item", async () => {
    const node = heldNode();
    const b = new Batcher(node.rpc, () => assert.fail("no unary Send"), { maxItems: 3, maxBytes: 250, maxInFlight: 1, maxQueuedItems: 100, maxQueuedBytes: 1 << 20, timeoutMs: 60_000 });
    const put = putter(b);
    // Every item its own conversation: only the limit holds them back.
    const sized = [10, 10, 10, 10, 200, 100];
    const all = sized.map((size, i) => put(`c${i}`, `m${i}`, size));
    const abandoned: Pending = { req: create(SendRequestSchema, { convId: "gone" }), size: 1, done: true, resolve: () => assert.fail("abandoned"), reject: () => assert.fail("abandoned") };
    void b.enqueue(abandoned, new AbortController().signal);
    await settle();
    assert.equal(node.calls.length, 1);
    node.calls[0].answer([{ ok: 1n }, { error: "invalid_argument" }, { ok: 2n }]);
    await settle();
    assert.equal(node.calls.length, 2);
    all.push(put("late", "late"));
    await settle();
    assert.equal(node.calls.length, 2, "a send made while a request is in flight waits for it");
    node.calls[1].answer();
    await settle();
    node.calls[2].answer();
    const out = await Promise.all(all);
    // 3 items max; then 10+200 fit under 250 bytes, 100 does not join them; the late item joins the 100.
    assert.deepEqual(node.calls.map((h) => h.bodies), [["m0", "m1", "m2"], ["m3", "m4"], ["m5", "late"]]);
    assert.ok(out[1] instanceof ItemError && out[1].code === "invalid_argument");
    assert.equal((out[2] as { seq: bigint }).seq, 2n);
    const failed = [put("f1"), put("f2")];
    await settle();
    node.calls[3].fail(new Error("read ECONNRESET"));
    const errs = await Promise.all(failed);
    assert.ok(errs.every((e) => e instanceof Error && /ECONNRESET/.test(e.message)), "a failed request fails each of its items");
  });

  test("U6 batcher order guard: one conversation is never in two requests in flight; its skipped items wait, in order, and go after the answer", async () => {
    const node = heldNode();
    const b = new Batcher(node.rpc, () => assert.fail("no unary Send"), { maxItems: 1000, maxBytes: 1 << 20, maxInFlight: 4, maxQueuedItems: 100, maxQueuedBytes: 1 << 20, timeoutMs: 60_000 });
    const put = putter(b);
    const bodies = () => node.calls.map((h) => h.bodies);
    const disjoint = () => {
      const seen = new Set<string>();
      for (const h of node.inFlight()) {
        for (const c of new Set(h.convs)) {
          assert.ok(!seen.has(c), `conversation ${c} in two requests in flight: ${JSON.stringify(bodies())}`);
          seen.add(c);
        }
      }
    };
    const all = [put("x", "x1")];
    await settle();
    all.push(put("x", "x2"), put("y", "y1"), put("x", "x3"), put("z", "z1"));
    await settle();
    disjoint();
    assert.deepEqual(bodies(), [["x1"], ["y1", "z1"]], "x's items skipped while x1 is in flight; the others go");
    all.push(put("y", "y2"));
    await settle();
    all.push(put("w", "w1"));
    await settle();
    disjoint();
    assert.deepEqual(bodies().slice(2), [["w1"]], "skipped items hold back neither the queue nor a free slot");
    node.calls[0].answer();
    await settle();
    disjoint();
    assert.deepEqual(bodies().slice(3), [["x2", "x3"]], "released: x's items go together, in queue order; y2 still waits for y1");
    node.calls[1].answer();
    await settle();
    assert.deepEqual(bodies().slice(4), [["y2"]], "no starvation: y2 goes once y1's request answered");
    for (const h of node.inFlight()) {
      h.answer();
    }
    await Promise.all(all);

    // A conversation cut by the item bound keeps its order too: the rest of
    // it waits for the answer even with free slots.
    const small = heldNode();
    const b2 = new Batcher(small.rpc, () => assert.fail("no unary Send"), { maxItems: 2, maxBytes: 1 << 20, maxInFlight: 4, maxQueuedItems: 100, maxQueuedBytes: 1 << 20, timeoutMs: 60_000 });
    const put2 = putter(b2);
    const more = [put2("a", "a1"), put2("b", "b1"), put2("a", "a2"), put2("c", "c1")];
    await settle();
    assert.deepEqual(small.calls.map((h) => h.bodies), [["a1", "b1"], ["c1"]]);
    small.calls[0].answer();
    await settle();
    assert.deepEqual(small.calls.map((h) => h.bodies).slice(2), [["a2"]]);
    for (const h of small.inFlight()) {
      h.answer();
    }
    await Promise.all(more);
  });

  test("U6 batcher, random schedules: at most maxBatchesInFlight in flight, no conversation in two, each conversation's items sent in queue order, a free slot never left while an item could go, every item answered", async () => {
    for (let seed = 1; seed <= 60; seed++) {
      const rand = mulberry32(seed);
      const pick = (n: number) => Math.floor(rand() * n);
      const maxInFlight = [1, 2, 3, 4][seed % 4];
      const node = heldNode();
      const b = new Batcher(node.rpc, () => assert.fail("no unary Send"), { maxItems: 1 + pick(4), maxBytes: 40, maxInFlight, maxQueuedItems: 1000, maxQueuedBytes: 1 << 20, timeoutMs: 60_000 });
      const signal = new AbortController().signal;
      const queued: Array<{ conv: string; body: string; p: Pending }> = []; // not yet in a request
      const next = new Map<string, number>(); // per conversation: next body number to enqueue
      const sent = new Map<string, number>(); // per conversation: last body number sent
      const answers: Array<Promise<unknown>> = [];
      let seen = 0; // requests checked so far
      const check = () => {
        for (; seen < node.calls.length; seen++) {
          const h = node.calls[seen];
          h.bodies.forEach((body, i) => {
            const [conv, n] = [h.convs[i], Number(body.split("/")[1])];
            const k = queued.findIndex((q) => q.body === body);
            assert.ok(k >= 0, `seed ${seed}: ${body} sent twice`);
            assert.ok(!queued[k].p.done, `seed ${seed}: ${body} sent after it was abandoned`);
            queued.splice(k, 1);
            assert.ok(n > (sent.get(conv) ?? 0), `seed ${seed}: ${body} sent after a later item of ${conv}`);
            assert.ok(!queued.some((q) => q.conv === conv && Number(q.body.split("/")[1]) < n && !q.p.done), `seed ${seed}: ${body} overtook an earlier item of ${conv}`);
            sent.set(conv, n);
          });
        }
        const flying = node.inFlight();
        assert.ok(flying.length <= maxInFlight, `seed ${seed}: ${flying.length} requests in flight`);
        const busy = new Set<string>();
        for (const h of flying) {
          for (const c of new Set(h.convs)) {
            assert.ok(!busy.has(c), `seed ${seed}: ${c} in two requests in flight`);
            busy.add(c);
          }
        }
        if (flying.length < maxInFlight) {
          const ready = queued.find((q) => !q.p.done && !busy.has(q.conv));
          assert.equal(ready, undefined, `seed ${seed}: a free slot while ${ready?.body} could go`);
        }
      };
      for (let step = 0; step < 150; step++) {
        const r = rand();
        if (r < 0.5) {
          for (let k = 1 + pick(4); k > 0; k--) {
            const conv = `c${pick(5)}`;
            const n = (next.get(conv) ?? 0) + 1;
            next.set(conv, n);
            const body = `${conv}/${n}`;
            let p!: Pending;
            answers.push(new Promise((resolve) => {
              p = { req: create(SendRequestSchema, { convId: conv, body: new TextEncoder().encode(body) }), size: 1 + pick(30), done: false, resolve: (x) => { p.done = true; resolve(x); }, reject: (e) => { p.done = true; resolve(e); } };
            }));
            queued.push({ conv, body, p });
            void b.enqueue(p, signal);
          }
        } else if (r < 0.6) {
          const waiting = queued.filter((q) => !q.p.done);
          if (waiting.length > 0) {
            waiting[pick(waiting.length)].p.reject(new Error("abandoned")); // its attempt timed out
          }
        } else {
          const flying = node.inFlight();
          if (flying.length > 0) {
            const h = flying[pick(flying.length)];
            if (rand() < 0.2) {
              h.fail(new Error("read ECONNRESET"));
            } else {
              h.answer();
            }
          }
        }
        await settle();
        check();
      }
      // Answer everything: nothing is left behind.
      for (let guard = 0; node.inFlight().length > 0; guard++) {
        assert.ok(guard < 1000);
        node.inFlight()[0].answer();
        await settle();
        check();
      }
      await Promise.all(answers);
      assert.deepEqual(queued.filter((q) => !q.p.done).map((q) => q.body), [], `seed ${seed}: items never sent`);
    }
  });

  test("U6 maxBatchesInFlight is checked: an integer in 1..64, else invalid_argument", () => {
    for (const bad of [0, -1, 65, 1.5, Number.NaN]) {
      assert.throws(() => new SequencerClient({ addrs: ["127.0.0.1:1"], maxBatchesInFlight: bad }), { code: "invalid_argument", message: /maxBatchesInFlight: must be 1\.\.64/ }, String(bad));
    }
    for (const ok of [undefined, 1, 64]) {
      new SequencerClient({ addrs: ["127.0.0.1:1"], maxBatchesInFlight: ok }).close();
    }
  });

  test("U7 batcher: a node without SendBatch gets unary Sends from then on", async () => {
    let batches = 0;
    let unary = 0;
    const b = new Batcher(async () => {
      batches++;
      throw new ConnectError("unknown method", Code.Unimplemented);
    }, async () => {
      unary++;
      return create(SendResponseSchema, { seq: BigInt(unary) });
    }, { maxItems: 1000, maxBytes: 1 << 20, maxInFlight: 4, maxQueuedItems: 100, maxQueuedBytes: 1 << 20, timeoutMs: 1000 });
    const signal = new AbortController().signal;
    const put = () => new Promise<unknown>((resolve, reject) => {
      void b.enqueue({ req: create(SendRequestSchema, {}), size: 1, done: false, resolve, reject }, signal);
    });
    await Promise.all([put(), put()]);
    await put();
    assert.equal(batches, 1);
    assert.equal(unary, 3);
    assert.ok(b.unsupported);
  });

  test("U8 batcher: a full queue makes enqueue wait for room, or for the signal", async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const b = new Batcher(async (items) => {
      await gate;
      return items.map(() => ({ ok: create(SendResponseSchema, {}) }));
    }, () => assert.fail("no unary Send"), { maxItems: 2, maxBytes: 1 << 20, maxInFlight: 1, maxQueuedItems: 2, maxQueuedBytes: 1 << 20, timeoutMs: 5000 });
    const pend = (): Pending => ({ req: create(SendRequestSchema, {}), size: 1, done: false, resolve: () => {}, reject: () => {} });
    const never = new AbortController().signal;
    await b.enqueue(pend(), never); // goes out (held by the gate)
    await new Promise((r) => setImmediate(r));
    await b.enqueue(pend(), never);
    await b.enqueue(pend(), never); // the queue holds 2 now
    let third = false;
    const waiting = b.enqueue(pend(), never).then(() => (third = true));
    const ac = new AbortController();
    const aborted = b.enqueue(pend(), ac.signal);
    await new Promise((r) => setImmediate(r));
    assert.equal(third, false, "waits while the queue is full");
    ac.abort(new Error("caller gave up"));
    await assert.rejects(aborted, /caller gave up/);
    release();
    await waiting;
    assert.equal(third, true, "queued once the in-flight request returned and made room");
  });
});
