/**
 * The worker loop, with the semantics of the Python and Rust workers
 * (docs/workers.md; README.md has the user's version).
 *
 * - Registration: the worker id heartbeats into the node registry every
 *   `ttlMs / 4` (through any node) before its first claim and until it
 *   leaves. If the process dies the heartbeat stops and muster recovers its
 *   tasks within `ttlMs` plus the cleaner's interval (G3).
 * - At most `concurrency` handlers run at once; a claim asks for
 *   `min(batch, free slots)` tasks and long-polls `pollMs`. With `batch` 1
 *   and `claimNext` (the default) each complete also claims the slot's next
 *   task: one call per task instead of two.
 * - Beside each handler a task heartbeat runs every `heartbeatMs` with the
 *   fencing token (and the progress the handler reported). The first comes
 *   at `min(heartbeatMs, ack_ms / 3)`: a claim must be acknowledged within
 *   its claim lease (`task.ack_ms`) or the server puts it back in its queue;
 *   a task finished sooner is acknowledged by its complete or fail, so the
 *   hot path has no extra request. An adopted task is acknowledged before
 *   it starts.
 * - A 409 on a task heartbeat or on complete/fail means the token is stale,
 *   a 404 that the task is gone: the handler's signal aborts with reason
 *   `stale` and its result is dropped: nothing more is sent with that token,
 *   so there is never a second completion. A complete whose answer was lost
 *   and whose retry got 409 is checked against the task (succeeded with our
 *   token: it was ours).
 * - Its own lease: counted on the monotonic clock from the send time of the
 *   newest registration heartbeat that succeeded, until `ttlMs` less a
 *   margin (a tenth of the ttl, at least 100 ms). When it lapses every
 *   running handler's signal aborts (`lease_expired`) before the cluster can
 *   take the worker for dead and hand its tasks on; nothing is claimed (and
 *   a task a late answer brings is not started) until a heartbeat succeeds;
 *   then the worker adopts (below). A told handler's outcome is still sent
 *   with its token: it counts if the task was not recovered meanwhile.
 * - A cancel request (seen on a task heartbeat) aborts the signal with
 *   `cancel_requested`. A handler that then throws fails the task without
 *   retry, which muster records as `cancelled`; one that returns completes
 *   it with its result: the work happened (as the Rust and Python workers,
 *   docs/workers.md).
 * - A handler that throws fails the task: retried by the server while
 *   attempts are left (`throw new Fail(msg, { retry: false })`: dead at once).
 * - Transient errors (connection errors, timeouts, 5xx) are retried across
 *   the node URLs with backoff, never 4xx.
 * - Adoption: after any request that failed over (a claim, or a complete
 *   that claims, whose answer may have been lost with its node) the worker
 *   lists the queue's running tasks and runs those held under its id with a
 *   token it never started, or hands them back when no slot is free; it
 *   never starts a token twice.
 * - `stop()` (SIGTERM, SIGINT): no more claims (a long poll in flight is
 *   abandoned), in-flight handlers get `graceMs` to finish and are completed
 *   as usual; those still running are told (`shutdown`) and handed back with
 *   `fail` (retry), their results dropped. Then the worker leaves the
 *   registry.
 *
 * A handler runs on the event loop: one that blocks it (CPU-bound work)
 * delays every heartbeat. Make it async, and move heavy work to a
 * `worker_threads` Worker or a child process.
 */

import { Client, type ClientOptions } from "./client.js";
import { Conflict, MusterError, NotFound, Unavailable } from "./errors.js";
import { sleep } from "./http.js";
import type { ClaimedTask, TaskInfo } from "./models.js";
import { childTraceparent, withTraceparent } from "./trace.js";

/** The least worker ttl muster accepts (ms); the last heartbeat uses it. */
export const MIN_TTL_MS = 500;

/** Why a handler's signal aborted. */
export type CancelReason = "stale" | "cancel_requested" | "lease_expired" | "shutdown";

