// pullMany's latency through this client (docs/BENCHMARKS.md): 1,000
// conversations named PREFIX-0 .. PREFIX-999, seeded by
// `sequencer-bench pullmany --target URL --calls 1` (its conversations are
// pullmany-<random>-N: read PREFIX from the node's database), then
//   npm run build && node bench/pullmany.mjs HOST:PORT PREFIX [CALLS]
// CALLS calls (default 50) after five unmeasured; limit 10, max_bytes 64 MiB.
import { SequencerClient } from "../dist/src/index.js";

const [addr, prefix, callsArg] = process.argv.slice(2);
if (!addr || !prefix) {
  console.error("usage: node bench/pullmany.mjs HOST:PORT PREFIX [CALLS]");
  process.exit(2);
}
const c = new SequencerClient({ addrs: [addr], disableRouting: true });
const cursors = [];
for (let i = 0; i < 1000; i++) cursors.push({ convId: `${prefix}-${i}`, afterSeq: 0n });
const calls = Number(callsArg || 50);
const took = [];
let n = 0;
const cpu0 = process.cpuUsage();
for (let i = 0; i < calls + 5; i++) {
  const t0 = performance.now();
  const pages = await c.pullMany(cursors, 10, 64 << 20);
  if (i >= 5) took.push(performance.now() - t0);
  n = pages.reduce((a, p) => a + p.messages.length, 0);
}
const cpu = process.cpuUsage(cpu0);
took.sort((a, b) => a - b);
console.log(`messages ${n}; p50 ${took[Math.floor(took.length / 2)].toFixed(1)} ms, p99 ${took[Math.floor((took.length - 1) * 0.99)].toFixed(1)} ms; client CPU ${((cpu.user + cpu.system) / 1000 / (calls + 5)).toFixed(1)} ms/call`);
c.close();
