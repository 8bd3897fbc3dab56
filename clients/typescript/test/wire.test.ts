// wire.ts against a scripted TCP server: the answer framings it must read
// (content-length, chunked, until close, interim 1xx, none for HEAD and
// 204), keep-alive reuse, a connection the server closed while idle, a
// connection that dies mid-answer, the timeout, the abort, and header
// injection refused.

import assert from "node:assert/strict";
import * as net from "node:net";
import { after, before, test } from "node:test";

import { Transport } from "../src/http.js";
import { Wire, checkHeaders, target, type Target } from "../src/wire.js";

/** What the server answers to a request line (e.g. "GET /cl HTTP/1.1"). */
const ANSWERS: Record<string, string | ((s: net.Socket) => void)> = {
  "GET /cl": "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
  "GET /chunked": "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n",
  "GET /close": "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
  "GET /until-close": (s) => s.end("HTTP/1.1 200 OK\r\n\r\nall of it"),
  "GET /interim": "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nhi",
  "HEAD /cl": "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
  "DELETE /none": "HTTP/1.1 204 No Content\r\n\r\n",
  "GET /problem": 'HTTP/1.1 404 Not Found\r\ncontent-type: application/problem+json\r\ncontent-length: 29\r\n\r\n{"title":"Not Found","x":"y"}',
  "GET /cut": (s) => s.end("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nonly"),
  "GET /slow": () => undefined,
  // The answer in small pieces.
  "GET /pieces": (s) => {
    const all = "HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello world";
    let i = 0;
    const t = setInterval(() => {
      s.write(all.slice(i, i + 3));
      i += 3;
      if (i >= all.length) clearInterval(t);
    }, 2);
  },
};

let server: net.Server;
let to: Target;
/** Connections the server accepted. */
let accepted = 0;
const sockets = new Set<net.Socket>();
/** The head of the last request, as the server read it. */
let lastHead = "";

before(async () => {
  server = net.createServer((s) => {
    accepted += 1;
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
    let buf = "";
    s.on("data", (d) => {
      buf += d.toString("latin1");
      for (;;) {
        const end = buf.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = buf.slice(0, end);
        const len = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
        if (buf.length < end + 4 + len) return;
        buf = buf.slice(end + 4 + len);
        lastHead = head;
        const [method, path] = (head.split("\r\n")[0] ?? "").split(" ");
        const a = ANSWERS[`${method} ${path}`] ?? "HTTP/1.1 500 Oops\r\ncontent-length: 0\r\n\r\n";
        if (typeof a === "string") s.write(a);
        else a(s);
      }
    });
    s.on("error", () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  to = target(`http://127.0.0.1:${(server.address() as net.AddressInfo).port}`);
});

after(() => {
  for (const s of sockets) s.destroy();
  server.close();
});

const get = (w: Wire, path: string, o: { method?: string; timeoutMs?: number; signal?: AbortSignal } = {}) =>
  w.request(to, o.method ?? "GET", path, { "user-agent": "test" }, undefined, o.timeoutMs ?? 2000, o.signal);

test("reads an answer by content-length, chunked, until close, after a 1xx, and none for HEAD and 204", async () => {
  const w = new Wire();
  assert.deepEqual(await get(w, "/cl"), { status: 200, statusText: "OK", text: "hello" });
  assert.equal((await get(w, "/chunked")).text, "hello world");
  assert.equal((await get(w, "/until-close")).text, "all of it");
  assert.deepEqual(await get(w, "/interim"), { status: 201, statusText: "Created", text: "hi" });
  assert.equal((await get(w, "/cl", { method: "HEAD" })).text, "");
  assert.equal((await get(w, "/none", { method: "DELETE" })).status, 204);
  assert.equal((await get(w, "/pieces")).text, "hello world");
  assert.match(lastHead, /^GET \/pieces HTTP\/1\.1\r\nhost: 127\.0\.0\.1:\d+\r\nuser-agent: test\r\ncontent-length: 0$/);
});

test("keeps a connection alive between requests, and not after connection: close", async () => {
  const w = new Wire();
  const before = accepted;
  for (let i = 0; i < 5; i++) await get(w, "/cl");
  assert.equal(accepted - before, 1);
  await get(w, "/close");
  await get(w, "/cl");
  assert.equal(accepted - before, 2);
  // Concurrent requests each get a connection; then they are all reused.
  await Promise.all([get(w, "/cl"), get(w, "/cl"), get(w, "/cl")]);
  const now = accepted;
  await Promise.all([get(w, "/cl"), get(w, "/cl"), get(w, "/cl")]);
  assert.equal(accepted, now);
});

test("a connection the server closed while idle is not used again", async () => {
  const w = new Wire();
  await get(w, "/cl");
  for (const s of sockets) s.destroy();
  await new Promise((r) => setTimeout(r, 50));
  assert.equal((await get(w, "/cl")).text, "hello");
});

test("a connection that closes mid-answer, a timeout and an abort reject the request", async () => {
  const w = new Wire();
  await assert.rejects(get(w, "/cut"), /closed before the answer was complete/);
  await assert.rejects(get(w, "/slow", { timeoutMs: 100 }), /timed out after 100 ms/);
  const ac = new AbortController();
  setTimeout(() => ac.abort(new Error("stop now")), 50);
  await assert.rejects(get(w, "/slow", { signal: ac.signal }), /stop now/);
  // Still usable afterwards.
  assert.equal((await get(w, "/cl")).text, "hello");
});

test("the Transport: a 4xx is a typed error with the problem's fields; a line break in a header is refused before sending", async () => {
  const t = new Transport(to.url, { retryForMs: 200 });
  await assert.rejects(t.request("GET", "/problem"), (e: Error & { status?: number; title?: string }) => {
    assert.equal(e.status, 404);
    assert.equal(e.title, "Not Found");
    return true;
  });
  assert.throws(() => checkHeaders({ "x-a": "1\r\nx-b: 2" }), TypeError);
  await assert.rejects(t.request("GET", "/cl", { headers: { "x-a": "1\r\nx-b: 2" } }), TypeError);
  assert.equal(t.failovers, 0); // a 4xx is the answer; the refused header never went out
});
