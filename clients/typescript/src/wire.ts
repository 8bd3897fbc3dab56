/**
 * HTTP/1.1 over keep-alive sockets: the one path every REST call takes.
 *
 * Why not fetch or node:http: a worker sends one small request per task, and
 * on this path Node's fetch (undici: WHATWG streams, Request, Headers,
 * AbortSignal) spends about 280 µs of CPU per request and node:http (Agent,
 * ClientRequest, IncomingMessage, stream machinery) about 55 µs, against 8 µs
 * for one write and one parse on a socket (measured on the bench machine,
 * BENCHMARKS.md). On two shared cores that CPU is taken from the node and
 * Redis the worker talks to.
 *
 * What it speaks, and its invariants:
 * - One request at a time per connection (no pipelining); a request is one
 *   write of head and body. Idle connections are reused newest first, and
 *   one idle for longer than `IDLE_MS` is closed instead (muster closes
 *   idle connections after `server.idle_timeout_ms`, 60 s by default), so
 *   a request does not go out on a connection the server is closing.
 * - Idle connections are unref'd: they never keep the process alive.
 * - Answers: a status line and headers, then a body delimited by
 *   `content-length`, by chunked transfer coding, or by the connection's
 *   close; none for HEAD, 1xx, 204 and 304. Interim 1xx answers are
 *   skipped. An answer with `connection: close` (or HTTP/1.0 without
 *   keep-alive) closes the connection after it.
 * - Anything else (a connection error or close before the answer is
 *   complete, a malformed answer, bytes after the answer) rejects the
 *   request and destroys the connection: the caller's failover decides.
 * - Header names and values with CR or LF are refused before anything is
 *   sent (no header injection).
 */

import * as net from "node:net";
import * as tls from "node:tls";

/** An answer as read off the wire. */
export interface Raw {
  status: number;
  statusText: string;
  text: string;
}

/** A node URL, parsed once. */
export interface Target {
  url: string;
  tls: boolean;
  hostname: string;
  port: number;
  /** The Host header: host and port as the URL has them. */
  host: string;
  /** The URL's path (no trailing slash), put before every request's. */
  prefix: string;
}

export function target(url: string): Target {
  const u = new URL(url);
  if (u.protocol !== "http:" && u.protocol !== "https:") throw new Error(`not an http(s) URL: ${url}`);
  const secure = u.protocol === "https:";
  return {
    url,
    tls: secure,
    // net.connect wants an IPv6 address without its brackets.
    hostname: u.hostname.replace(/^\[(.*)\]$/, "$1"),
    port: u.port ? Number(u.port) : secure ? 443 : 80,
    host: u.host,
    prefix: u.pathname.replace(/\/+$/, ""),
  };
}

/** How long an idle connection may wait for its next request, ms. */
export const IDLE_MS = 15_000;

const CRLF2 = Buffer.from("\r\n\r\n");
const BAD_HEADER = /[\r\n]/;

interface Pending {
  method: string;
  resolve: (r: Raw) => void;
  reject: (e: Error) => void;
}

interface Head {
  status: number;
  statusText: string;
  /** Body bytes, or -1: chunked, or until the connection closes. */
  length: number;
  chunked: boolean;
  /** Close the connection after this answer. */
  close: boolean;
}

/** One connection, and the parse of the answer it waits for. */
class Conn {
  readonly socket: net.Socket;
  idleSince = 0;
  dead = false;
  private pending: Pending | undefined;
  /** Bytes not parsed yet: of the head, or (chunked) of the body. */
  private buf: Buffer | undefined;
  private head: Head | undefined;
  private body: Buffer[] = [];
  private bodyLen = 0;

  constructor(
    to: Target,
    private readonly onFree: (c: Conn) => void,
  ) {
    this.socket = to.tls
      ? tls.connect({
          host: to.hostname,
          port: to.port,
          ALPNProtocols: ["http/1.1"],
          ...(net.isIP(to.hostname) === 0 ? { servername: to.hostname } : {}),
        })
      : net.connect(to.port, to.hostname);
    this.socket.setNoDelay(true);
    this.socket.on("data", (d: Buffer) => this.onData(d));
    this.socket.on("error", (e) => this.fail(e));
    this.socket.on("close", () => this.onClose());
  }

  send(data: string, p: Pending): void {
    this.pending = p;
    this.socket.write(data);
  }

