// C16: a send retrying while its node restarts on the same address (same
// embedded store) succeeds once, with contiguous seqs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { SequencerClient } from "../src/index.js";
import { NodeProc } from "./harness.js";

test("C16 a send retrying across a node restart on the same address succeeds once", async () => {
  const dir = mkdtempSync(join(tmpdir(), "seq-ts-restart-"));
  const args = ["--store", join(dir, "db"), "--node-id", "r1"];
  const first = new NodeProc("first", args);
  const addr = await first.started();
  let second: NodeProc | undefined;
  const c = new SequencerClient({ addrs: [addr], retry: { maxBackoffMs: 200 } });
  try {
    const before = await c.send({ convId: "ts:c16", fromUid: 1n, body: "before" });
    assert.equal(before.seq, 1n);
    await first.kill("SIGKILL");
    const during = c.send({ convId: "ts:c16", fromUid: 1n, body: "during" }); // retries: connection refused
    // The node comes back on the same address (a later --listen wins).
    second = new NodeProc("second", [...args, "--listen", addr]);
    await second.started();
    const res = await during;
    assert.equal(res.seq, 2n);
    assert.equal(res.duplicate, false);
    const page = await c.pull("ts:c16", 0n);
    assert.deepEqual(page.messages.map((m) => m.seq), [1n, 2n]);
  } finally {
    c.close();
    await first.kill();
    await second?.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
});
