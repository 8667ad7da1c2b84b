// Test harness: real `sequencer` processes on random ports (127.0.0.1:0),
// the embedded store in a temp dir or a fresh PostgreSQL database.
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes } from "node:crypto";

const here = dirname(fileURLToPath(import.meta.url)); // clients/typescript/dist/test
export const repoRoot = resolve(here, "../../../..");
export const binPath = process.env.SEQUENCER_BIN ?? join(repoRoot, "bin/sequencer");

export class NodeProc {
  addr = "";
  output = "";
  exited: Promise<number | null>;
  private proc: ChildProcess;

  constructor(readonly name: string, args: string[]) {
    this.proc = spawn(binPath, ["serve", "--listen", "127.0.0.1:0", ...args], { stdio: ["ignore", "pipe", "pipe"] });
    const onData = (b: Buffer) => {
      this.output += b.toString();
    };
    this.proc.stdout!.on("data", onData);
    this.proc.stderr!.on("data", onData);
    this.exited = new Promise((res) => this.proc.on("exit", (code) => res(code)));
  }

  /** started resolves with the API address once the "serving" line is logged. */
  async started(timeoutMs = 30_000): Promise<string> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const m = /msg=serving listen=(\S+)/.exec(this.output) ?? /"msg":"serving".*?"listen":"([^"]+)"/.exec(this.output);
      if (m) {
        this.addr = m[1];
        return this.addr;
      }
      if (this.proc.exitCode !== null) {
        throw new Error(`${this.name} exited ${this.proc.exitCode} before serving:\n${this.output}`);
      }
      if (Date.now() > end) {
        throw new Error(`${this.name} did not log "serving" within ${timeoutMs} ms:\n${this.output}`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  kill(signal: NodeJS.Signals = "SIGKILL"): Promise<number | null> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill(signal);
    }
    return this.exited;
  }
}

/** A single node on the embedded store in a fresh temp dir. */
export async function startSingle(): Promise<{ node: NodeProc; stop: () => Promise<void> }> {
  const dir = mkdtempSync(join(tmpdir(), "seq-ts-"));
  const node = new NodeProc("single", ["--store", join(dir, "db"), "--node-id", "solo"]);
  await node.started();
  return {
    node,
    stop: async () => {
      await node.kill("SIGTERM");
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

// The server the Go tests use (README, "make test"); each test gets its own database on it.
const pgURL = new URL(process.env.SEQUENCER_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres");

function psql(sql: string): void {
  execFileSync("psql", ["-d", pgURL.toString(), "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], {
    stdio: ["ignore", "ignore", "inherit"],
  });
}

/** A fresh PostgreSQL database, dropped by the returned function. */
export function freshDatabase(): { dsn: string; drop: () => void } {
  const name = "seq_ts_" + randomBytes(6).toString("hex");
  psql(`CREATE DATABASE ${name}`);
  const dsn = new URL(pgURL);
  dsn.pathname = "/" + name;
  return {
    dsn: dsn.toString(),
    drop: () => psql(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`),
  };
}

/** clusterArgs are the flags of one cluster node on dsn. */
export function clusterArgs(dsn: string, id: string, memberTTL = "2s"): string[] {
  return ["--store", dsn, "--cluster-listen", "127.0.0.1:0", "--node-id", id, "--member-ttl", memberTTL, "--heartbeat", "500ms"];
}

/** waitFor polls cond until it holds or the deadline passes. */
export async function waitFor(what: string, cond: () => Promise<boolean> | boolean, timeoutMs = 30_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await cond()) {
      return;
    }
    if (Date.now() > end) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}