/** Ms until a task's first heartbeat: `heartbeatMs`, or a third of its claim lease when sooner. */
export function firstHeartbeat(heartbeatMs: number, ackMs: number | undefined): number {
  if (!ackMs || ackMs <= 0) return heartbeatMs;
  return Math.min(heartbeatMs, ackMs / 3);
}

/** How long (ms) before its registration could end a worker takes its own lease for lapsed. */
export function leaseMargin(ttlMs: number): number {
  return Math.max(ttlMs / 10, 100);
}

/** Throw from a handler to fail the task with this message; `retry: false` makes it dead at once. */
export class Fail extends Error {
  readonly retry: boolean;
  constructor(message: string, o: { retry?: boolean } = {}) {
    super(message);
    this.name = "Fail";
    this.retry = o.retry ?? true;
  }
}

/** The reason a handler's signal carries. */
export class TaskCancelled extends Error {
  constructor(readonly reason: CancelReason) {
    super(`task cancelled: ${reason}`);
    this.name = "TaskCancelled";
  }
}

/** What a handler gets besides the task: a signal to stop on, and progress reports. */
export class TaskContext {
  readonly task: ClaimedTask;
  readonly workerId: string;
  /**
   * Why `signal` aborted: `stale` (409 or 404: the task is no longer ours,
   * the result will be dropped), `cancel_requested` (someone cancelled the
   * task: stop and throw, e.g. `signal.throwIfAborted()`, and it ends
   * cancelled; return and it completes), `lease_expired` (the worker reached no node
   * for its ttl less the margin: stop; the outcome is still sent and counts
   * only if the task was not recovered), or `shutdown` (the grace period
   * ran out: the task was handed back).
   */
  reason: CancelReason | undefined;
  /** @internal */ pending: { progress?: number | undefined; fields?: Record<string, unknown> | undefined } = {};
  /** @internal */ reported = "";
  /**
   * This attempt's W3C `traceparent`: a span of its own, a child of the
   * context the task was submitted with (undefined when it has none). Every
   * client call the handler makes while it runs sends it; pass it on to
   * what the handler calls elsewhere.
   */
  readonly traceparent: string | undefined;
  /** Made when first asked for: most handlers of short tasks never look. */
  private ac: AbortController | undefined;

  constructor(task: ClaimedTask, workerId: string) {
    this.task = task;
    this.workerId = workerId;
    this.traceparent = childTraceparent(task.traceparent);
  }

  /**
   * Aborts when the handler should stop: see `reason`. Pass it to fetch,
   * timers and child processes, or check `signal.aborted`.
   */
  get signal(): AbortSignal {
    this.ac ??= new AbortController();
    return this.ac.signal;
  }

  get cancelled(): boolean {
    return this.reason !== undefined;
  }

  /** Reports progress (0-100) and optional fields with the next heartbeat. */
  progress(percent: number, fields?: Record<string, unknown>): void {
    this.pending.progress = Math.max(0, Math.min(100, Math.trunc(percent)));
    if (fields !== undefined) this.pending.fields = { ...fields };
  }

  /** @internal */
  cancel(reason: CancelReason): void {
    if (this.reason === undefined || reason === "stale") this.reason = reason;
    if (!this.signal.aborted) this.ac?.abort(new TaskCancelled(reason));
  }
}

export type Handler = (task: ClaimedTask, ctx: TaskContext) => unknown;

/** Counts since the worker started. */
export interface WorkerStats {
  claimed: number;
  completed: number;
  failed: number;
  /** Failed after a cancel request (the task ends cancelled; one whose handler returned counts as completed). */
  cancelled: number;
  /** Results dropped because the token was stale (409/404). */
  stale: number;
  /** Handed back (fail with retry) at shutdown, or found with no free slot. */
  handedBack: number;
  /** Tasks found running under this worker's id that no answer brought, run as if claimed. */
  adopted: number;
  /** Times the worker's own registration lease lapsed. */
  leaseLapses: number;
  transientErrors: number;
}

