/**
 * The client: every REST operation of muster over one or several node URLs
 * (failover and retries in http.ts). Answers are typed by the OpenAPI
 * document (`api.gen.ts`, generated; `models.ts` names its schemas); errors
 * are the classes of errors.ts.
 */

import { Transport, seg, sleep, type RequestOptions, type TransportOptions } from "./http.js";
import { followEvents, openSocket, type FollowOptions } from "./events.js";
import type * as M from "./models.js";

export type ClientOptions = TransportOptions;

function randomKey(): string {
  return crypto.randomUUID().replaceAll("-", "");
}

function drop<T extends Record<string, unknown>>(o: T): Partial<T> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) if (v !== undefined && v !== null) out[k] = v;
  return out as Partial<T>;
}

/** The options of a claim that rides on a complete or fail (`next`). */
export interface NextClaim {
  max?: number;
  queue?: string;
  waitMs?: number;
  ackMs?: number;
}

function nextBody(n: NextClaim): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (n.max !== undefined) out["max"] = n.max;
  if (n.queue !== undefined) out["queue"] = n.queue;
  if (n.waitMs !== undefined) out["wait_ms"] = n.waitMs;
  if (n.ackMs !== undefined) out["ack_ms"] = n.ackMs;
  return out;
}

/** Task states after which nothing more happens to a task. */
export const TERMINAL_STATES: ReadonlySet<string> = new Set(["succeeded", "dead", "cancelled"]);

export class Client {
  /** The transport: URLs, token, failover counter. */
  readonly http: Transport;

  /** `urls`: one base URL or several (any node of the cluster will do). */
  constructor(urls: string | readonly string[], opts: ClientOptions = {}) {
    this.http = new Transport(urls, opts);
  }

  /** The node requests go to now. */
  get url(): string {
    return this.http.url;
  }

  /** Requests sent to another URL after an error. */
  get failovers(): number {
    return this.http.failovers;
  }

  /** Sends any request with failover and returns the decoded JSON body (undefined for 204). */
  async call<T = unknown>(method: string, path: string, o: RequestOptions = {}): Promise<T> {
    const a = await this.http.request(method, path, o);
    return a.body as T;
  }

  // ---- system and nodes ---------------------------------------------------

  /** Whether the node answers /healthz (one try, no failover). */
  async healthz(): Promise<boolean> {
    try {
      return (await this.http.request("GET", "/healthz", { retry: false })).status === 200;
    } catch {
      return false;
    }
  }

  /** Whether the node requests go to now is ready (one try, that node only). */
  async readyz(): Promise<boolean> {
    try {
      const r = await fetch(`${this.http.url}/readyz`, { headers: this.http.headers() });
      await r.arrayBuffer();
      return r.status === 200;
    } catch {
      return false;
    }
  }

  /** The OpenAPI document. */
  openapi(): Promise<Record<string, unknown>> {
    return this.call("GET", "/api/v1/openapi.json");
  }

  /** Redis mode, address, version, role, latency, keys, memory. */
  redisInfo(): Promise<M.RedisInfo> {
    return this.call("GET", "/api/v1/redis");
  }

  failoverStatus(): Promise<M.FailoverStatus> {
    return this.call("GET", "/api/v1/failover");
  }

  /** The node's cached live view: node states, queue counts, orphan totals, throughput. */
  live(): Promise<M.Live> {
    return this.call("GET", "/api/v1/live");
  }

  /** Outcomes per minute over the last hour (`hour`) or per day over 30 days (`month`). */
  stats(range: "hour" | "month" = "hour", queue?: string): Promise<M.StatsSeries> {
    return this.call("GET", "/api/v1/stats", { query: { range, queue } });
  }

  /** The Prometheus text of the node requests go to. */
  async metrics(): Promise<string> {
    return (await this.http.request("GET", "/metrics")).text;
  }

