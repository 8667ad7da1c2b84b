// Cases of docs/CLIENTS.md against a real 2-node cluster sharing a fresh
// PostgreSQL database.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import type { Interceptor } from "@connectrpc/connect";

import { SequencerClient, SequencerError } from "../src/index.js";
import { clusterArgs, freshDatabase, NodeProc, waitFor } from "./harness.js";

let db: { dsn: string; drop: () => void };
let n1: NodeProc;
let n2: NodeProc;

before(async () => {
  db = freshDatabase();
  n1 = new NodeProc("n1", clusterArgs(db.dsn, "n1"));
  await n1.started();
  n2 = new NodeProc("n2", clusterArgs(db.dsn, "n2"));
  await n2.started();
});

after(async () => {
  await Promise.all([n1?.kill(), n2?.kill()]);
  db?.drop();
});

const convs = Array.from({ length: 40 }, (_, i) => `ts:cl-${i}`);

/** Waits until both nodes route convs to both members with a taken lease. */
async function clusterFormed(): Promise<Map<string, string>> {
  const owners = new Map<string, string>();
  for (const addr of [n1.addr, n2.addr]) {
    const c = new SequencerClient({ addrs: [addr] });
    try {
      await waitFor(`both members in ${addr}'s view`, async () => {
        const rs = await Promise.all(convs.map((v) => c.route(v)));
        rs.forEach((r, i) => owners.set(convs[i], r.nodeId));
        return new Set(rs.map((r) => r.nodeId)).size === 2 && rs.every((r) => r.epoch > 0n);
      });
    } finally {
      c.close();
    }
  }
  return owners;
}

describe("2-node cluster", () => {
  test("C14 a send goes straight to the routed owner", async () => {
    const owners = await clusterFormed();
    const hits: string[] = [];
    const look: Interceptor = (next) => async (req) => {
      if (req.method.name === "SendBatch") {
        hits.push(new URL(req.url).host);
      }
      return next(req);
    };
    const c = new SequencerClient({ addrs: [n1.addr], interceptors: [look] }); // one entry node only
    try {
      const onN2 = convs.find((v) => owners.get(v) === "n2")!;
      const onN1 = convs.find((v) => owners.get(v) === "n1")!;
      await c.send({ convId: onN2, fromUid: 1n, body: "to n2" });
      await c.send({ convId: onN1, fromUid: 1n, body: "to n1" });
      assert.deepEqual(hits, [n2.addr, n1.addr]);
    } finally {
      c.close();
    }
  });

  test("C15 a node killed (SIGKILL) mid-load: no error surfaced, every acked message pulled back at its seq", async () => {
    const owners = await clusterFormed();
    assert.ok(convs.some((v) => owners.get(v) === "n2"), "some conversations live on n2");
    const c = new SequencerClient({ addrs: [n1.addr, n2.addr] });
    const acked = new Map<string, { convId: string; seq: bigint; msgId: bigint; body: string }>(); // by client_msg_id
    const errors: unknown[] = [];
    let ackedOnN2AfterKill = 0;
    let dups = 0;
    let killedAt = 0;
    let killed = false;
    let stop = false;
    const worker = async (w: number) => {
      for (let i = 0; !stop; i++) {
        const convId = convs[(w * 7 + i) % convs.length];
        const body = `w${w}-${i}`;
        try {
          const r = await c.send({ convId, fromUid: BigInt(100 + w), body });
          // duplicate: an attempt was stored but its answer lost (the node died
          // under it); the retry with the same key returned the first ids.
          dups += r.duplicate ? 1 : 0;
          acked.set(r.clientMsgId, { convId, seq: r.seq, msgId: r.msgId, body });
          if (killed && owners.get(convId) === "n2") {
            ackedOnN2AfterKill++;
          }
        } catch (e) {
          errors.push(e);
        }
      }
    };
    const workers = Array.from({ length: 16 }, (_, w) => worker(w));
    try {
      await waitFor("200 acks before the kill", () => acked.size >= 200 || errors.length > 0);
      await n2.kill("SIGKILL");
      killed = true;
      killedAt = Date.now();
      // The dead node's conversations move to n1 after its member lease (2s) ends.
      await waitFor("acks in n2's former conversations after the kill", () => ackedOnN2AfterKill >= 50 || errors.length > 0, 60_000);
    } finally {
      stop = true;
      await Promise.all(workers);
    }
    console.log(`C15: ${acked.size} acks, ${dups} answered duplicate after a lost answer, ${ackedOnN2AfterKill} acks in n2's conversations within ${Date.now() - killedAt} ms after the kill`);
    assert.deepEqual(errors.map((e) => (e instanceof SequencerError ? `${e.code}: ${e.message}` : String(e))), [], "no error surfaced");

    const reader = new SequencerClient({ addrs: [n1.addr] });
    try {
      const byConv = new Map<string, Map<bigint, { msgId: bigint; body: string; key: string }>>();
      for (const [key, a] of acked) {
        let m = byConv.get(a.convId);
        if (!m) {
          byConv.set(a.convId, (m = new Map()));
        }
        assert.ok(!m.has(a.seq), `two acks with seq ${a.seq} in ${a.convId}`);
        m.set(a.seq, { msgId: a.msgId, body: a.body, key });
      }
      for (const [convId, want] of byConv) {
        const got: { seq: bigint; msgId: bigint; body: string; key: string }[] = [];
        let afterSeq = 0n;
        for (;;) {
          const page = await reader.pull(convId, afterSeq, 1000);
          for (const m of page.messages) {
            got.push({ seq: m.seq, msgId: m.msgId, body: new TextDecoder().decode(m.body), key: m.clientMsgId });
          }
          if (!page.hasMore || page.messages.length === 0) {
            break;
          }
          afterSeq = page.messages[page.messages.length - 1].seq;
        }
        assert.deepEqual(got.map((m) => m.seq), got.map((_, i) => BigInt(i + 1)), `${convId}: seqs 1..head`);
        assert.equal(new Set(got.map((m) => m.key)).size, got.length, `${convId}: no message stored twice`);
        for (const [seq, w] of want) {
          const m = got[Number(seq) - 1];
          assert.ok(m, `${convId}: acked seq ${seq} missing`);
          assert.equal(m.msgId, w.msgId, `${convId} seq ${seq}: msg_id`);
          assert.equal(m.key, w.key, `${convId} seq ${seq}: client_msg_id`);
          assert.equal(m.body, w.body, `${convId} seq ${seq}: body`);
        }
      }
    } finally {
      reader.close();
      c.close();
    }
  });
});
