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
        sendBatch(req) {
          batches++;
          return { results: req.items.map(() => ({ outcome: { case: "ok" as const, value: create(SendResponseSchema, { msgId: 1n, seq: ++seq }) } })) };
        },
      }),
  }));
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
