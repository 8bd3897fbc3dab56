// BullMQ's side of scripts/mem-per-task.sh, on a fresh redis-server:
//   (cd ../shared/bench-peers/bullmq && npm install --no-audit --no-fund)
//   NODE_PATH=../shared/bench-peers/bullmq/node_modules node scripts/bullmq-mem-per-job.js <redis port> 100000 90
// BullMQ memory per queued job: N jobs with a P-byte JSON payload, addBulk 1000.
const { Queue } = require('bullmq');
const { execSync } = require('child_process');
const [port, n, plen] = process.argv.slice(2).map(Number);
const used = () => Number(execSync(`redis-cli -p ${port} info memory`).toString().match(/used_memory:(\d+)/)[1]);
(async () => {
  const q = new Queue('mem', { connection: { host: '127.0.0.1', port } });
  const data = { data: 'x'.repeat(plen - 11) };
  if (JSON.stringify(data).length !== plen) throw new Error('len ' + JSON.stringify(data).length);
  await q.add('job', data);
  await new Promise(r => setTimeout(r, 1000));
  const before = used();
  for (let done = 0; done < n; done += 1000) {
    await q.addBulk(Array.from({ length: Math.min(1000, n - done) }, () => ({ name: 'job', data })));
  }
  await new Promise(r => setTimeout(r, 2000));
  console.log(`BullMQ ${n} jobs, payload ${plen} B: ${Math.round((used() - before) / n)} bytes per job`);
  await q.close();
})();
