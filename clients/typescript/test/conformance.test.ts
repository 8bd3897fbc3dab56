// The conformance suite (tests/conformance/*.json, described in its
// README.md) run by the TypeScript client: each scenario against a fresh
// pair of real nodes, with this package's Client and Worker.

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { Client, Conflict, Worker, type ClaimedTask, type Event } from "../src/index.js";
import { ADMIN_TOKEN, Cluster, REPO_DIR, WORKER_TOKEN, sleep, waitUntil } from "./cluster.js";
import { scriptedHandler, type HandlerEvent } from "./scripted.js";

type Step = Record<string, unknown> & { op: string };
interface Scenario {
  name: string;
  checks: string;
  steps: Step[];
}

const DIR = join(REPO_DIR, "tests", "conformance");
const WORKER_JS = fileURLToPath(new URL("./conformance_worker.js", import.meta.url));

/** Scenarios this runner cannot run, and why (none). */
const SKIP: Record<string, string> = {};

interface InProcess {
  kind: "in";
  id: string;
  worker: Worker;
  events: HandlerEvent[];
  done: Promise<unknown>;
}
interface OutOfProcess {
  kind: "proc";
  id: string;
  proc: ChildProcess;
  out: string;
  exit: Promise<number | null>;
}
type AnyWorker = InProcess | OutOfProcess;

class Run {
  readonly queue: string;
  readonly client: Client;
  readonly tasks = new Map<string, string>();
  readonly claims = new Map<string, ClaimedTask>();
  readonly workers = new Map<string, AnyWorker>();
  readonly follows = new Map<string, Event[]>();
  readonly tmp = mkdtempSync(join(tmpdir(), "mts-conf-"));

  constructor(
    readonly cluster: Cluster,
    readonly scenario: Scenario,
  ) {
    this.queue = `conf-ts-${scenario.name.replace(/_/g, "-")}-${process.pid % 10000}`;
    this.client = new Client(cluster.urls, { token: ADMIN_TOKEN, retryForMs: 20_000 });
  }

  task(alias: unknown): string {
    const id = this.tasks.get(String(alias));
    assert.ok(id, `no task ${String(alias)}`);
    return id;
  }

  workerId(alias: unknown): string {
    return `conf-ts-${String(alias)}-${process.pid % 10000}`;
  }

  handlerEvents(w: AnyWorker): HandlerEvent[] {
    if (w.kind === "in") return w.events;
    if (!existsSync(w.out)) return [];
    return readFileSync(w.out, "utf8")
      .split("\n")
      .filter((l) => l.trim())
      .map((l) => JSON.parse(l) as HandlerEvent);
  }

