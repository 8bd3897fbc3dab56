// A worker process for the conformance suite: the scripted handler under a
// Worker of its own, SIGTERM and SIGINT handled by the Worker. Each handler
// event is appended to OUT as a JSON line, then {"event":"exit",...}.
// Usage: node conformance_worker.js URLS TOKEN QUEUE OUT ID TTL_MS GRACE_MS

import { appendFileSync } from "node:fs";

import { Worker } from "../src/index.js";
import { scriptedHandler } from "./scripted.js";

const [urls, token, queue, out, id, ttl, grace] = process.argv.slice(2);
if (!urls || !token || !queue || !out || !id) throw new Error("usage: URLS TOKEN QUEUE OUT ID TTL_MS GRACE_MS");
const note = (e: object): void => appendFileSync(out, JSON.stringify(e) + "\n");
const w = new Worker(urls.split(","), queue, scriptedHandler(note), {
  token,
  workerId: id,
  ttlMs: Number(ttl ?? 1000),
  graceMs: Number(grace ?? 30_000),
  pollMs: 1000,
  heartbeatMs: 300,
});
const stats = await w.run();
note({ event: "exit", stats });