export interface WorkerOptions extends ClientOptions {
  /** Default: `<host>-<pid>-<random>`. */
  workerId?: string;
  /** Handlers at once. Default 1. */
  concurrency?: number;
  /** Tasks asked for by one claim. Default 1. */
  batch?: number;
  /** A claim's long poll, ms. Default 5 000. */
  pollMs?: number;
  /** Task heartbeat period, ms. Default 2 000. */
  heartbeatMs?: number;
  /** Registration ttl, ms (at least 500). Default 10 000. */
  ttlMs?: number;
  /** Time in-flight handlers get to finish on stop, ms. Default 30 000. */
  graceMs?: number;
  labels?: Record<string, string>;
  /** With batch 1, a complete also claims the slot's next task. Default true. */
  claimNext?: boolean;
  /** The claim lease its claims ask for (1 000 to 600 000 ms); default the server's `claim.ack_ms`. */
  claimAckMs?: number;
  /** Stop on SIGTERM and SIGINT. Default true. */
  handleSignals?: boolean;
  /** Where the worker logs its warnings. Default console.warn. */
  log?: (msg: string) => void;
}

/** A set flag with waiters (an asyncio.Event). */
class Flag {
  private on = false;
  private waiters = new Set<() => void>();
  get isSet(): boolean {
    return this.on;
  }
  set(): void {
    if (this.on) return;
    this.on = true;
    for (const w of [...this.waiters]) w();
  }
  clear(): void {
    this.on = false;
  }
  /**
   * Resolves once this flag or `other` is set, and leaves no waiter on
   * either (racing two `wait()`s would leave one behind on the flag that
   * stayed unset: one per loop turn, for as long as the worker runs).
   */
  waitEither(other: Flag): Promise<void> {
    if (this.on || other.on) return Promise.resolve();
    return new Promise((resolve) => {
      const w = (): void => {
        this.waiters.delete(w);
        other.waiters.delete(w);
        resolve();
      };
      this.waiters.add(w);
      other.waiters.add(w);
    });
  }

  /** Resolves true once set, false after `ms` (if given). */
  wait(ms?: number): Promise<boolean> {
    if (this.on) return Promise.resolve(true);
    return new Promise((resolve) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const done = (v: boolean): void => {
        this.waiters.delete(w);
        if (timer) clearTimeout(timer);
        resolve(v);
      };
      const w = (): void => done(true);
      this.waiters.add(w);
      if (ms !== undefined) timer = setTimeout(() => done(false), Math.max(0, ms));
    });
  }
}

function defaultWorkerId(): string {
  const host = (process.env["HOSTNAME"] ?? "node").replace(/[^A-Za-z0-9._-]/g, "-").slice(0, 32);
  return `${host}-${process.pid}-${crypto.randomUUID().slice(0, 6)}`;
}

const now = (): number => performance.now();

/** When the adopter looks after it is asked, in ms (see `adoptLoop`). */
const ADOPT_LOOKS_MS = [500, 2500];

export class Worker {
  readonly client: Client;
  readonly queue: string;
  readonly handler: Handler;
  readonly workerId: string;
  readonly concurrency: number;
  readonly batch: number;
  readonly pollMs: number;
  readonly heartbeatMs: number;
  readonly ttlMs: number;
  readonly graceMs: number;
  readonly labels: Record<string, string> | undefined;
  readonly claimNext: boolean;
  readonly claimAckMs: number | undefined;
  readonly stats: WorkerStats = {
    claimed: 0,
    completed: 0,
    failed: 0,
    cancelled: 0,
    stale: 0,
    handedBack: 0,
    adopted: 0,
    leaseLapses: 0,
    transientErrors: 0,
  };
  private readonly handleSignals: boolean;
  private readonly log: (msg: string) => void;
  private stopping = new Flag();
  /** Aborts the claim in flight and the background loops' sleeps. */
  private stopAc = new AbortController();
  private loopsAc = new AbortController();
  /** Running tasks by token (a task's stale attempt and its next may both be here for a moment). */
  private running = new Map<number, { done: Promise<void>; ctx: TaskContext }>();
  /** Tokens started, so nothing starts twice (the newest 100 000). */
  private seen = new Set<number>();
  /** Slots asked for by the claim in flight. */
  private reserved = 0;
  private slotFreed = new Flag();
  private adoptWanted = new Flag();
  private leaseHolds = new Flag();
  private leaseFrom: number | undefined;
  private readonly leaseLasts: number;
  private leaseTimer: ReturnType<typeof setTimeout> | undefined;