  async step(s: Step): Promise<void> {
    const within = typeof s["within_ms"] === "number" ? s["within_ms"] : 15_000;
    switch (s.op) {
      case "submit": {
        const r = await this.client.submit(this.queue, s["payload"], {
          max_attempts: (s["max_attempts"] as number | undefined) ?? null,
          timeout_ms: (s["timeout_ms"] as number | undefined) ?? null,
          backoff_base_ms: (s["backoff_base_ms"] as number | undefined) ?? null,
        });
        assert.equal(r.state, "queued");
        this.tasks.set(String(s["as"]), r.id);
        return;
      }
      case "register":
        await this.client.heartbeatNode(String(s["node"]), { ttl_ms: 30_000 });
        return;
      case "claim": {
        const got = await this.client.claim(this.queue, String(s["node"]), { max: 1, waitMs: 2000 });
        assert.equal(got.length, 1, "one task claimed");
        const [c] = got as [ClaimedTask];
        assert.equal(c.id, this.task(s["task"]));
        assert.ok(c.token > 0);
        this.claims.set(String(s["as"]), c);
        return;
      }
      case "complete":
      case "fail": {
        const c = this.claims.get(String(s["claim"]));
        assert.ok(c);
        const call =
          s.op === "complete"
            ? this.client.complete(c.id, c.token, s["result"])
            : this.client.fail(c.id, c.token, "failed by the scenario", { retry: s["retry"] !== false });
        if (s["expect"] === "conflict") await assert.rejects(call, Conflict);
        else await call;
        return;
      }
      case "cancel":
        await this.client.cancel(this.task(s["task"]));
        return;
      case "expect_task":
        return this.expectTask(s);
      case "wait_task": {
        const id = this.task(s["task"]);
        const state = String(s["state"]);
        if (["succeeded", "dead", "cancelled"].includes(state)) {
          const t = await this.client.waitForResult(id, within);
          assert.equal(t.state, state, `task ${String(s["task"])}: ${JSON.stringify(t)}`);
        } else {
          await waitUntil(`task ${String(s["task"])} ${state}`, async () => (await this.client.getTask(id)).state === state, within);
        }
        return;
      }
      case "stays": {
        await sleep(Number(s["for_ms"] ?? 500));
        const t = await this.client.getTask(this.task(s["task"]));
        assert.equal(t.state, s["state"]);
        return;
      }
      case "worker": {
        const events: HandlerEvent[] = [];
        const id = this.workerId(s["as"]);
        const worker = new Worker(this.cluster.urls, this.queue, scriptedHandler((e) => events.push(e)), {
          token: WORKER_TOKEN,
          workerId: id,
          concurrency: (s["concurrency"] as number | undefined) ?? 1,
          ttlMs: (s["ttl_ms"] as number | undefined) ?? 2000,
          heartbeatMs: (s["heartbeat_ms"] as number | undefined) ?? 300,
          graceMs: (s["grace_ms"] as number | undefined) ?? 5000,
          pollMs: 500,
          handleSignals: false,
          log: () => undefined,
        });
        this.workers.set(String(s["as"]), { kind: "in", id, worker, events, done: worker.run() });
        return;
      }
      case "worker_process": {
        const id = this.workerId(s["as"]);
        const out = join(this.tmp, `${id}.jsonl`);
        const proc = spawn(
          process.execPath,
          [WORKER_JS, this.cluster.urls.join(","), WORKER_TOKEN, this.queue, out, id, String(s["ttl_ms"] ?? 1000), String(s["grace_ms"] ?? 30_000)],
          { stdio: ["ignore", "ignore", "inherit"] },
        );
        const exit = new Promise<number | null>((r) => proc.once("exit", (code) => r(code)));
        this.workers.set(String(s["as"]), { kind: "proc", id, proc, out, exit });
        return;
      }
      case "wait_handler": {
        const w = this.workers.get(String(s["worker"]));
        assert.ok(w);
        const id = this.task(s["task"]);
        await waitUntil(
          `${String(s["worker"])}: ${String(s["event"])} of ${String(s["task"])} (${String(s["reason"] ?? "")})`,
          () =>
            this.handlerEvents(w).some(
              (e) =>
                e.task === id &&
                e.event === s["event"] &&
                (s["reason"] === undefined || e.reason === s["reason"]) &&
                (s["attempt"] === undefined || e.attempt === s["attempt"]),
            ),
          within,
        );
        return;
      }
      case "signal_worker": {
        const w = this.workers.get(String(s["worker"]));
        assert.ok(w && w.kind === "proc");
        w.proc.kill(s["signal"] === "KILL" ? "SIGKILL" : "SIGTERM");
        return;
      }
      case "wait_exit": {
        const w = this.workers.get(String(s["worker"]));
        assert.ok(w && w.kind === "proc");
        const code = await Promise.race([w.exit, sleep(within).then(() => "timeout" as const)]);
        assert.equal(code, 0, `worker process ${w.id} exit`);
        return;
      }
      case "stop_worker": {
        const w = this.workers.get(String(s["worker"]));
        assert.ok(w && w.kind === "in");
        w.worker.stop();
        await w.done;
        return;
      }
      case "expect_worker_stats": {
        const w = this.workers.get(String(s["worker"]));
        assert.ok(w && w.kind === "in");
        const stats = w.worker.stats as unknown as Record<string, number>;
        for (const [k, v] of Object.entries(s["at_least"] as Record<string, number>)) {
          const name = k.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
          assert.ok((stats[name] ?? 0) >= v, `stats.${name} = ${stats[name]} < ${v}`);
        }
        return;
      }
      case "kill_node": {
        const n = this.cluster.nodes[Number(s["node"])];
        assert.ok(n);
        await n.kill();
        return;
      }
      case "follow": {
        const since = s["since"] === "start" ? "0" : s["since"] ? this.follows.get(String(s["since"]))?.at(-1)?.id : undefined;
        const want = Number(s["count"]);
        const got: Event[] = [];
        const ac = new AbortController();
        const timer = setTimeout(() => ac.abort(), within);
        try {
          for await (const ev of this.client.follow({ topics: String(s["topics"]), queue: this.queue, since, signal: ac.signal })) {
            if (!("id" in ev)) continue;
            got.push(ev as Event);
            if (got.length >= want) break;
          }
        } finally {
          clearTimeout(timer);
        }
        const expect = (s["expect_tasks"] as string[]).map((a) => this.task(a));
        assert.deepEqual(
          got.map((e) => e.task),
          expect,
        );
        this.follows.set(String(s["as"]), got);
        return;
      }
      default:
        throw new Error(`unknown op ${s.op}`);
    }
  }

