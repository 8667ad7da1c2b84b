// Routing cases against fake nodes (connect-node's adapter on h2c): Route
// answers chosen by the test.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Http2Server } from "node:http2";
import type { AddressInfo } from "node:net";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import { SequencerClient } from "../src/index.js";
import { SequencerService, SendResponseSchema } from "../src/gen/sequencer/v1/sequencer_pb.js";

let server: Http2Server;
let addr: string;
let routeAnswer: "unimplemented" | string; // an owner address, or no Route at all
let routes = 0;
let batches = 0;
let clientMaxFrameSize: number | undefined; // from the last client connection's SETTINGS
let acceptEncoding: string | null = null; // of the last SendBatch

before(async () => {
  let seq = 0n;
  server = createServer(connectNodeAdapter({
    routes: (router) =>
      router.service(SequencerService, {
        route() {
          routes++;
          if (routeAnswer === "unimplemented") {
            throw new ConnectError("no Route here", Code.Unimplemented);
          }
          return { nodeId: "owner", address: routeAnswer, partition: 7, epoch: 1n, membershipVersion: 1n };
        },
        sendBatch(req, ctx) {
          batches++;
          acceptEncoding = ctx.requestHeader.get("grpc-accept-encoding");
          return { results: req.items.map(() => ({ outcome: { case: "ok" as const, value: create(SendResponseSchema, { msgId: 1n, seq: ++seq }) } })) };
        },
      }),
  }));
  server.on("session", (session) => session.on("remoteSettings", (s) => (clientMaxFrameSize = s.maxFrameSize)));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  addr = `127.0.0.1:${(server.address() as AddressInfo).port}`;
});
after(async () => {
  await new Promise((r) => server.close(r));
});

describe("fake nodes", () => {
  test("C19 an unreachable owner: the send goes through the entry node", async () => {
    routeAnswer = "127.0.0.1:1"; // nothing listens there
    routes = batches = 0;
    const c = new SequencerClient({ addrs: [addr], retry: { baseBackoffMs: 1, maxBackoffMs: 5_000 } });
    try {
      const r = await c.send({ convId: "g:1", fromUid: 1n, body: "x" });
      assert.ok(r.seq > 0n);
      assert.equal(batches, 1, "one batch, on the entry node, after the owner refused the connection");
      // The owner stays avoided: the next send goes to the entry node directly.
      await c.send({ convId: "g:1", fromUid: 1n, body: "y" });
      assert.equal(batches, 2);
    } finally {
      c.close();
    }
  });

  test("connections ask for DATA frames up to 1 MiB (a 2 MB PullMany answer in a few frames, not about 130)", async () => {
    routeAnswer = "unimplemented";
    clientMaxFrameSize = undefined;
    const c = new SequencerClient({ addrs: [addr] });
    try {
      await c.send({ convId: "g:frames", fromUid: 1n, body: "x" });
      assert.equal(clientMaxFrameSize, 1 << 20);
    } finally {
      c.close();
    }
  });

  test("answers are gzipped only when the client asks (gzip option)", async () => {
    routeAnswer = "unimplemented";
    for (const gzip of [false, true]) {
      acceptEncoding = null;
      const c = new SequencerClient({ addrs: [addr], gzip });
      try {
        await c.send({ convId: "g:gzip", fromUid: 1n, body: "x" });
        assert.equal(/\bgzip\b/.test(acceptEncoding ?? ""), gzip, `gzip ${gzip}: grpc-accept-encoding ${acceptEncoding}`);
      } finally {
        c.close();
      }
    }
  });

  test("C20 a node without Route: sends go through the entry nodes, Route is not asked again for a while", async () => {
    routeAnswer = "unimplemented";
    routes = batches = 0;
    const c = new SequencerClient({ addrs: [addr] });
    try {
      for (let i = 0; i < 3; i++) {
        await c.send({ convId: `g:${i}`, fromUid: 1n, body: "x" });
      }
      assert.equal(batches, 3);
      assert.equal(routes, 1);
    } finally {
      c.close();
    }
  });
});

// A fake node of a pretend cluster: answers Route as the test says, stores
// SendBatch items in memory (seq per node) and can hold them, and names a
// membership version in its answers' header.
interface FakeNode {
  addr: string;
  routes: number;
  keys: string[];
  owner?: { address: string; version: bigint };
  view: bigint; // 0n: no header
  hold?: Promise<void>;
  server: Http2Server;
}

