// The TypeScript Worker draining no-op tasks, the way `muster bench --batch 1
// --prefill` drains them over raw HTTP (src/bench.rs), so the two rates
// differ only by what drains them: a warm-up of min(2 000, TASKS) tasks on
// their own queue first (JIT, connections, the node's scripts), then TASKS
// tasks with the raw bench's payload queued (batches of 1 000) before the
// clock starts; WORKERS Workers (one Node process, concurrency 1, batch 1,
// claimNext: a complete claims the slot's next task) run until the Workers
// count TASKS completes the server acknowledged. Prints {"tasks",
// "seconds", "tasks_per_sec"}; with BENCH_CPU=1 also the process's CPU per
// task of each drain (on stderr).
// usage: node scripts/bench-worker.mjs URL TASKS WORKERS   (after `npm run build`)
import { Client, Worker } from "../dist/index.js";

const [url = "http://127.0.0.1:7700", n = "10000", workers = "8"] = process.argv.slice(2);
const total = Number(n);
const token = process.env.MUSTER_TOKEN;
const client = new Client(url, { token });
const payload = { kind: "bench", data: "x".repeat(64) };

async function fill(queue, count) {
  for (let i = 0; i < count; i += 1000) {
    const k = Math.min(1000, count - i);
    await client.submitBatch(queue, Array.from({ length: k }, () => ({ payload })));
  }
}

/** Drains `count` queued tasks of `queue`; resolves with the seconds it took. */
async function drain(queue, count) {
  const ws = Array.from({ length: Number(workers) }, (_, k) =>
    new Worker(url, queue, async () => null, {
      token,
      workerId: `${queue}-${k}`,
      pollMs: 1000,
      handleSignals: false,
      log: () => {},
    }),
  );
  const t0 = performance.now();
  const u0 = process.cpuUsage();
  const runs = ws.map((w) => w.run());
  // Until the last complete was acknowledged, as the raw bench counts.
  while (ws.reduce((sum, w) => sum + w.stats.completed, 0) < count) {
    await new Promise((r) => setTimeout(r, 1));
  }
  const seconds = (performance.now() - t0) / 1000;
  if (process.env.BENCH_CPU) { const u = process.cpuUsage(u0); console.error(`${queue}: user ${(u.user / count).toFixed(1)} us/task, system ${(u.system / count).toFixed(1)} us/task`); }
  for (const w of ws) w.stop();
  await Promise.all(runs);
  return seconds;
}

const queue = `bench-ts-${process.pid}`;
const warm = Math.min(2000, total);
await fill(`${queue}-warm`, warm);
await drain(`${queue}-warm`, warm);
await fill(queue, total);
const seconds = await drain(queue, total);
console.log(JSON.stringify({ tasks: total, seconds, tasks_per_sec: total / seconds }));