  /** Ends the request in flight (if any) with `e` and drops the connection. */
  fail(e: Error): void {
    if (this.dead) return;
    this.dead = true;
    this.socket.destroy();
    const p = this.pending;
    this.pending = undefined;
    p?.reject(e);
  }

  private onClose(): void {
    if (this.pending && this.head && this.head.length < 0 && !this.head.chunked) {
      // A body read until the close: the close ends it.
      this.finish(undefined);
      return;
    }
    this.fail(new Error("the connection closed before the answer was complete"));
  }

  private onData(d: Buffer): void {
    if (!this.pending) {
      // Nothing was asked: a server does not talk first.
      this.fail(new Error("unexpected bytes from the server"));
      return;
    }
    try {
      if (this.head) {
        this.onBody(d);
        return;
      }
      let buf: Buffer = this.buf ? Buffer.concat([this.buf, d]) : d;
      for (;;) {
        const end = buf.indexOf(CRLF2);
        if (end < 0) {
          if (buf.length > 65_536) throw new Error("answer head too long");
          this.buf = buf;
          return;
        }
        const head = this.parseHead(buf.toString("latin1", 0, end));
        buf = buf.subarray(end + 4);
        if (head === undefined) continue; // a 1xx: the answer follows
        this.head = head;
        this.buf = undefined;
        this.onBody(buf);
        return;
      }
    } catch (e) {
      this.fail(e as Error);
    }
  }

  /**
   * The head of an answer; undefined for an interim 1xx one. Scans for the
   * three headers it needs without splitting or lower-casing the others
   * (this runs once per task).
   */
  private parseHead(text: string): Head | undefined {
    let eol = text.indexOf("\r\n");
    if (eol < 0) eol = text.length;
    // "HTTP/1.1 200 OK"
    const code = text.charCodeAt(7);
    const status = Number(text.slice(9, 12));
    if (!text.startsWith("HTTP/1.") || (code !== 48 && code !== 49) || text.charCodeAt(8) !== 32 || !(status >= 100 && status <= 999)) {
      throw new Error(`malformed status line: ${JSON.stringify(text.slice(0, Math.min(eol, 80)))}`);
    }
    if (status < 200) return undefined;
    const statusText = text.slice(13, eol);
    let length = -1;
    let chunked = false;
    let close = code === 48; // HTTP/1.0
    for (let at = eol + 2; at < text.length; at = eol + 2) {
      eol = text.indexOf("\r\n", at);
      if (eol < 0) eol = text.length;
      const colon = text.indexOf(":", at);
      if (colon <= at || colon > eol) throw new Error("malformed header line");
      const n = colon - at;
      if (n !== 14 && n !== 17 && n !== 10) continue;
      const name = text.slice(at, colon).toLowerCase();
      const value = text.slice(colon + 1, eol).trim().toLowerCase();
      if (name === "content-length") {
        length = Number(value);
        if (!Number.isSafeInteger(length) || length < 0 || value === "") throw new Error("malformed content-length");
      } else if (name === "transfer-encoding") {
        chunked = value.split(",").pop()?.trim() === "chunked";
      } else if (name === "connection") {
        if (value.includes("close")) close = true;
        else if (value.includes("keep-alive")) close = false;
      }
    }
    const method = (this.pending as Pending).method;
    if (method === "HEAD" || status === 204 || status === 304) return { status, statusText, length: 0, chunked: false, close };
    if (chunked) length = -1;
    return { status, statusText, length, chunked, close: close || (length < 0 && !chunked) };
  }

  private onBody(d: Buffer): void {
    const h = this.head as Head;
    if (h.chunked) {
      this.buf = this.buf ? Buffer.concat([this.buf, d]) : d;
      if (this.readChunks()) this.finish(this.buf);
    } else if (h.length >= 0) {
      const need = h.length - this.bodyLen;
      if (d.length < need) {
        this.body.push(d);
        this.bodyLen += d.length;
        return;
      }
      if (need > 0) this.body.push(need === d.length ? d : d.subarray(0, need));
      this.bodyLen = h.length;
      this.finish(d.subarray(need));
    } else if (d.length > 0) {
      // Until the connection closes.
      this.body.push(d);
      this.bodyLen += d.length;
    }
  }