  /** An external worker joins or stays alive. */
  heartbeatNode(
    node: string,
    body: { ttl_ms?: number; labels?: Record<string, string>; addr?: string; version?: string } = {},
    o: RequestOptions = {},
  ): Promise<M.NodeHeartbeatAnswer> {
    return this.call("PUT", `/api/v1/nodes/${seg(node)}/heartbeat`, { ...o, json: drop(body) });
  }

  async listNodes(): Promise<M.NodeInfo[]> {
    const out = await this.call<{ nodes: M.NodeInfo[] }>("GET", "/api/v1/nodes");
    return out.nodes;
  }

  getNode(node: string): Promise<M.NodeInfo> {
    return this.call("GET", `/api/v1/nodes/${seg(node)}`);
  }

  async drainNode(node: string): Promise<void> {
    await this.http.request("POST", `/api/v1/nodes/${seg(node)}/drain`);
  }

  async deleteNode(node: string): Promise<void> {
    await this.http.request("DELETE", `/api/v1/nodes/${seg(node)}`);
  }

  /** A worker leaves: its registration goes. */
  async leaveWorker(node: string, o: RequestOptions = {}): Promise<void> {
    await this.http.request("POST", `/api/v1/nodes/${seg(node)}/leave`, o);
  }

  // ---- tasks and queues ---------------------------------------------------

  /**
   * Submits a task. Without `idempotency_key` a random one is sent, so a
   * retry after a lost answer never creates the task twice.
   */
  submit(queue: string, payload?: unknown, spec: Omit<M.TaskSpec, "payload"> = {}): Promise<M.Submitted> {
    const body = drop({ ...spec, payload, idempotency_key: spec.idempotency_key ?? randomKey() });
    return this.call("POST", `/api/v1/queues/${seg(queue)}/tasks`, { json: body });
  }

  /** Submits up to 1 000 specs in one script; each without a key gets a random one. */
  async submitBatch(queue: string, tasks: readonly M.TaskSpec[]): Promise<M.BatchItem[]> {
    const specs = tasks.map((t) => (t.idempotency_key ? t : { ...t, idempotency_key: randomKey() }));
    const out = await this.call<{ results: M.BatchItem[] }>("POST", `/api/v1/queues/${seg(queue)}/tasks/batch`, {
      json: { tasks: specs },
    });
    return out.results;
  }

  /**
   * Claims up to `max` tasks for worker `node`, long-polling up to `waitMs`;
   * an empty list when none came. Each must be acknowledged within its
   * `ack_ms` (the claim lease): a task heartbeat, `ackTask`, complete or fail.
   */
  async claim(
    queue: string,
    node: string,
    o: { max?: number; waitMs?: number; ackMs?: number; signal?: AbortSignal } = {},
  ): Promise<M.ClaimedTask[]> {
    const a = await this.http.request("POST", `/api/v1/queues/${seg(queue)}/claim`, {
      json: drop({ node, max: o.max ?? 1, wait_ms: o.waitMs ?? 0, ack_ms: o.ackMs }),
      waitMs: o.waitMs ?? 0,
      signal: o.signal,
    });
    if (a.status === 204 || a.body === undefined) return [];
    return (a.body as { tasks: M.ClaimedTask[] }).tasks;
  }

  /** Still working on it; Conflict (409) when the token is stale. `cancel_requested` asks to stop. */
  heartbeatTask(
    id: string,
    token: number,
    o: { progress?: number | undefined; fields?: Record<string, unknown> | undefined } = {},
  ): Promise<M.TaskHeartbeat> {
    return this.call("POST", `/api/v1/tasks/${seg(id)}/heartbeat`, {
      json: drop({ token, progress: o.progress, fields: o.fields }),
    });
  }

  /** Acknowledges a claim (ends its lease); Conflict when it went back to its queue. */
  ackTask(id: string, token: number): Promise<M.TaskHeartbeat> {
    return this.call("POST", `/api/v1/tasks/${seg(id)}/ack`, { json: { token } });
  }