  /** `client`: a Client, or the node URL(s) to make one from (with `opts` as its options). */
  constructor(client: Client | string | readonly string[], queue: string, handler: Handler, opts: WorkerOptions = {}) {
    this.client = client instanceof Client ? client : new Client(client, opts);
    this.queue = queue;
    this.handler = handler;
    this.workerId = opts.workerId ?? defaultWorkerId();
    this.concurrency = opts.concurrency ?? 1;
    this.batch = opts.batch ?? 1;
    this.pollMs = opts.pollMs ?? 5000;
    this.heartbeatMs = opts.heartbeatMs ?? 2000;
    this.ttlMs = opts.ttlMs ?? 10_000;
    this.graceMs = opts.graceMs ?? 30_000;
    this.labels = opts.labels;
    this.claimNext = opts.claimNext ?? true;
    this.claimAckMs = opts.claimAckMs;
    this.handleSignals = opts.handleSignals ?? true;
    this.log = opts.log ?? ((m) => console.warn(m));
    if (this.concurrency < 1 || this.batch < 1) throw new RangeError("concurrency and batch must be at least 1");
    if (this.ttlMs < MIN_TTL_MS) throw new RangeError(`ttlMs must be at least ${MIN_TTL_MS}`);
    this.leaseLasts = this.ttlMs - leaseMargin(this.ttlMs);
  }

  // ---- control --------------------------------------------------------------

  /** Asks the worker to stop (safe from signal handlers); `run()` resolves once it has. */
  stop(): void {
    this.stopping.set();
    this.stopAc.abort();
  }

  /** Runs until `stop()` (or SIGTERM/SIGINT); resolves with the stats. */
  async run(): Promise<WorkerStats> {
    const onSignal = (): void => this.stop();
    if (this.handleSignals) {
      process.on("SIGTERM", onSignal);
      process.on("SIGINT", onSignal);
    }
    const loops = [this.registryLoop(), this.adoptLoop()];
    try {
      await this.register();
      await this.claimLoop();
      await this.drain();
    } finally {
      this.loopsAc.abort();
      this.adoptWanted.set();
      this.leaseHolds.set();
      if (this.leaseTimer) clearTimeout(this.leaseTimer);
      await Promise.allSettled(loops);
      await this.leave();
      if (this.handleSignals) {
        process.off("SIGTERM", onSignal);
        process.off("SIGINT", onSignal);
      }
    }
    return this.stats;
  }

  // ---- registration and the worker's own lease -------------------------------

  private heartbeatNode(ttlMs: number, retryForMs: number): Promise<unknown> {
    return this.client.heartbeatNode(
      this.workerId,
      { ttl_ms: ttlMs, ...(this.labels ? { labels: this.labels } : {}), version: "muster-client-typescript/0.1" },
      // A stalled node must not hold the beat past the ttl: give up on it
      // after a quarter and try the next URL.
      { retryForMs, timeoutMs: Math.max(200, this.ttlMs / 4) },
    );
  }

  /** One registration heartbeat; a success renews the lease from the time it was sent. */
  private async beat(retryForMs: number): Promise<void> {
    const sent = now();
    await this.heartbeatNode(this.ttlMs, retryForMs);
    this.renewed(sent);
  }

