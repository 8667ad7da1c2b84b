// Unit cases of docs/CLIENTS.md that need no server.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { Code, ConnectError } from "@connectrpc/connect";

import { backoffMs, ownerURL, SequencerClient } from "../src/client.js";
import { classify, ItemError, AttemptTimeout } from "../src/errors.js";
import { RouteCache } from "../src/route.js";
import { Batcher, type Pending } from "../src/batcher.js";
import { create } from "@bufbuild/protobuf";
import { SendRequestSchema, SendResponseSchema } from "../src/gen/sequencer/v1/sequencer_pb.js";

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
    const cases: [string, unknown, boolean, { code: string; retry: boolean; transport: boolean; timeout: boolean }][] = [
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
    ];
    for (const [name, err, timedOut, want] of cases) {
      assert.deepEqual(classify(err, timedOut), want, name);
    }
  });

  test("U5 config is checked", () => {
    assert.throws(() => new SequencerClient({ addrs: [] }), { code: "invalid_argument" });
    assert.throws(() => new SequencerClient({ addrs: ["nohost"] }), { code: "invalid_argument" });
    assert.throws(() => new SequencerClient({ addrs: ["127.0.0.1:1"], maxBatchItems: 1001 }), { code: "invalid_argument" });
  });

  test("U6 batcher: one request in flight, items and bytes bounded, abandoned items skipped, a failed request fails each item", async () => {
    const sizes: number[] = [];
    let fail = false;
    const b = new Batcher(async (items) => {
      sizes.push(items.length);
      await new Promise((r) => setTimeout(r, 5));
      if (fail) {
        throw new Error("read ECONNRESET");
      }
      return items.map((_, i) => (i % 2 ? { error: { code: "invalid_argument", message: "odd" } } : { ok: create(SendResponseSchema, { seq: BigInt(i + 1) }) }));
    }, () => assert.fail("no unary Send"), { maxItems: 3, maxBytes: 250, maxQueuedItems: 100, maxQueuedBytes: 1 << 20, timeoutMs: 1000 });
    const signal = new AbortController().signal;
    const put = (size: number) => new Promise<unknown>((resolve) => {
      const p: Pending = { req: create(SendRequestSchema, {}), size, done: false, resolve: (r) => resolve(r), reject: (e) => resolve(e) };
      void b.enqueue(p, signal);
    });
    const all = [put(10), put(10), put(10), put(10), put(200), put(100)];
    const abandoned: Pending = { req: create(SendRequestSchema, {}), size: 1, done: true, resolve: () => assert.fail("abandoned"), reject: () => assert.fail("abandoned") };
    void b.enqueue(abandoned, signal);
    const out = await Promise.all(all);
    // 3 items max; then 10+200 fit under 250 bytes, 100 does not join them.
    assert.deepEqual(sizes, [3, 2, 1]);
    assert.ok(out[1] instanceof ItemError && out[1].code === "invalid_argument");
    fail = true;
    const failed = await Promise.all([put(1), put(1)]);
    assert.ok(failed.every((e) => e instanceof Error && /ECONNRESET/.test(e.message)));
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
    }, { maxItems: 1000, maxBytes: 1 << 20, maxQueuedItems: 100, maxQueuedBytes: 1 << 20, timeoutMs: 1000 });
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
    }, () => assert.fail("no unary Send"), { maxItems: 2, maxBytes: 1 << 20, maxQueuedItems: 2, maxQueuedBytes: 1 << 20, timeoutMs: 5000 });
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