  /** Completes a task with its token; `next` claims the worker's next task(s) in the same call. */
  complete(id: string, token: number, result?: unknown, next?: NextClaim): Promise<M.Finished> {
    // Built by hand, not with drop(): a worker sends one per task.
    const body: { token: number; result?: unknown; next?: Record<string, unknown> } = { token };
    if (result !== undefined && result !== null) body.result = result;
    if (next) body.next = nextBody(next);
    return this.call("POST", `/api/v1/tasks/${seg(id)}/complete`, { json: body, waitMs: next?.waitMs ?? 0 });
  }

  /** Completes several tasks: per-item results. */
  completeBatch(items: readonly { id: string; token: number; result?: unknown }[]): Promise<M.CompleteBatchAnswer> {
    return this.call("POST", "/api/v1/tasks/complete", { json: items });
  }

  /**
   * Fails a task with its token: retried after a backoff while attempts are
   * left (unless `retry` is false), else dead; cancelled if a cancel was
   * requested. Conflict (409) when the token is stale.
   */
  fail(id: string, token: number, error = "", o: { retry?: boolean; next?: NextClaim } = {}): Promise<M.Finished> {
    return this.call("POST", `/api/v1/tasks/${seg(id)}/fail`, {
      json: drop({ token, error, retry: o.retry ?? true, next: o.next ? nextBody(o.next) : undefined }),
      waitMs: o.next?.waitMs ?? 0,
    });
  }

  /** Cancels a queued or delayed task; asks a running one to stop. */
  cancel(id: string): Promise<M.Cancelled> {
    return this.call("POST", `/api/v1/tasks/${seg(id)}/cancel`);
  }

  /** Requeues a dead task with fresh attempts (admin). */
  retryTask(id: string): Promise<M.Task> {
    return this.call("POST", `/api/v1/tasks/${seg(id)}/retry`);
  }

  getTask(id: string): Promise<M.Task> {
    return this.call("GET", `/api/v1/tasks/${seg(id)}`);
  }

  async deleteTask(id: string): Promise<void> {
    await this.http.request("DELETE", `/api/v1/tasks/${seg(id)}`);
  }

  getAlias(alias: string): Promise<M.Task> {
    return this.call("GET", `/api/v1/aliases/${seg(alias)}`);
  }

  async listQueues(): Promise<M.QueueStats[]> {
    return (await this.call<{ queues: M.QueueStats[] }>("GET", "/api/v1/queues")).queues;
  }

  /** One queue's counts, with its groups. */
  getQueue(queue: string): Promise<M.QueueDetail> {
    return this.call("GET", `/api/v1/queues/${seg(queue)}`);
  }

  listTasks(queue: string, state: string, o: { limit?: number; cursor?: string } = {}): Promise<M.TaskPage> {
    return this.call("GET", `/api/v1/queues/${seg(queue)}/tasks`, { query: { state, ...o } });
  }

  async pauseQueue(queue: string): Promise<void> {
    await this.http.request("POST", `/api/v1/queues/${seg(queue)}/pause`);
  }

  async resumeQueue(queue: string): Promise<void> {
    await this.http.request("POST", `/api/v1/queues/${seg(queue)}/resume`);
  }

  listDead(o: { limit?: number; cursor?: string } = {}): Promise<M.TaskPage> {
    return this.call("GET", "/api/v1/dead", { query: o });
  }

  listGroups(): Promise<M.Json> {
    return this.call("GET", "/api/v1/groups");
  }

  /** Sets (or with null removes) a group's cluster-wide concurrency limit. */
  setGroupLimit(group: string, limit: number | null): Promise<M.Json> {
    return this.call("PUT", `/api/v1/groups/${seg(group)}`, { json: { limit } });
  }

  /** Every flow-control limit and template, with its use (G13). */
  listLimits(): Promise<M.Json> {
    return this.call("GET", "/api/v1/limits");
  }