  private renewed(sent: number): void {
    if (this.leaseFrom !== undefined && this.leaseFrom >= sent) return;
    const first = this.leaseFrom === undefined;
    this.leaseFrom = sent;
    const ends = sent + this.leaseLasts;
    if (!this.leaseHolds.isSet && now() < ends) {
      this.leaseHolds.set();
      // Tasks whose claims were answered while it had lapsed were not started.
      if (!first) this.adoptSoon();
    }
    if (this.leaseTimer) clearTimeout(this.leaseTimer);
    if (this.loopsAc.signal.aborted) return;
    this.leaseTimer = setTimeout(() => {
      if (this.leaseFrom !== undefined && now() >= this.leaseFrom + this.leaseLasts && this.leaseHolds.isSet) {
        this.lapse();
      }
    }, Math.max(0, ends - now()));
  }

  private lapse(): void {
    this.leaseHolds.clear();
    this.stats.leaseLapses += 1;
    this.log(
      `worker ${this.workerId}: no registration heartbeat succeeded within the lease: ` +
        "telling every running handler to stop, claiming nothing until one does",
    );
    for (const { ctx } of this.running.values()) ctx.cancel("lease_expired");
  }

  private leaseOk(): boolean {
    return this.leaseHolds.isSet;
  }

  /** Heartbeats until the registry has the worker (before any claim). */
  private async register(): Promise<void> {
    let delay = 50;
    while (!this.stopping.isSet) {
      try {
        await this.beat(this.ttlMs / 2);
        return;
      } catch (e) {
        if (!(e instanceof Unavailable)) throw e;
        this.stats.transientErrors += 1;
        this.log(`worker ${this.workerId}: cannot register yet: ${e.message}`);
      }
      await this.stopping.wait(delay * (0.5 + Math.random() / 2));
      delay = Math.min(delay * 2, 2000);
    }
  }

  /** Keeps the worker alive in the registry every ttl/4, whatever else is slow. */
  private async registryLoop(): Promise<void> {
    const every = this.ttlMs / 4;
    const signal = this.loopsAc.signal;
    for (;;) {
      await sleep(every, signal);
      if (signal.aborted) return;
      try {
        await this.beat(2 * every);
      } catch (e) {
        if (e instanceof Unavailable) this.stats.transientErrors += 1;
        this.log(`worker ${this.workerId}: heartbeat failed: ${(e as Error).message}`);
      }
    }
  }

  /** Leaves the registry; if that fails, a last heartbeat with the shortest ttl lets it lapse at once. */
  private async leave(): Promise<void> {
    try {
      await this.client.leaveWorker(this.workerId, { retryForMs: 2000, timeoutMs: 2000 });
      return;
    } catch (e) {
      this.log(`worker ${this.workerId}: leave failed: ${(e as Error).message}`);
    }
    try {
      await this.heartbeatNode(MIN_TTL_MS, 2000);
    } catch (e) {
      this.log(`worker ${this.workerId}: last heartbeat failed: ${(e as Error).message}`);
    }
  }

  // ---- claiming ---------------------------------------------------------------

  private async claimLoop(): Promise<void> {
    let delay = 50;
    while (!this.stopping.isSet) {
      if (!this.leaseOk()) {
        // Nothing is claimed while the worker's own lease has lapsed.
        await this.leaseHolds.waitEither(this.stopping);
        continue;
      }
      const free = this.concurrency - this.running.size;
      if (free <= 0) {
        this.slotFreed.clear();
        await this.slotFreed.waitEither(this.stopping);
        continue;
      }
      this.reserved = Math.min(this.batch, free);
      const failovers = this.client.failovers;
      let tasks: ClaimedTask[];
      try {
        tasks = await this.client.claim(this.queue, this.workerId, {
          max: this.reserved,
          waitMs: this.pollMs,
          ...(this.claimAckMs !== undefined ? { ackMs: this.claimAckMs } : {}),
          signal: this.stopAc.signal,
        });
        delay = 50;
      } catch (e) {
        if (this.stopping.isSet) break; // the long poll abandoned: a task it claimed is recovered
        if (e instanceof Conflict) {
          // Not registered (lapsed) or draining: heartbeat, then retry.
          this.log(`worker ${this.workerId}: claim refused: ${e.message}`);
          await this.register();
        } else if (e instanceof Unavailable) {
          this.stats.transientErrors += 1;
          this.log(`worker ${this.workerId}: claim failed: ${e.message}`);
        } else {
          throw e;
        }
        await this.stopping.wait(delay * (0.5 + Math.random() / 2));
        delay = Math.min(delay * 2, 2000);
        continue;
      } finally {
        this.reserved = 0;
        // A try failed, perhaps after the claim ran: look for tasks held
        // under our id that no answer brought.
        if (this.client.failovers !== failovers) this.adoptSoon();
      }
      for (const t of tasks) this.start(t);
    }
  }

