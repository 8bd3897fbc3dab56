// The Client against two real nodes (test/cluster.ts): every operation of
// the OpenAPI document has a method, answers are typed, refusals are typed
// exceptions, bearer tokens are sent, and a dead URL is failed over.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  BadRequest,
  Client,
  Conflict,
  Fail,
  NotFound,
  Unauthorized,
  Unavailable,
  Worker,
  currentTraceparent,
  parseTraceparent,
} from "../src/index.js";
import { ADMIN_TOKEN, Cluster, WORKER_TOKEN, freePort, queueName, waitUntil } from "./cluster.js";

let cluster: Cluster;
before(async () => {
  cluster = await Cluster.start();
});
after(async () => {
  await cluster?.stop();
});

/** Every operation of the document, and the Client method that calls it. */
const OPERATIONS: Record<string, keyof Client> = {
  "GET /api/v1/aliases/{alias}": "getAlias",
  "GET /api/v1/barriers": "listBarriers",
  "GET /api/v1/barriers/{name}": "getBarrier",
  "PUT /api/v1/barriers/{name}": "putBarrier",
  "DELETE /api/v1/barriers/{name}": "deleteBarrier",
  "POST /api/v1/barriers/{name}/hold": "holdBarrier",
  "POST /api/v1/barriers/{name}/release": "releaseBarrier",
  "GET /api/v1/barriers/{name}/rounds": "listRounds",
  "GET /api/v1/barriers/{name}/rounds/{round}": "getRound",
  "POST /api/v1/barriers/{name}/rounds/{round}/arrive": "arrive",
  "POST /api/v1/barriers/{name}/wait": "waitBarrier",
  "GET /api/v1/dead": "listDead",
  "POST /api/v1/dead/discard": "discardDead",
  "POST /api/v1/dead/retry": "retryDead",
  "GET /api/v1/double-barriers": "listDoubleBarriers",
  "GET /api/v1/double-barriers/{name}": "getDoubleBarrier",
  "POST /api/v1/double-barriers/{name}/enter": "enterDoubleBarrier",
  "POST /api/v1/double-barriers/{name}/leave": "leaveDoubleBarrier",
  "GET /api/v1/elections": "listElections",
  "GET /api/v1/elections/{name}": "getElection",
  "POST /api/v1/elections/{name}/campaign": "campaign",
  "POST /api/v1/elections/{name}/resign": "resign",
  "GET /api/v1/events": "events",
  "GET /api/v1/events/ws": "follow",
  "GET /api/v1/failover": "failoverStatus",
  "GET /api/v1/groups": "listGroups",
  "PUT /api/v1/groups/{group}": "setGroupLimit",
  "GET /api/v1/limits": "listLimits",
  "GET /api/v1/limits/{name}": "getLimit",
  "PUT /api/v1/limits/{name}": "setLimit",
  "DELETE /api/v1/limits/{name}": "deleteLimit",
  "GET /api/v1/queues/{queue}/limits": "queueLimits",
  "PUT /api/v1/queues/{queue}/limits": "setQueueLimits",
  "GET /api/v1/live": "live",
  "GET /api/v1/locks": "listLocks",
  "GET /api/v1/locks/{name}": "getLock",
  "DELETE /api/v1/locks/{name}": "breakLock",
  "POST /api/v1/locks/{name}/acquire": "acquireLock",
  "POST /api/v1/locks/{name}/release": "releaseLock",
  "POST /api/v1/locks/{name}/renew": "renewLock",
  "GET /api/v1/nodes": "listNodes",
  "GET /api/v1/nodes/{id}": "getNode",
  "DELETE /api/v1/nodes/{id}": "deleteNode",
  "POST /api/v1/nodes/{id}/drain": "drainNode",
  "PUT /api/v1/nodes/{id}/heartbeat": "heartbeatNode",
  "POST /api/v1/nodes/{id}/leave": "leaveWorker",
  "GET /api/v1/openapi.json": "openapi",
  "GET /api/v1/orphans": "orphans",
  "GET /api/v1/queues": "listQueues",
  "GET /api/v1/queues/{queue}": "getQueue",
  "POST /api/v1/queues/{queue}/claim": "claim",
  "POST /api/v1/queues/{queue}/pause": "pauseQueue",
  "POST /api/v1/queues/{queue}/resume": "resumeQueue",
  "GET /api/v1/queues/{queue}/tasks": "listTasks",
  "POST /api/v1/queues/{queue}/tasks": "submit",
  "POST /api/v1/queues/{queue}/tasks/batch": "submitBatch",
  "GET /api/v1/redis": "redisInfo",
  "GET /api/v1/schedules": "listSchedules",
  "POST /api/v1/schedules": "createSchedule",
  "GET /api/v1/schedules/{id}": "getSchedule",
  "PUT /api/v1/schedules/{id}": "putSchedule",
  "DELETE /api/v1/schedules/{id}": "deleteSchedule",
  "POST /api/v1/schedules/{id}/disable": "disableSchedule",
  "POST /api/v1/schedules/{id}/enable": "enableSchedule",
  "POST /api/v1/schedules/{id}/trigger": "triggerSchedule",
  "GET /api/v1/stats": "stats",
  "POST /api/v1/tasks/complete": "completeBatch",
  "GET /api/v1/tasks/{id}": "getTask",
  "DELETE /api/v1/tasks/{id}": "deleteTask",
  "POST /api/v1/tasks/{id}/ack": "ackTask",
  "POST /api/v1/tasks/{id}/cancel": "cancel",
  "POST /api/v1/tasks/{id}/complete": "complete",
  "POST /api/v1/tasks/{id}/fail": "fail",
  "POST /api/v1/tasks/{id}/heartbeat": "heartbeatTask",
  "POST /api/v1/tasks/{id}/retry": "retryTask",
  "GET /api/v1/workflows": "listWorkflows",
  "POST /api/v1/workflows": "startWorkflow",
  "GET /api/v1/workflows/{id}": "getWorkflow",
  "POST /api/v1/workflows/{id}/cancel": "cancelWorkflow",
  "GET /healthz": "healthz",
  "GET /metrics": "metrics",
  "GET /readyz": "readyz",
};

