// C18: TLS (a private CA via the tls option) and the bearer token, against an
// in-process HTTP/2 TLS server that speaks the sequencer API (connect-node's
// adapter). The sequencer's own --tls-cert/--auth-token-file are tested
// with the server; this case checks the client's side of them.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createSecureServer, type Http2SecureServer } from "node:http2";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import { SequencerClient } from "../src/index.js";
import { SequencerService, SendResponseSchema } from "../src/gen/sequencer/v1/sequencer_pb.js";

let dir: string;
let server: Http2SecureServer;
let addr: string;
let ca: Buffer;
const seenAuth: string[] = [];

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "seq-ts-tls-"));
  execFileSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
    "-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem")], { stdio: "ignore" });
  ca = readFileSync(join(dir, "cert.pem"));
  let seq = 0n;
  const handler = connectNodeAdapter({
    routes: (router) =>
      router.service(SequencerService, {
        route(_req, ctx) {
          check(ctx.requestHeader.get("authorization"));
          return { nodeId: "tls", address: addr, partition: 1, epoch: 1n, membershipVersion: 1n };
        },
        sendBatch(req, ctx) {
          check(ctx.requestHeader.get("authorization"));
          return { results: req.items.map(() => ({ outcome: { case: "ok" as const, value: create(SendResponseSchema, { msgId: 1n << 62n, seq: ++seq }) } })) };
        },
      }),
  });
  server = createSecureServer({ key: readFileSync(join(dir, "key.pem")), cert: ca, allowHTTP1: true }, handler);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  addr = `127.0.0.1:${(server.address() as AddressInfo).port}`;
});

function check(auth: string | null) {
  seenAuth.push(auth ?? "");
  if (auth !== "Bearer t0ken") {
    throw new ConnectError("missing or wrong token", Code.Unauthenticated);
  }
}

after(async () => {
  await new Promise((r) => server.close(r));
  rmSync(dir, { recursive: true, force: true });
});

describe("TLS", () => {
  test("C18 https:// with a private CA and a bearer token", async () => {
    const c = new SequencerClient({ addrs: [`https://${addr}`], tls: { ca }, token: "t0ken" });
    try {
      const r = await c.send({ convId: "g:1", fromUid: 1n, body: "over TLS" });
      assert.equal(r.seq, 1n);
      assert.equal(r.msgId, 1n << 62n);
      assert.ok(seenAuth.length >= 2 && seenAuth.every((a) => a === "Bearer t0ken"));
    } finally {
      c.close();
    }
    const wrongToken = new SequencerClient({ addrs: [`https://${addr}`], tls: { ca }, token: "nope", disableRouting: true });
    try {
      await assert.rejects(wrongToken.send({ convId: "g:1", fromUid: 1n, body: "x" }), { code: "unauthenticated", attempts: 1 });
    } finally {
      wrongToken.close();
    }
    const untrusted = new SequencerClient({ addrs: [`https://${addr}`], token: "t0ken", retry: { deadlineMs: 500 } });
    try {
      await assert.rejects(untrusted.getHead("g:1"), (e: Error & { code?: string; attempts?: number }) => {
        // A certificate the client does not trust is not retried.
        assert.match(e.message, /certificate/i);
        assert.equal(e.attempts, 1, e.message);
        return true;
      });
    } finally {
      untrusted.close();
    }
  });
});
