/**
 * A real cluster for the tests: two `muster` processes (the binary from
 * MUSTER_BIN, default ../../target/debug/muster relative to the package)
 * sharing the embedded Redis of the second, each on a free port with its
 * own data directory in a temporary folder. No mocks.
 *
 * `nodes[1]` hosts the Redis (a child of its process, on a unix socket in
 * its data directory); `nodes[0]` joins it with `--redis-url unix://...`
 * and is the one the failover scenarios kill. Clients are given
 * `[nodes[0].url, nodes[1].url]`, so they start on the node that dies.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, openSync, closeSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const WORKER_TOKEN = "ts-client-w";
export const ADMIN_TOKEN = "ts-client-a";
/** Node timings: a killed node is dead within a second; orphans are looked for every 200 ms. */
export const NODE_TTL_MS = 1000;

const here = dirname(fileURLToPath(import.meta.url));
/** The package's directory (this file runs from .test-build/test/). */
export const PACKAGE_DIR = resolve(here, "../..");
/** The repository root. */
export const REPO_DIR = resolve(PACKAGE_DIR, "../..");

export function musterBin(): string {
  return process.env["MUSTER_BIN"] ?? resolve(PACKAGE_DIR, "../../target/debug/muster");
}

export function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      s.close(() => (a && typeof a === "object" ? ok(a.port) : fail(new Error("no port"))));
    });
  });
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `cond` until it is truthy; fails with `what` and the last value seen. */
export async function waitUntil<T>(what: string, cond: () => T | Promise<T>, timeoutMs = 15_000, everyMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await cond();
      if (v) return v;
      last = v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${String(last)})`);
    await sleep(everyMs);
  }
}

const sha = (t: string): string => createHash("sha256").update(t).digest("hex");

export class Node {
  readonly id: string;
  readonly dir: string;
  readonly log: string;
  readonly config: string;
  proc: ChildProcess | undefined;

  constructor(
    readonly root: string,
    index: number,
    readonly port: number,
    redisUrl: string,
  ) {
    this.id = `ts-node-${index}`;
    this.dir = join(root, `n${index}`);
    mkdirSync(this.dir, { recursive: true });
    this.log = join(this.dir, "node.log");
    this.config = join(this.dir, "config.toml");
    writeFileSync(
      this.config,
      `[server]
listen = "127.0.0.1:${port}"
node_id = "${this.id}"
data_dir = "${join(this.dir, "d")}"

[redis]
url = "${redisUrl}"

[nodes]
heartbeat_ms = 200
ttl_ms = ${NODE_TTL_MS}
dead_retention_ms = 5000

[orphans]
interval_ms = 200

[[auth.tokens]]
name = "w"
role = "worker"
sha256 = "${sha(WORKER_TOKEN)}"

[[auth.tokens]]
name = "a"
role = "admin"
sha256 = "${sha(ADMIN_TOKEN)}"
`,
    );
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** The embedded Redis's socket, when this node hosts it. */
  get redisSocket(): string {
    return join(this.dir, "d", "redis", "redis.sock");
  }

  async start(): Promise<void> {
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !k.startsWith("MUSTER_")) env[k] = v;
    env["RUST_LOG"] = "warn";
    const fd = openSync(this.log, "a");
    try {
      this.proc = spawn(musterBin(), ["--config", this.config], { cwd: this.dir, env, stdio: ["ignore", fd, fd] });
    } finally {
      closeSync(fd);
    }
    const proc = this.proc;
    await waitUntil(`${this.id} ready`, async () => {
      if (proc.exitCode !== null) {
        throw new Error(`${this.id} exited ${proc.exitCode}: ${readFileSync(this.log, "utf8").slice(-2000)}`);
      }
      try {
        return (await fetch(`${this.url}/readyz`)).status === 200;
      } catch {
        return false;
      }
    }, 30_000);
  }

  /** SIGKILL, and waits for the process to be gone. */
  async kill(): Promise<void> {
    const p = this.proc;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const gone = new Promise((r) => p.once("exit", r));
    p.kill("SIGKILL");
    await gone;
    this.proc = undefined;
  }
}

export class Cluster {
  private constructor(
    readonly root: string,
    readonly nodes: Node[],
  ) {}

  static async start(): Promise<Cluster> {
    const bin = musterBin();
    if (!existsSync(bin)) {
      throw new Error(`no muster binary at ${bin}: run \`cargo build\` at the repository root, or set MUSTER_BIN`);
    }
    const root = mkdtempSync(join(tmpdir(), "mts-"));
    const host = new Node(root, 1, await freePort(), "");
    await host.start();
    const joiner = new Node(root, 0, await freePort(), `unix://${host.redisSocket}`);
    await joiner.start();
    return new Cluster(root, [joiner, host]);
  }

  get urls(): string[] {
    return this.nodes.map((n) => n.url);
  }

  async stop(): Promise<void> {
    // The joiner first: the host's Redis dies with it.
    for (const n of this.nodes) await n.kill();
    // The host's embedded Redis gets its parent's death as a signal and may
    // still be writing its files into the directory while it exits: retry
    // (Node retries ENOTEMPTY and EBUSY), and a directory left in /tmp is
    // not a test failure.
    try {
      rmSync(this.root, { recursive: true, force: true, maxRetries: 20, retryDelay: 100 });
    } catch (e) {
      console.warn(`could not remove ${this.root}: ${e}`);
    }
  }
}

/** A queue name of its own for each test. */
export function queueName(test: string): string {
  return `ts-${test.replace(/[^A-Za-z0-9_-]/g, "-").slice(0, 50)}-${process.pid % 1000}`;
}