test("every operation of the OpenAPI document has a Client method", async () => {
  const c = new Client(cluster.urls, { token: ADMIN_TOKEN });
  const doc = (await c.openapi()) as { paths: Record<string, Record<string, unknown>> };
  const missing: string[] = [];
  for (const [path, ops] of Object.entries(doc.paths)) {
    if (path.startsWith("/internal/")) continue; // node-to-node, not a client's
    for (const method of Object.keys(ops)) {
      if (!["get", "put", "post", "delete", "patch"].includes(method)) continue;
      const key = `${method.toUpperCase()} ${path}`;
      const name = OPERATIONS[key];
      if (!name || typeof Client.prototype[name] !== "function") missing.push(key);
    }
  }
  assert.deepEqual(missing, [], "operations without a Client method");
});

test("submit, claim, heartbeat, complete; a second complete is a Conflict", async (t) => {
  const q = queueName(t.name);
  const c = new Client(cluster.urls, { token: WORKER_TOKEN });
  const s = await c.submit(q, { n: 1 }, { max_attempts: 2 });
  assert.equal(s.state, "queued");
  const again = await c.submit(q, { n: 1 }, { idempotency_key: "k-1" });
  const replay = await c.submit(q, { n: 1 }, { idempotency_key: "k-1" });
  assert.equal(replay.id, again.id);
  assert.equal(replay.replayed, true);
  await c.heartbeatNode("ts-raw", { ttl_ms: 10_000 });
  const [task] = await c.claim(q, "ts-raw", { max: 1 });
  assert.ok(task);
  assert.equal(task.id, s.id);
  assert.ok(task.token > 0 && task.ack_ms > 0);
  const hb = await c.heartbeatTask(task.id, task.token, { progress: 50 });
  assert.equal(hb.cancel_requested, false);
  const done = await c.complete(task.id, task.token, { ok: true });
  assert.equal(done.state, "succeeded");
  await assert.rejects(c.complete(task.id, task.token, { ok: 2 }), Conflict);
  const got = await c.getTask(task.id);
  assert.deepEqual(got.result, { ok: true });
  assert.equal(got.attempt_log.length, 1);
});

test("flow-control limits: define, bind a queue, submit with a task's own, read the use, remove", async (t) => {
  const q = queueName(t.name);
  const c = new Client(cluster.urls, { token: ADMIN_TOKEN });
  const made = await c.setLimit(`${q}-api`, { concurrency: 1, rate: { max: 100, per_ms: 1000, burst: 5 } });
  assert.equal(made.concurrency, 1);
  await c.setLimit(`${q}-tenant:*`, { concurrency: 2 });
  assert.deepEqual((await c.setQueueLimits(q, [`${q}-api`])).limits, [`${q}-api`]);
  assert.deepEqual((await c.queueLimits(q)).limits, [`${q}-api`]);
  const s = await c.submit(q, { n: 1 }, { limits: [`${q}-tenant:acme`] });
  await c.heartbeatNode("ts-lim", { ttl_ms: 10_000 });
  const [task] = await c.claim(q, "ts-lim", { max: 5 });
  assert.ok(task);
  assert.equal(task.id, s.id);
  assert.equal((await c.getLimit(`${q}-tenant:acme`)).running, 1);
  await c.complete(task.id, task.token, null);
  assert.equal((await c.getLimit(`${q}-api`)).running, 0);
  const names = ((await c.listLimits()).limits as { name: string }[]).map((l) => l.name);
  assert.ok(names.includes(`${q}-api`) && names.includes(`${q}-tenant:*`));
  await assert.rejects(c.submit(q, 1, { limits: ["nope"] }), Conflict);
  await c.setQueueLimits(q, []);
  await c.deleteLimit(`${q}-api`);
  await assert.rejects(c.getLimit(`${q}-api`), NotFound);
});

