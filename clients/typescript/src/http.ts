/**
 * One request with failover over several node URLs.
 *
 * A request goes to the node that answered last. A connection error, a
 * timeout or a 5xx moves it to the next URL at once; after every URL failed
 * once in a row it backs off (exponential with jitter, `backoffBaseMs` to
 * `backoffCapMs`) and goes round again, until `retryForMs` has passed; then
 * the last error is thrown. A 4xx is the answer: it is thrown at once as a
 * MusterError and never retried. Retrying is safe: a 503 from muster means
 * not applied or unknown (docs/api.md), heartbeat, complete and fail are
 * fenced by the token (a second one gets 409), and `submit` sends an
 * idempotency key (a random one unless given).
 */

import { ConnectError, MusterError, errorFor, type Problem } from "./errors.js";
import { currentTraceparent } from "./trace.js";
import { Wire, checkHeaders, target, type Raw, type Target } from "./wire.js";

export interface TransportOptions {
  /** A bearer token (docs/configuration.md: its role must allow the calls). */
  token?: string | undefined;
  /** Per-try timeout in ms (a long poll adds its wait). Default 10 000. */
  timeoutMs?: number | undefined;
  /** How long a call keeps retrying transient errors, in ms. Default 30 000. */
  retryForMs?: number | undefined;
  /** First pause after every URL failed once, in ms. Default 50. */
  backoffBaseMs?: number | undefined;
  /** Longest pause, in ms. Default 2 000. */
  backoffCapMs?: number | undefined;
}

export interface RequestOptions {
  json?: unknown;
  query?: Record<string, string | number | boolean | undefined | null>;
  headers?: Record<string, string>;
  /** Lengthens the timeout of a long poll by this many ms. */
  waitMs?: number | undefined;
  /** false: one try only (the error is thrown after moving to the next URL). */
  retry?: boolean;
  retryForMs?: number | undefined;
  timeoutMs?: number | undefined;
  /** Aborts the call (the error thrown is the signal's reason). */
  signal?: AbortSignal | undefined;
}

export interface Answer {
  status: number;
  body: unknown;
  text: string;
}

export const USER_AGENT = "muster-client-typescript/0.1";

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, Math.max(0, ms));
    function done(): void {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** One path segment, escaped. */
export function seg(s: string): string {
  return encodeURIComponent(s);
}

function query(q: RequestOptions["query"]): string {
  if (!q) return "";
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) if (v !== undefined && v !== null) p.set(k, String(v));
  const s = p.toString();
  return s ? `?${s}` : "";
}

export class Transport {
  readonly urls: string[];
  readonly token: string | undefined;
  readonly timeoutMs: number;
  readonly retryForMs: number;
  readonly backoffBaseMs: number;
  readonly backoffCapMs: number;
  /** Requests sent to another URL after an error (for tests and metrics). */
  failovers = 0;
  private current = 0;
  /** `urls`, parsed once. */
  private readonly targets: Target[];
  /** Keep-alive connections to `urls` (wire.ts says why not fetch). */
  private readonly wire = new Wire();

  constructor(urls: string | readonly string[], opts: TransportOptions = {}) {
    this.urls = (typeof urls === "string" ? [urls] : [...urls]).map((u) => u.replace(/\/+$/, ""));
    if (this.urls.length === 0) throw new Error("at least one node URL is needed");
    this.targets = this.urls.map(target);
    this.token = opts.token;
    this.timeoutMs = opts.timeoutMs ?? 10_000;
    this.retryForMs = opts.retryForMs ?? 30_000;
    this.backoffBaseMs = opts.backoffBaseMs ?? 50;
    this.backoffCapMs = opts.backoffCapMs ?? 2_000;
  }

  /** The node requests go to now. */
  get url(): string {
    return this.urls[this.current] as string;
  }

  /** Moves the next request to the next URL. */
  nextUrl(): void {
    this.current = (this.current + 1) % this.urls.length;
    this.failovers += 1;
  }

  headers(extra?: Record<string, string>): Record<string, string> {
    const h: Record<string, string> = { "user-agent": USER_AGENT };
    // Inside a worker's attempt (or withTraceparent) every call carries the
    // attempt's trace context; a header the caller gives wins.
    const tp = currentTraceparent();
    if (tp !== undefined) h["traceparent"] = tp;
    Object.assign(h, extra);
    if (this.token) h["authorization"] = `Bearer ${this.token}`;
    return h;
  }

  /** Sends one request with failover; resolves with a 2xx or 3xx answer. */
  async request(method: string, path: string, o: RequestOptions = {}): Promise<Answer> {
    const deadline = Date.now() + (o.retryForMs ?? this.retryForMs);
    const perTry = (o.timeoutMs ?? this.timeoutMs) + (o.waitMs ?? 0);
    const headers = this.headers(o.headers);
    checkHeaders(headers);
    let body: string | undefined;
    if (o.json !== undefined) {
      body = JSON.stringify(o.json);
      headers["content-type"] = "application/json";
    }
    const q = query(o.query);
    let delay = this.backoffBaseMs;
    let failedInRow = 0;
    for (;;) {
      const to = this.targets[this.current] as Target;
      const url = to.url + path + q;
      let err: MusterError;
      try {
        if (o.signal?.aborted) throw o.signal.reason;
        const resp = await this.wire.request(to, method, path + q, headers, body, perTry, o.signal);
        if (resp.status < 400) {
          return { status: resp.status, text: resp.text, body: resp.text ? parseJson(resp.text) : undefined };
        }
        err = errorFor(resp.status, problemOf(resp, resp.text), method, url);
        if (resp.status < 500) throw err;
      } catch (e) {
        if (e instanceof MusterError && e.status < 500) throw e;
        if (o.signal?.aborted) throw o.signal.reason ?? e;
        err = e instanceof MusterError ? e : new ConnectError(describe(e), method, url);
      }
      // The next call, or the next try, goes to the next node.
      this.nextUrl();
      if (o.retry === false || Date.now() >= deadline) throw err;
      failedInRow += 1;
      if (failedInRow % this.urls.length === 0) {
        const pause = Math.min(delay * (0.5 + Math.random() / 2), Math.max(0, deadline - Date.now()));
        await sleep(pause, o.signal);
        delay = Math.min(delay * 2, this.backoffCapMs);
      }
    }
  }
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function problemOf(resp: Raw, text: string): Problem {
  const body = parseJson(text);
  if (body && typeof body === "object" && !Array.isArray(body)) return body as Problem;
  return { title: resp.statusText, detail: text.slice(0, 500) };
}

function describe(e: unknown): string {
  if (e instanceof Error) {
    const cause = (e as { cause?: unknown }).cause;
    return cause instanceof Error ? `${e.message}: ${cause.message}` : e.message;
  }
  return String(e);
}