  /**
   * Runs a task this worker holds (claimed, handed over by a complete, or
   * adopted); false when that token was started already, or when the lease
   * has lapsed (the adopter runs it once the lease is renewed, if it is
   * still held under this worker's id).
   */
  private start(task: ClaimedTask): boolean {
    if (this.seen.has(task.token)) return false;
    if (!this.leaseOk()) {
      this.log(`worker ${this.workerId}: task ${task.id} claimed while the lease had lapsed: not started`);
      this.adoptSoon();
      return false;
    }
    this.remember(task.token);
    this.stats.claimed += 1;
    const ctx = new TaskContext(task, this.workerId);
    const done = this.runOne(task, ctx);
    this.running.set(task.token, { done, ctx });
    return true;
  }

  private remember(token: number): void {
    this.seen.add(token);
    if (this.seen.size > 100_000) {
      const oldest = this.seen.values().next().value;
      if (oldest !== undefined) this.seen.delete(oldest);
    }
  }

  private adoptSoon(): void {
    this.adoptWanted.set();
  }

  private async adoptLoop(): Promise<void> {
    const signal = this.loopsAc.signal;
    for (;;) {
      await this.adoptWanted.wait();
      if (signal.aborted) return;
      this.adoptWanted.clear();
      // Give the cluster a moment (a node was just lost), then look, under a
      // lease that holds (a task found then stays ours); look again 2.5 s
      // later, for a request held on the way longer than its timeout and
      // applied after the first look. A look that fails is tried again
      // with backoff until one succeeds.
      for (const first of ADOPT_LOOKS_MS) {
        let wait = first;
        let backoff = 250;
        for (;;) {
          await sleep(wait, signal);
          await this.leaseHolds.wait();
          if (signal.aborted) return;
          try {
            await this.adopt();
            break;
          } catch (e) {
            this.log(`worker ${this.workerId}: could not look for lost claims; looking again: ${(e as Error).message}`);
            wait = backoff;
            backoff = Math.min(backoff * 2, 5000);
          }
        }
      }
    }
  }

  /**
   * Runs the tasks of the queue running under this worker's id with a token
   * it never started (a claim, or a complete's next task, whose answer was
   * lost with its node). A task that finds no free slot is handed back
   * (fail, retried). Returns how many it started.
   */
  async adopt(): Promise<number> {
    let started = 0;
    let cursor: string | undefined;
    while (!this.stopping.isSet) {
      const page = await this.client.listTasks(this.queue, "running", { limit: 500, ...(cursor ? { cursor } : {}) });
      for (const t of page.tasks) {
        const token = t.token ?? undefined;
        if (t.owner !== this.workerId || token === undefined || this.seen.has(token)) continue;
        if (this.running.size + this.reserved >= this.concurrency) {
          // No free slot (the claim in flight holds them): hand it back now
          // rather than let it wait for its timeout.
          this.remember(token);
          try {
            await this.client.fail(t.id, token, "the claim's answer was lost; handed back", { retry: true });
            this.stats.handedBack += 1;
          } catch (e) {
            if (!(e instanceof Conflict)) throw e;
          }
          continue;
        }
        // Acknowledged before it starts; refused: it went back to its queue meanwhile.
        try {
          await this.client.ackTask(t.id, token);
        } catch (e) {
          if (e instanceof Conflict || e instanceof NotFound) {
            this.remember(token);
            continue;
          }
          if (!(e instanceof Unavailable)) throw e;
        }
        if (this.start(claimedFrom(t, token))) {
          this.log(`worker ${this.workerId}: adopted task ${t.id} (token ${token}): its claim's answer was lost`);
          this.stats.adopted += 1;
          started += 1;
        }
      }
      if (!page.next_cursor) break;
      cursor = page.next_cursor;
    }
    return started;
  }

