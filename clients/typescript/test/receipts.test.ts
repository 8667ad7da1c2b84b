// C29: read receipts (getReadReceipts, listReadPositions) and live read
// ticks (subscribe with readPositions) against a real node.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { SequencerClient, SequencerError, type ReadPositionChanged } from "../src/index.js";
import { NodeProc, waitFor } from "./harness.js";

test("C29 read receipts count the senders and readers; positions page by uid; read ticks come live", { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "seq-ts-receipts-"));
  const n = new NodeProc("receipts", ["--store", join(dir, "db"), "--node-id", "r1"]);
  const addr = await n.started();
  const c = new SequencerClient({ addrs: [addr] });
  const stop = new AbortController();
  const ticks: ReadPositionChanged[] = [];
  try {
    const loop = (async () => {
      for await (const ev of c.subscribe([{ convId: "ts:c29", afterSeq: 0n }], { signal: stop.signal, readPositions: true })) {
        if (ev.readPosition) {
          ticks.push(ev.readPosition);
        }
      }
    })();
    // Send until the stream is attached (ticks are live only): the
    // sender's own tick says so.
    let seq = 0n;
    await waitFor("the sender's own tick", async () => {
      seq = (await c.send({ convId: "ts:c29", fromUid: 1001n, body: "x" })).seq;
      await new Promise((r) => setTimeout(r, 100));
      return ticks.some((t) => t.uid === 1001n);
    });
    await c.send({ convId: "ts:c29", fromUid: 1002n, body: "y" });
    await c.markRead("ts:c29", 1003n, seq);
    await waitFor("MarkRead's tick", () => ticks.some((t) => t.uid === 1003n && t.readSeq === seq));
    assert.deepEqual(await c.getReadReceipts("ts:c29", [seq + 1n, seq, seq + 2n]), [1n, 3n, 0n]);
    assert.deepEqual(await c.listReadPositions("ts:c29", 0n, 2), {
      positions: [{ uid: 1001n, readSeq: seq }, { uid: 1002n, readSeq: seq + 1n }],
      hasMore: true,
    });
    assert.deepEqual(await c.listReadPositions("ts:c29", "1002"), { positions: [{ uid: 1003n, readSeq: seq }], hasMore: false });
    await assert.rejects(c.getReadReceipts("ts:c29", []), (e: unknown) => e instanceof SequencerError && e.code === "invalid_argument");
    stop.abort();
    await loop;
  } finally {
    stop.abort();
    c.close();
    await n.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
});