  /** A limit, a template (`name:*`) or a template's key (`name:key`), and its use. */
  getLimit(name: string): Promise<M.Json> {
    return this.call("GET", `/api/v1/limits/${seg(name)}`);
  }

  /**
   * Defines or changes a limit or template (admin): a concurrency, a rate
   * (`max` tokens per `per_ms`, `burst` saved up), or both.
   */
  setLimit(
    name: string,
    spec: { concurrency?: number | null; rate?: { max: number; per_ms: number; burst: number } | null },
  ): Promise<M.Json> {
    return this.call("PUT", `/api/v1/limits/${seg(name)}`, { json: spec });
  }

  /** Removes a limit or template (admin). */
  async deleteLimit(name: string): Promise<void> {
    await this.http.request("DELETE", `/api/v1/limits/${seg(name)}`);
  }

  /** The limits that bind every task of a queue. */
  queueLimits(queue: string): Promise<M.Json> {
    return this.call("GET", `/api/v1/queues/${seg(queue)}/limits`);
  }

  /** Sets the limits that bind every task of a queue (admin); [] removes them. */
  setQueueLimits(queue: string, limits: string[]): Promise<M.Json> {
    return this.call("PUT", `/api/v1/queues/${seg(queue)}/limits`, { json: { limits } });
  }

  /** Retries dead tasks of a queue in bulk, oldest first (admin). */
  retryDead(queue: string, o: { limit?: number } = {}): Promise<M.BulkOutcome> {
    return this.call("POST", "/api/v1/dead/retry", { json: drop({ queue, limit: o.limit }) });
  }

  /** Discards dead tasks of a queue in bulk, oldest first (admin). */
  discardDead(queue: string, o: { limit?: number } = {}): Promise<M.BulkOutcome> {
    return this.call("POST", "/api/v1/dead/discard", { json: drop({ queue, limit: o.limit }) });
  }

  orphans(o: { limit?: number } = {}): Promise<M.Json> {
    return this.call("GET", "/api/v1/orphans", { query: o });
  }

  // ---- workflows ----------------------------------------------------------

  /** Starts a DAG (docs/concepts.md#workflows); a random idempotency key unless given. */
  startWorkflow(body: M.WorkflowSpec): Promise<M.Json> {
    return this.call("POST", "/api/v1/workflows", {
      json: { ...body, idempotency_key: body.idempotency_key ?? randomKey() },
    });
  }

  getWorkflow(id: string): Promise<M.Json> {
    return this.call("GET", `/api/v1/workflows/${seg(id)}`);
  }

  listWorkflows(o: { state?: string; limit?: number; cursor?: string } = {}): Promise<M.Json> {
    return this.call("GET", "/api/v1/workflows", { query: o });
  }

  cancelWorkflow(id: string): Promise<M.Json> {
    return this.call("POST", `/api/v1/workflows/${seg(id)}/cancel`);
  }

  // ---- schedules ----------------------------------------------------------

  listSchedules(): Promise<M.Json> {
    return this.call("GET", "/api/v1/schedules");
  }

  getSchedule(id: string, o: { history?: number } = {}): Promise<M.Json> {
    return this.call("GET", `/api/v1/schedules/${seg(id)}`, { query: o });
  }

  /** Creates a schedule (409 if its id exists). */
  createSchedule(schedule: M.Json): Promise<M.Json> {
    return this.call("POST", "/api/v1/schedules", { json: schedule });
  }

  putSchedule(id: string, schedule: M.Json): Promise<M.Json> {
    return this.call("PUT", `/api/v1/schedules/${seg(id)}`, { json: schedule });
  }

  async deleteSchedule(id: string, o: { force?: boolean } = {}): Promise<void> {
    await this.http.request("DELETE", `/api/v1/schedules/${seg(id)}`, { query: { force: o.force } });
  }

  /** Fires a schedule now; the key (random unless given) makes a retry return the first call's task. */
  triggerSchedule(id: string, o: { idempotencyKey?: string } = {}): Promise<M.Json> {
    return this.call("POST", `/api/v1/schedules/${seg(id)}/trigger`, {
      headers: { "idempotency-key": o.idempotencyKey ?? randomKey() },
    });
  }