  /** Gives in-flight handlers `graceMs`, then hands back the rest. */
  private async drain(): Promise<void> {
    const deadline = now() + this.graceMs;
    // A complete in flight may still hand over a next task: wait for
    // whatever is running, not a list taken once.
    while (this.running.size > 0 && now() < deadline) {
      const all = [...this.running.values()].map((r) => r.done);
      const timer = new AbortController();
      await Promise.race([Promise.race(all), sleep(deadline - now(), timer.signal)]);
      timer.abort(); // a pending timer would keep the process alive
    }
    for (const [token, { ctx }] of [...this.running.entries()]) {
      ctx.cancel("shutdown");
      try {
        await this.client.fail(ctx.task.id, token, "the worker shut down before the task finished", { retry: true });
        this.stats.handedBack += 1;
      } catch (e) {
        // 409: it was no longer ours anyway. Else it is recovered when the
        // registration lapses.
        this.log(`worker ${this.workerId}: could not hand back ${ctx.task.id}: ${(e as Error).message}`);
      }
    }
  }

  // ---- one task ---------------------------------------------------------------

  /** Heartbeats now and every `heartbeatMs` until `stop` aborts (or the token is stale). */
  private async heartbeatTask(task: ClaimedTask, ctx: TaskContext, stop: AbortSignal): Promise<void> {
    for (let first = true; ; first = false) {
      if (!first) await sleep(this.heartbeatMs, stop);
      if (stop.aborted) return;
      const { progress, fields } = ctx.pending;
      const key = JSON.stringify([progress, fields]);
      const send = key !== ctx.reported;
      try {
        const hb = await this.client.heartbeatTask(task.id, task.token, send ? { progress, fields } : {});
        ctx.reported = key;
        if (hb.cancel_requested && !ctx.cancelled) ctx.cancel("cancel_requested");
      } catch (e) {
        if (e instanceof Conflict || e instanceof NotFound) {
          this.log(`task ${task.id}: token ${task.token} is stale (${e.message}): the handler is told to stop`);
          ctx.cancel("stale");
          return;
        }
        this.stats.transientErrors += 1;
        this.log(`task ${task.id}: heartbeat failed: ${(e as Error).message}`);
      }
    }
  }

  /** Sends complete or fail with the token until applied or refused; 409 marks the context stale. */
  private async finish(kind: "complete" | "fail", task: ClaimedTask, ctx: TaskContext, value: unknown, retry: boolean): Promise<void> {
    let delay = 50;
    for (;;) {
      try {
        if (kind === "complete") {
          // One call instead of two: the complete also claims this slot's
          // next task (unless stopping, or batching).
          const chain = this.claimNext && this.batch === 1 && !this.stopping.isSet && this.leaseOk();
          const failovers = this.client.failovers;
          const done = await this.client.complete(
            task.id,
            task.token,
            value,
            chain ? { max: 1, queue: this.queue, ...(this.claimAckMs ? { ackMs: this.claimAckMs } : {}) } : undefined,
          );
          this.stats.completed += 1;
          if (chain && this.client.failovers !== failovers) this.adoptSoon();
          for (const t of done.next?.tasks ?? []) this.start(t);
        } else {
          await this.client.fail(task.id, task.token, String(value), { retry });
          if (ctx.reason === "cancel_requested") this.stats.cancelled += 1;
          else this.stats.failed += 1;
        }
        return;
      } catch (e) {
        if (e instanceof Conflict) {
          if (await this.wasOurs(task, kind)) {
            // Applied on a try whose answer was lost; the retry saw 409.
            this.adoptSoon(); // that answer may have carried a next task
            if (kind === "complete") this.stats.completed += 1;
            else if (ctx.reason === "cancel_requested") this.stats.cancelled += 1;
            else this.stats.failed += 1;
            return;
          }
          this.log(`task ${task.id}: ${kind} refused, token ${task.token} is stale (${e.message}): result dropped`);
          this.stats.stale += 1;
          ctx.cancel("stale");
          return;
        }
        if (e instanceof NotFound) {
          this.stats.stale += 1;
          ctx.cancel("stale");
          return;
        }
        if (!(e instanceof Unavailable)) throw e;
        this.stats.transientErrors += 1;
        this.log(`task ${task.id}: ${kind} failed, retrying: ${e.message}`);
        await sleep(delay * (0.5 + Math.random() / 2));
        delay = Math.min(delay * 2, 2000);
      }
    }
  }

