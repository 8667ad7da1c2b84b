// The README's example (clients/typescript/README.md and the repository
// README), run against a fresh node: only the address differs.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";

import { SequencerClient, SequencerError } from "../src/index.js";
import { startSingle, type NodeProc } from "./harness.js";

let node: NodeProc;
let stop: () => Promise<void>;
before(async () => ({ node, stop } = await startSingle()));
after(async () => stop?.());

test("README example", async () => {
  const lines: unknown[][] = [];
  const console = { log: (...a: unknown[]) => lines.push(a) };

  const c = new SequencerClient({ addrs: [node.addr] });
  const first = await c.send({ convId: "g:42", fromUid: 1001n, clientMsgId: "5f0c", body: "hi" });
  const again = await c.send({ convId: "g:42", fromUid: 1001n, clientMsgId: "5f0c", body: "hi" });
  console.log(first.seq, again.duplicate, again.msgId === first.msgId); // 1n true true
  const page = await c.pull("g:42", 0n);
  console.log(page.messages.map((m) => m.seq), page.headSeq); // [ 1n ] 1n
  try { await c.send({ convId: "g:42", fromUid: 0n, body: "x" }); }
  catch (e) { if (e instanceof SequencerError) console.log(e.code); } // invalid_argument
  c.close();

  assert.deepEqual(lines, [[1n, true, true], [[1n], 1n], ["invalid_argument"]]);
});
