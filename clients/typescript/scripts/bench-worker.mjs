// The TypeScript Worker draining no-op tasks: submits TASKS tasks (batches of
// 1 000), then runs WORKERS Workers (batch 1, claimNext: a complete claims the
// slot's next task, as `muster bench --batch 1` does over raw HTTP) until every
// task has succeeded, and prints {"tasks", "seconds", "tasks_per_sec"}.
// usage: node scripts/bench-worker.mjs URL TASKS WORKERS   (after `npm run build`)
import { Client, Worker } from "../dist/index.js";

const [url = "http://127.0.0.1:7700", n = "10000", workers = "8"] = process.argv.slice(2);
const total = Number(n);
const queue = `bench-ts-${process.pid}`;
const token = process.env.MUSTER_TOKEN;
const client = new Client(url, { token });
for (let i = 0; i < total; i += 1000) {
  const specs = Array.from({ length: Math.min(1000, total - i) }, () => ({ payload: null }));
  await client.submitBatch(queue, specs);
}
let done = 0;
let finish;
const finished = new Promise((r) => (finish = r));
const ws = Array.from({ length: Number(workers) }, (_, k) =>
  new Worker(url, queue, async () => {
    if (++done === total) finish();
    return null;
  }, { token, workerId: `bench-ts-${process.pid}-${k}`, pollMs: 1000, handleSignals: false, log: () => {} }),
);
const t0 = performance.now();
const runs = ws.map((w) => w.run());
await finished;
// The last complete is sent after the handler returns: wait for the queue.
for (;;) {
  const q = await client.getQueue(queue);
  if (q.succeeded >= total) break;
  await new Promise((r) => setTimeout(r, 5));
}
const seconds = (performance.now() - t0) / 1000;
for (const w of ws) w.stop();
await Promise.all(runs);
console.log(JSON.stringify({ tasks: total, seconds, tasks_per_sec: total / seconds }));