  /** Whether the task's attempt with our token ended as we asked. */
  private async wasOurs(task: ClaimedTask, kind: "complete" | "fail"): Promise<boolean> {
    let now: TaskInfo;
    try {
      now = await this.client.getTask(task.id);
    } catch (e) {
      if (e instanceof MusterError) return false;
      throw e;
    }
    const want = kind === "complete" ? ["succeeded"] : ["failed", "cancelled"];
    return (now.attempt_log ?? []).some((a) => a.token === task.token && want.includes(String(a.outcome)));
  }

  /**
   * Runs one attempt inside its own trace context (trace.ts): the handler's
   * calls, the heartbeats and the report send the attempt's `traceparent`,
   * and an attempt started from another's complete (claim-next) does not
   * inherit that one's.
   */
  private runOne(task: ClaimedTask, ctx: TaskContext): Promise<void> {
    return withTraceparent(ctx.traceparent, () => this.attempt(task, ctx));
  }

  private async attempt(task: ClaimedTask, ctx: TaskContext): Promise<void> {
    // Let start() record the task before anything here can settle.
    await Promise.resolve();
    // The first heartbeat acknowledges the claim: by a third of its lease.
    // The loop starts only if the handler still runs then, so a task that
    // finishes sooner costs one timer and no request (its complete is its
    // acknowledgement).
    let beatStop: AbortController | undefined;
    let beat: Promise<void> | undefined;
    const firstBeat = setTimeout(() => {
      beatStop = new AbortController();
      beat = this.heartbeatTask(task, ctx, beatStop.signal);
    }, firstHeartbeat(this.heartbeatMs, task.ack_ms));
    try {
      let value: unknown;
      let error: unknown;
      let threw = false;
      try {
        value = await this.handler(task, ctx);
      } catch (e) {
        threw = true;
        error = e;
      } finally {
        clearTimeout(firstBeat);
        beatStop?.abort();
        await beat?.catch(() => undefined);
      }
      if (ctx.reason === "stale" || ctx.reason === "shutdown") {
        if (ctx.reason === "stale") this.stats.stale += 1;
        this.log(`task ${task.id}: result dropped (${ctx.reason})`);
        return;
      }
      if (threw) {
        // After a cancel request never retried: the server records it cancelled.
        const retry = ctx.reason !== "cancel_requested" && (!(error instanceof Fail) || error.retry);
        const msg = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
        await this.finish("fail", task, ctx, msg, retry);
      } else {
        await this.finish("complete", task, ctx, value ?? null, true);
      }
    } catch (e) {
      this.log(`task ${task.id}: ${(e as Error).message}`);
    } finally {
      this.running.delete(task.token);
      this.slotFreed.set();
    }
  }
}

function claimedFrom(t: TaskInfo, token: number): ClaimedTask {
  return {
    id: t.id,
    queue: t.queue,
    token,
    attempt: t.attempts,
    payload: t.payload,
    max_attempts: t.max_attempts,
    timeout_ms: t.timeout_ms,
    priority: t.priority,
    created_at: t.created_at,
    ...(t.group ? { group: t.group } : {}),
    ...(t.traceparent ? { traceparent: t.traceparent, tracestate: t.tracestate ?? null } : {}),
  } as ClaimedTask;
}
