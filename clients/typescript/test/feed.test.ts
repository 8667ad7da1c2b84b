// C27: subscribe resumes across a node that is killed and started again on
// the same address (same embedded store): every stored message once, in
// order. C28: pullLatest pages backwards, pullMany answers many at once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { SequencerClient, SequencerError, type FeedEvent } from "../src/index.js";
import { NodeProc, waitFor } from "./harness.js";

test("C27 subscribe: backlog then live, resumed across a kill -9 and a restart", { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "seq-ts-feed-"));
  const args = ["--store", join(dir, "db"), "--node-id", "f1"];
  const first = new NodeProc("first", args);
  const addr = await first.started();
  let second: NodeProc | undefined;
  const c = new SequencerClient({ addrs: [addr], retry: { maxBackoffMs: 200 } });
  const stop = new AbortController();
  const got: string[] = [];
  try {
    for (let i = 0; i < 3; i++) {
      await c.send({ convId: "ts:c17", fromUid: 1n, body: "x" });
    }
    const loop = (async () => {
      for await (const ev of c.subscribe([{ convId: "ts:c17", afterSeq: 1n }, { convId: "ts:c17b", afterSeq: 0n }], { signal: stop.signal })) {
        const e: FeedEvent = ev;
        if (e.message) {
          got.push(`${e.message.convId}:${e.message.seq}`);
        }
      }
    })();
    await waitFor("the backlog", () => got.length >= 2);
    await c.send({ convId: "ts:c17b", fromUid: 1n, body: "live" });
    await waitFor("a live message", () => got.length >= 3);
    await first.kill("SIGKILL");
    second = new NodeProc("second", [...args, "--listen", addr]);
    await second.started();
    await c.send({ convId: "ts:c17", fromUid: 1n, body: "after" });
    await c.send({ convId: "ts:c17b", fromUid: 1n, body: "after" });
    await waitFor("the messages after the restart", () => got.length >= 5, 60_000);
    stop.abort();
    await loop;
    assert.deepEqual(got.filter((g) => g.startsWith("ts:c17:")), ["ts:c17:2", "ts:c17:3", "ts:c17:4"]);
    assert.deepEqual(got.filter((g) => g.startsWith("ts:c17b:")), ["ts:c17b:1", "ts:c17b:2"]);
    // A bad request is final.
    await assert.rejects(
      (async () => {
        for await (const _ of c.subscribe([{ convId: "a", afterSeq: 0n }, { convId: "a", afterSeq: 0n }])) {
          // nothing comes
        }
      })(),
      (e: unknown) => e instanceof SequencerError && e.code === "invalid_argument",
    );
  } finally {
    stop.abort();
    c.close();
    await first.kill();
    await second?.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
});

test("C28 pullLatest pages backwards; pullMany answers many conversations at once", async () => {
  const dir = mkdtempSync(join(tmpdir(), "seq-ts-pages-"));
  const n = new NodeProc("pages", ["--store", join(dir, "db"), "--node-id", "p1"]);
  const addr = await n.started();
  const c = new SequencerClient({ addrs: [addr] });
  try {
    for (let i = 0; i < 7; i++) {
      await c.send({ convId: "ts:c18", fromUid: 1n, body: "x" });
    }
    const p = await c.pullLatest("ts:c18", 0n, 3);
    assert.deepEqual(p.messages.map((m) => m.seq), [5n, 6n, 7n]);
    assert.equal(p.hasMore, true);
    const p2 = await c.pullLatest("ts:c18", p.messages[0].seq, 10);
    assert.deepEqual(p2.messages.map((m) => m.seq), [1n, 2n, 3n, 4n]);
    assert.equal(p2.hasMore, false);
    const pages = await c.pullMany([{ convId: "ts:none", afterSeq: 0n }, { convId: "ts:c18", afterSeq: 5n }]);
    assert.equal(pages.length, 2);
    assert.equal(pages[0].messages.length, 0);
    assert.deepEqual(pages[1].messages.map((m) => m.seq), [6n, 7n]);
    assert.equal(pages[1].headSeq, 7n);
  } finally {
    c.close();
    await n.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
});