test("refusals are typed: NotFound, BadRequest, Unauthorized, with the problem's fields", async () => {
  const c = new Client(cluster.urls, { token: ADMIN_TOKEN });
  const e = await c.getTask("01ARZ3NDEKTSV4RRFFQ69G5FAV").catch((x: unknown) => x);
  assert.ok(e instanceof NotFound, String(e));
  assert.equal(e.status, 404);
  assert.ok(e.detail.length > 0);
  await assert.rejects(c.claim("bad queue name!", "n", {}), BadRequest);
  const anon = new Client(cluster.urls);
  await assert.rejects(anon.listQueues(), Unauthorized);
  const wrong = new Client(cluster.urls, { token: "wrong" });
  await assert.rejects(wrong.listQueues(), Unauthorized);
});

test("a dead URL first in the list is failed over; no node at all is Unavailable", async (t) => {
  const dead = `http://127.0.0.1:${await freePort()}`;
  const c = new Client([dead, ...cluster.urls], { token: WORKER_TOKEN });
  const s = await c.submit(queueName(t.name), null);
  assert.equal(s.state, "queued");
  assert.ok(c.failovers >= 1);
  assert.notEqual(c.url, dead);
  const none = new Client([dead], { token: WORKER_TOKEN, retryForMs: 300 });
  await assert.rejects(none.listQueues(), Unavailable);
});

test("waitForResult returns the finished task; follow sees its event", async (t) => {
  const q = queueName(t.name);
  const c = new Client(cluster.urls, { token: ADMIN_TOKEN });
  const s = await c.submit(q, { x: 1 });
  const ac = new AbortController();
  const seen: string[] = [];
  const following = (async () => {
    for await (const ev of c.follow({ topics: "task.succeeded", queue: q, since: "0", signal: ac.signal })) {
      if ("id" in ev && ev.task) seen.push(ev.task);
      if (seen.includes(s.id)) ac.abort();
    }
  })();
  const waiting = c.waitForResult(s.id, 10_000);
  // Another worker id than the test above's: a worker id belongs to the
  // token that registered it while it lives (this one is the admin's).
  await c.heartbeatNode("ts-raw-wait", { ttl_ms: 10_000 });
  const [task] = await c.claim(q, "ts-raw-wait");
  assert.ok(task);
  await c.complete(task.id, task.token, "r");
  const done = await waiting;
  assert.equal(done.state, "succeeded");
  assert.equal(done.result, "r");
  await following;
  assert.deepEqual(seen, [s.id]);
});

test("each attempt gets a span of its own in the task's trace, and its calls carry it", async (t) => {
  const q = queueName(t.name);
  const c = new Client(cluster.urls, { token: ADMIN_TOKEN });
  const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  // Queued before the worker starts (concurrency 1): "plain" has no
  // context and is claimed by "first"'s complete (claim-next), inside that
  // attempt: it must not inherit its context.
  const first = await c.submit(q, "first", { traceparent: caller });
  const plain = await c.submit(q, "plain");
  const traced = await c.submit(q, "traced", { traceparent: caller, max_attempts: 3, backoff_base_ms: 10, backoff_cap_ms: 10 });
  const seen: { payload: unknown; tp: string | undefined; current: string | undefined; child: string }[] = [];
  const worker = new Worker(cluster.urls, q, async (task, ctx) => {
    await new Promise((r) => setTimeout(r, 5));
    // Submitted from the handler with no traceparent of its own: the
    // worker's context is what it carries.
    const child = await c.submit(`${q}-children`, task.attempt);
    seen.push({ payload: task.payload, tp: ctx.traceparent, current: currentTraceparent(), child: child.id });
    if (task.payload === "traced" && task.attempt === 1) throw new Fail("first attempt fails");
    return "ok";
  }, { token: WORKER_TOKEN, handleSignals: false, pollMs: 200, log: () => undefined });
  const running = worker.run();
  try {
    await waitUntil("the tasks done", async () =>
      (await Promise.all([first, plain, traced].map((t) => c.getTask(t.id)))).every((t) => t.state === "succeeded"));
  } finally {
    worker.stop();
    await running;
  }
  const mine = seen.filter((s) => s.payload === "traced");
  assert.equal(mine.length, 2);
  const root = parseTraceparent(caller);
  const spans = new Set<string>();
  for (const s of mine) {
    const p = parseTraceparent(s.tp);
    assert.ok(p, `an attempt's traceparent: ${String(s.tp)}`);
    assert.equal(p.traceId, root?.traceId);
    assert.equal(p.flags, "01");
    assert.notEqual(p.spanId, root?.spanId);
    spans.add(p.spanId);
    assert.equal(s.current, s.tp);
    assert.equal((await c.getTask(s.child)).traceparent, s.tp, "a call made in the attempt sends its traceparent");
  }
  assert.equal(spans.size, 2, "each attempt has a span of its own");
  assert.equal((await c.getTask(traced.id)).traceparent, caller, "retries keep the task's context");
  const other = seen.filter((s) => s.payload === "plain");
  assert.equal(other.length, 1);
  assert.equal(seen[1]?.payload, "plain", "claimed by the first task's complete");
  assert.equal(other[0]?.tp, undefined);
  assert.equal(other[0]?.current, undefined, "no context leaks from one attempt into the next");
  assert.equal((await c.getTask(other[0]?.child ?? "")).traceparent ?? undefined, undefined);
});