  async enableSchedule(id: string): Promise<void> {
    await this.http.request("POST", `/api/v1/schedules/${seg(id)}/enable`);
  }

  async disableSchedule(id: string): Promise<void> {
    await this.http.request("POST", `/api/v1/schedules/${seg(id)}/disable`);
  }

  // ---- barriers -----------------------------------------------------------

  putBarrier(name: string, participants: readonly string[], timeoutMs: number, maxMissing = 0): Promise<M.Json> {
    return this.call("PUT", `/api/v1/barriers/${seg(name)}`, {
      json: { participants, max_missing: maxMissing, timeout_ms: timeoutMs },
    });
  }

  getBarrier(name: string): Promise<M.Json> {
    return this.call("GET", `/api/v1/barriers/${seg(name)}`);
  }

  listBarriers(): Promise<M.Json> {
    return this.call("GET", "/api/v1/barriers");
  }

  async deleteBarrier(name: string): Promise<void> {
    await this.http.request("DELETE", `/api/v1/barriers/${seg(name)}`);
  }

  /** Arrives at a round; `verdict` is released, aborted or pending. */
  arrive(name: string, round: string, node: string, waitMs = 0): Promise<M.Json> {
    return this.call("POST", `/api/v1/barriers/${seg(name)}/rounds/${seg(round)}/arrive`, {
      json: { node, wait_ms: waitMs },
      waitMs,
    });
  }

  listRounds(name: string, o: { limit?: number } = {}): Promise<M.Json> {
    return this.call("GET", `/api/v1/barriers/${seg(name)}/rounds`, { query: o });
  }

  getRound(name: string, round: string): Promise<M.Json> {
    return this.call("GET", `/api/v1/barriers/${seg(name)}/rounds/${seg(round)}`);
  }

  holdBarrier(name: string, o: { holder?: string; ttl_ms?: number } = {}): Promise<M.Json> {
    return this.call("POST", `/api/v1/barriers/${seg(name)}/hold`, { json: drop(o) });
  }

  releaseBarrier(name: string): Promise<M.Json> {
    return this.call("POST", `/api/v1/barriers/${seg(name)}/release`);
  }

  waitBarrier(name: string, waitMs = 0): Promise<M.Json> {
    return this.call("POST", `/api/v1/barriers/${seg(name)}/wait`, { json: { wait_ms: waitMs }, waitMs });
  }

  enterDoubleBarrier(name: string, node: string, count: number, waitMs = 0): Promise<M.Json> {
    return this.call("POST", `/api/v1/double-barriers/${seg(name)}/enter`, {
      json: { node, count, wait_ms: waitMs },
      waitMs,
    });
  }

  leaveDoubleBarrier(name: string, node: string, waitMs = 0): Promise<M.Json> {
    return this.call("POST", `/api/v1/double-barriers/${seg(name)}/leave`, { json: { node, wait_ms: waitMs }, waitMs });
  }

  listDoubleBarriers(): Promise<M.Json> {
    return this.call("GET", "/api/v1/double-barriers");
  }

  getDoubleBarrier(name: string): Promise<M.Json> {
    return this.call("GET", `/api/v1/double-barriers/${seg(name)}`);
  }

  // ---- locks and elections ------------------------------------------------

  /**
   * Acquires a fenced lock: the answer carries its `token`; Conflict (busy)
   * with `holder` and `position` in its problem. Not retried after an
   * unknown outcome (a lost answer could leave the lock held until its ttl).
   */
  acquireLock(name: string, owner: string, o: { ttl_ms?: number; wait_ms?: number; node?: string } = {}): Promise<M.Json> {
    return this.call("POST", `/api/v1/locks/${seg(name)}/acquire`, {
      json: drop({ owner, ...o }),
      waitMs: o.wait_ms ?? 0,
      retry: false,
    });
  }