async function startFakeNode(): Promise<FakeNode> {
  const f = { routes: 0, keys: [] as string[], view: 0n } as FakeNode;
  let seq = 0n;
  f.server = createServer(connectNodeAdapter({
    routes: (router) =>
      router.service(SequencerService, {
        route() {
          f.routes++;
          if (!f.owner) {
            throw new ConnectError("no Route here", Code.Unimplemented);
          }
          return { nodeId: f.owner.address, address: f.owner.address, partition: 7, epoch: 1n, membershipVersion: f.owner.version };
        },
        async sendBatch(req, ctx) {
          for (const it of req.items) {
            f.keys.push(it.clientMsgId);
          }
          if (f.hold) {
            await f.hold;
          }
          if (f.view > 0n) {
            ctx.responseHeader.set("Sequencer-Membership-Version", String(f.view));
          }
          return { results: req.items.map(() => ({ outcome: { case: "ok" as const, value: create(SendResponseSchema, { msgId: 1n, seq: ++seq }) } })) };
        },
      }),
  }));
  await new Promise<void>((r) => f.server.listen(0, "127.0.0.1", r));
  f.addr = `127.0.0.1:${(f.server.address() as AddressInfo).port}`;
  return f;
}

async function stopFakeNodes(...fs: FakeNode[]): Promise<void> {
  await Promise.all(fs.map((f) => new Promise((r) => f.server.close(r))));
}

async function until(what: string, cond: () => boolean): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!cond()) {
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe("fake cluster", () => {
  test("C25 an answer names a newer membership version: the cached owner of an older view is asked again", async () => {
    const [entry, old, next] = [await startFakeNode(), await startFakeNode(), await startFakeNode()];
    entry.owner = { address: old.addr, version: 1n };
    const c = new SequencerClient({ addrs: [entry.addr] });
    try {
      await c.send({ convId: "g:1", fromUid: 1n, clientMsgId: "k1", body: "x" });
      await c.send({ convId: "g:1", fromUid: 1n, clientMsgId: "k2", body: "x" });
      assert.equal(entry.routes, 1, "cached after the first Route");
      entry.owner = { address: next.addr, version: 2n };
      old.view = 2n; // the old owner forwards and says the view moved on
      await c.send({ convId: "g:1", fromUid: 1n, clientMsgId: "k3", body: "x" });
      const r = await c.send({ convId: "g:1", fromUid: 1n, clientMsgId: "k4", body: "x" });
      assert.deepEqual(old.keys, ["k1", "k2", "k3"]);
      assert.deepEqual(next.keys, ["k4"], "routed again after version 2 was seen");
      assert.equal(r.seq, 1n);
      await c.send({ convId: "g:1", fromUid: 1n, clientMsgId: "k5", body: "x" });
      assert.equal(entry.routes, 2, "the new route is cached");
    } finally {
      c.close();
      await stopFakeNodes(entry, old, next);
    }
  });

  test("C26 a send waiting on a node keeps waiting while Route names it, and goes to the new owner once Route names another", async () => {
    const [entry, old, next] = [await startFakeNode(), await startFakeNode(), await startFakeNode()];
    entry.owner = { address: old.addr, version: 1n };
    const c = new SequencerClient({ addrs: [entry.addr], retry: { attemptTimeoutMs: 60_000, routeCheckMs: 20 } });
    let release!: () => void;
    try {
      await c.send({ convId: "g:1", fromUid: 1n, clientMsgId: "k1", body: "x" });
      old.hold = new Promise<void>((r) => { release = r; });
      let settled = false;
      const pending = c.send({ convId: "g:1", fromUid: 1n, clientMsgId: "k2", body: "x" }).finally(() => { settled = true; });
      await until("k2 held by the old owner", () => old.keys.includes("k2"));
      const before = entry.routes;
      await until("3 route checks", () => entry.routes >= before + 3);
      assert.equal(settled, false, "the send ended while the route still named the node it waits on");
      assert.deepEqual(next.keys, []);
      entry.owner = { address: next.addr, version: 2n };
      const r = await pending;
      assert.equal(r.seq, 1n, "stored by the new owner");
      assert.equal(r.clientMsgId, "k2");
      assert.deepEqual(next.keys, ["k2"]);
      assert.deepEqual(old.keys, ["k1", "k2"]);
    } finally {
      release?.();
      c.close();
      await stopFakeNodes(entry, old, next);
    }
  });
});