  /** Decodes the chunks in `buf`; true once the last chunk and its trailers are in (`buf` is then what follows). */
  private readChunks(): boolean {
    let buf = this.buf as Buffer;
    for (;;) {
      const eol = buf.indexOf("\r\n");
      if (eol < 0) return false;
      const size = parseInt(buf.toString("latin1", 0, eol).split(";")[0] as string, 16);
      if (Number.isNaN(size) || size < 0) throw new Error("malformed chunk size");
      if (size === 0) {
        // Trailers, if any, then an empty line.
        const end = buf.indexOf(CRLF2, eol);
        if (end < 0) return false;
        this.buf = buf.subarray(end + 4);
        return true;
      }
      if (buf.length < eol + 2 + size + 2) return false;
      this.body.push(buf.subarray(eol + 2, eol + 2 + size));
      this.bodyLen += size;
      buf = buf.subarray(eol + 4 + size);
      this.buf = buf;
    }
  }

  /** The answer is complete; `rest` is what came after it. */
  private finish(rest: Buffer | undefined): void {
    const p = this.pending as Pending;
    const h = this.head as Head;
    const body = this.body.length === 1 ? (this.body[0] as Buffer) : Buffer.concat(this.body, this.bodyLen);
    this.pending = undefined;
    this.head = undefined;
    this.body = [];
    this.bodyLen = 0;
    this.buf = undefined;
    if (h.close || (rest !== undefined && rest.length > 0)) {
      this.dead = true;
      this.socket.destroy();
    } else {
      this.onFree(this);
    }
    p.resolve({ status: h.status, statusText: h.statusText, text: body.toString("utf8") });
  }
}

/** Throws a TypeError when a header's name or value holds CR or LF (they would end it early). */
export function checkHeaders(headers: Record<string, string>): void {
  for (const name in headers) {
    if (BAD_HEADER.test(name) || BAD_HEADER.test(headers[name] as string)) {
      throw new TypeError(`header ${JSON.stringify(name)} holds a line break`);
    }
  }
}

/** Keep-alive connections to the node URLs, one pool per URL. */
export class Wire {
  private readonly idle = new Map<string, Conn[]>();

  /**
   * Sends one request (`headers` passed by `checkHeaders`, `path` from
   * `seg` and URLSearchParams) on an idle connection to `to` (or a new one) and
   * resolves with its answer, whatever the status; rejects on a connection
   * error, after `timeoutMs` for the whole exchange, or when `signal`
   * aborts (with its reason).
   */
  request(
    to: Target,
    method: string,
    path: string,
    headers: Record<string, string>,
    body: string | undefined,
    timeoutMs: number,
    signal: AbortSignal | undefined,
  ): Promise<Raw> {
    let head = `${method} ${to.prefix}${path} HTTP/1.1\r\nhost: ${to.host}\r\n`;
    for (const name in headers) head += `${name}: ${headers[name] as string}\r\n`;
    head += `content-length: ${body === undefined ? 0 : Buffer.byteLength(body)}\r\n\r\n`;
    const data = body === undefined ? head : head + body;
    return new Promise<Raw>((resolve, reject) => {
      const conn = this.take(to);
      let settled = false;
      const timer = setTimeout(() => conn.fail(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs);
      const onAbort = (): void => {
        settled = true;
        clearTimeout(timer);
        conn.fail(new Error("aborted"));
        reject(signal?.reason);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      conn.send(data, {
        method,
        resolve: (r) => {
          if (settled) return;
          settled = true;
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          resolve(r);
        },
        reject: (e) => {
          if (settled) return;
          settled = true;
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          reject(e);
        },
      });
    });
  }

  /** The newest idle connection to `to` that may still be used, or a new one. */
  private take(to: Target): Conn {
    const list = this.idle.get(to.url);
    const now = performance.now();
    while (list && list.length > 0) {
      const c = list.pop() as Conn;
      if (c.dead) continue;
      if (now - c.idleSince > IDLE_MS) {
        c.fail(new Error("idle too long"));
        continue;
      }
      c.socket.ref();
      return c;
    }
    return new Conn(to, (c) => this.free(to.url, c));
  }

  private free(url: string, c: Conn): void {
    c.idleSince = performance.now();
    c.socket.unref();
    let list = this.idle.get(url);
    if (!list) this.idle.set(url, (list = []));
    // The oldest ones first: those past IDLE_MS go (they would not be taken).
    while (list.length > 0 && ((list[0] as Conn).dead || c.idleSince - (list[0] as Conn).idleSince > IDLE_MS)) {
      (list.shift() as Conn).fail(new Error("idle too long"));
    }
    list.push(c);
  }
}