  renewLock(name: string, token: number, o: { ttl_ms?: number } = {}): Promise<M.Json> {
    return this.call("POST", `/api/v1/locks/${seg(name)}/renew`, { json: drop({ token, ...o }) });
  }

  releaseLock(name: string, token: number): Promise<M.Json | undefined> {
    return this.call("POST", `/api/v1/locks/${seg(name)}/release`, { json: { token } });
  }

  getLock(name: string): Promise<M.Json> {
    return this.call("GET", `/api/v1/locks/${seg(name)}`);
  }

  listLocks(): Promise<M.Json> {
    return this.call("GET", "/api/v1/locks");
  }

  async breakLock(name: string): Promise<void> {
    await this.http.request("DELETE", `/api/v1/locks/${seg(name)}`);
  }

  campaign(name: string, candidate: string, o: { ttl_ms?: number; wait_ms?: number; value?: unknown } = {}): Promise<M.Json> {
    return this.call("POST", `/api/v1/elections/${seg(name)}/campaign`, {
      json: drop({ candidate, ...o }),
      waitMs: o.wait_ms ?? 0,
    });
  }

  resign(name: string, candidate: string, o: { epoch?: number } = {}): Promise<M.Json | undefined> {
    return this.call("POST", `/api/v1/elections/${seg(name)}/resign`, { json: drop({ candidate, ...o }) });
  }

  getElection(name: string): Promise<M.Json> {
    return this.call("GET", `/api/v1/elections/${seg(name)}`);
  }

  listElections(): Promise<M.Json> {
    return this.call("GET", "/api/v1/elections");
  }

  // ---- events -------------------------------------------------------------

  /** One page of the event replay over HTTP: `events`, `next` (pass as `since`), `gap`. */
  events(o: { since?: string; limit?: number; topics?: string; queue?: string } = {}): Promise<M.EventPage> {
    return this.call("GET", "/api/v1/events", { query: o });
  }

  /**
   * Follows the event stream over the WebSocket, for ever (until `signal`
   * aborts or the loop breaks): on a disconnect, a `lagged` message or a
   * node going away it reconnects (to the next URL, with backoff) with
   * `since` = the last id seen, so nothing still retained is missed or
   * repeated. Needs Node 22+ (global WebSocket) or the `ws` package.
   */
  follow(o: FollowOptions = {}): AsyncGenerator<M.Event | M.Gap> {
    return followEvents(this.http, o);
  }

  /**
   * Waits until the task is finished (succeeded, dead or cancelled) and
   * returns it; throws a TimeoutError after `timeoutMs`. Listens to the
   * terminal task events over the WebSocket when it can, and reads the task
   * on each and every `recheckMs`, so neither a reconnect nor an event
   * published before the subscription makes it wait longer than that.
   * Without a WebSocket it polls every `recheckMs`.
   */
  async waitForResult(id: string, timeoutMs: number, o: { recheckMs?: number } = {}): Promise<M.Task> {
    const recheck = o.recheckMs ?? 1000;
    const deadline = Date.now() + timeoutMs;
    const wake = new AbortController();
    let tick: AbortController = new AbortController();
    const sock = await openSocket(this.http, { topics: "task.succeeded,task.dead,task.cancelled" }).catch(() => null);
    if (sock) {
      sock.onMessage((text) => {
        if (text.includes(`"${id}"`)) tick.abort();
      });
    }
    try {
      for (;;) {
        const task = await this.getTask(id);
        if (TERMINAL_STATES.has(task.state)) return task;
        const left = deadline - Date.now();
        if (left <= 0) {
          const e = new Error(`task ${id} is still ${task.state} after ${timeoutMs} ms`);
          e.name = "TimeoutError";
          throw e;
        }
        await sleep(Math.min(recheck, left), tick.signal);
        tick = new AbortController();
      }
    } finally {
      wake.abort();
      sock?.close();
    }
  }
}