  async expectTask(s: Step): Promise<void> {
    const t = await this.client.getTask(this.task(s["task"]));
    const what = `task ${String(s["task"])}: ${JSON.stringify(t)}`;
    if (s["state"] !== undefined) assert.equal(t.state, s["state"], what);
    if (s["payload"] !== undefined) assert.deepEqual(t.payload, s["payload"], what);
    if (s["owner"] !== undefined) assert.equal(t.owner, s["owner"], what);
    if (s["attempts"] !== undefined) assert.equal(t.attempts, s["attempts"], what);
    if (s["succeeded_attempts"] !== undefined) {
      assert.equal(t.attempt_log.filter((a) => a.outcome === "succeeded").length, s["succeeded_attempts"], what);
    }
    const result = t.result as Record<string, unknown> | undefined;
    if (s["result"] !== undefined) {
      const want = s["result"];
      if (want && typeof want === "object" && result && typeof result === "object") {
        for (const [k, v] of Object.entries(want)) assert.deepEqual(result[k], v, what);
      } else {
        assert.deepEqual(result, want, what);
      }
    }
    if (s["result_by"] !== undefined) assert.equal(result?.["by"], this.workerId(s["result_by"]), what);
  }

  async close(): Promise<void> {
    for (const w of this.workers.values()) {
      if (w.kind === "in") {
        w.worker.stop();
        await Promise.race([w.done.catch(() => undefined), sleep(10_000)]);
      } else if (w.proc.exitCode === null && w.proc.signalCode === null) {
        w.proc.kill("SIGKILL");
        await w.exit;
      }
    }
  }
}

const files = readdirSync(DIR)
  .filter((f) => f.endsWith(".json"))
  .sort();

for (const file of files) {
  const scenario = JSON.parse(readFileSync(join(DIR, file), "utf8")) as Scenario;
  const skip = SKIP[scenario.name];
  test(`conformance ${scenario.name}: ${scenario.checks}`, skip ? { skip } : {}, async () => {
    const cluster = await Cluster.start();
    const run = new Run(cluster, scenario);
    try {
      for (const [i, s] of scenario.steps.entries()) {
        try {
          await run.step(s);
        } catch (e) {
          if (e instanceof Error) e.message = `step ${i + 1} ${JSON.stringify(s)}: ${e.message}`;
          throw e;
        }
      }
    } finally {
      await run.close();
      await cluster.stop();
    }
  });
}
