/**
 * The events WebSocket (`/api/v1/events/ws`): `follow` with resume by
 * cursor, and a raw socket for `waitForResult`.
 *
 * Which WebSocket: Node's global one where it exists (Node 22+), else the
 * optional peer dependency `ws` (`npm install ws`), loaded only when a
 * socket is first opened: the package has no runtime dependency.
 */

import { MusterError, errorFor, type Problem } from "./errors.js";
import { USER_AGENT, sleep, type Transport } from "./http.js";
import type { Event, Gap } from "./models.js";

export interface FollowOptions {
  /** Comma-separated topics (`task.succeeded,node.*`, see docs/api.md); default all. */
  topics?: string | undefined;
  /** Only events of this queue. */
  queue?: string | undefined;
  /** Resume after this event id (the cursor): nothing after it that is still retained is missed. */
  since?: string | undefined;
  /** Yield `{type: "gap"}` items (events after `since` already trimmed); default skipped. */
  gaps?: boolean | undefined;
  /** Stops following (the generator returns). */
  signal?: AbortSignal | undefined;
}

/** A minimal socket over either implementation. */
export interface Socket {
  onMessage(f: (text: string) => void): void;
  /** Resolves when the socket is closed (by either side, or on error). */
  closed: Promise<void>;
  close(): void;
}

type WsLike = {
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: unknown) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  onopen: ((ev: unknown) => void) | null;
  close(): void;
};

type WsCtor = new (url: string, protocols?: unknown, opts?: unknown) => WsLike;

let ctorPromise: Promise<{ ctor: WsCtor; headers: boolean }> | undefined;

async function wsImpl(): Promise<{ ctor: WsCtor; headers: boolean }> {
  ctorPromise ??= (async () => {
    const g = (globalThis as { WebSocket?: unknown }).WebSocket;
    if (typeof g === "function") return { ctor: g as WsCtor, headers: false };
    try {
      const name = "ws"; // not a static import: the peer is optional
      const mod = (await import(name)) as { default?: unknown; WebSocket?: unknown };
      return { ctor: (mod.WebSocket ?? mod.default) as WsCtor, headers: true };
    } catch {
      throw new Error("follow and waitForResult need a WebSocket: Node 22+ or `npm install ws`");
    }
  })();
  return ctorPromise;
}

/** The ws:// URL of the events socket on `base`. */
export function wsUrl(base: string, q: Record<string, string | undefined>): string {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) if (v !== undefined && v !== "") p.set(k, v);
  const s = p.toString();
  return base.replace(/^http/, "ws") + "/api/v1/events/ws" + (s ? `?${s}` : "");
}

/**
 * Opens the events socket on the node requests go to now; rejects with a
 * MusterError when the node refuses the subscription (4xx), or another
 * error when it cannot be reached.
 */
export async function openSocket(
  http: Transport,
  q: { topics?: string | undefined; queue?: string | undefined; since?: string | undefined },
): Promise<Socket> {
  const { ctor, headers } = await wsImpl();
  // The global WebSocket sends no headers: the token goes in the query then.
  const url = wsUrl(http.url, { ...q, token: headers ? undefined : http.token });
  const ws = headers
    ? new ctor(url, undefined, { headers: http.headers(), maxPayload: 2 ** 24 })
    : new ctor(url);
  const buffered: string[] = [];
  let listener: ((t: string) => void) | undefined;
  let closedResolve!: () => void;
  const closed = new Promise<void>((r) => (closedResolve = r));
  // Before the open: `ws` emits the messages that came with the upgrade's
  // answer (a `since` replay does) right after `open`, in the same tick,
  // before the code after the await below runs.
  ws.onmessage = (ev) => {
    const text = typeof ev.data === "string" ? ev.data : String(ev.data);
    if (listener) listener(text);
    else buffered.push(text);
  };
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      ws.close();
      reject(new Error(`no WebSocket from ${http.url} within ${http.timeoutMs} ms`));
    }, http.timeoutMs);
    ws.onopen = () => {
      clearTimeout(timer);
      resolve();
    };
    ws.onerror = (ev) => {
      clearTimeout(timer);
      reject(refusal(ev, url));
    };
    ws.onclose = () => {
      clearTimeout(timer);
      reject(new Error(`WebSocket to ${url} closed before it opened`));
      closedResolve();
    };
    // `ws` reports a refused upgrade with its status here.
    const emitter = ws as unknown as { on?: (e: string, f: (...a: unknown[]) => void) => void };
    emitter.on?.("unexpected-response", (_req: unknown, res: unknown) => {
      clearTimeout(timer);
      const r = res as { statusCode: number; on(e: string, f: (c?: Buffer) => void): void };
      const chunks: Buffer[] = [];
      r.on("data", (c) => c && chunks.push(c));
      r.on("end", () => {
        const text = Buffer.concat(chunks).toString();
        let problem: Problem;
        try {
          problem = JSON.parse(text) as Problem;
        } catch {
          problem = { detail: text };
        }
        reject(errorFor(r.statusCode, problem, "GET", url));
        ws.close();
      });
    });
  });
  ws.onerror = () => undefined;
  ws.onclose = () => closedResolve();
  return {
    onMessage(f) {
      listener = f;
      for (const t of buffered.splice(0)) f(t);
    },
    closed,
    close: () => ws.close(),
  };
}

function refusal(ev: unknown, url: string): Error {
  const e = (ev as { error?: unknown; message?: string } | undefined)?.error;
  if (e instanceof Error) return e;
  return new Error(`WebSocket to ${url} failed${(ev as { message?: string })?.message ? ": " + (ev as { message: string }).message : ""}`);
}

/** The generator behind `Client.follow`. */
export async function* followEvents(http: Transport, o: FollowOptions): AsyncGenerator<Event | Gap> {
  let since = o.since;
  let delay = http.backoffBaseMs;
  const signal = o.signal;
  while (!signal?.aborted) {
    let sock: Socket | undefined;
    try {
      sock = await openSocket(http, { topics: o.topics, queue: o.queue, since });
    } catch (e) {
      if (e instanceof MusterError && e.status >= 400 && e.status < 500) throw e;
    }
    if (sock) {
      delay = http.backoffBaseMs;
      // Messages queue here and are handed out one at a time.
      const queue: string[] = [];
      let wake: (() => void) | undefined;
      let done = false;
      sock.onMessage((t) => {
        queue.push(t);
        wake?.();
      });
      void sock.closed.then(() => {
        done = true;
        wake?.();
      });
      const onAbort = (): void => sock?.close();
      signal?.addEventListener("abort", onAbort, { once: true });
      try {
        for (;;) {
          const text = queue.shift();
          if (text === undefined) {
            if (done || signal?.aborted) break;
            await new Promise<void>((r) => (wake = r));
            wake = undefined;
            continue;
          }
          const msg = JSON.parse(text) as Record<string, unknown>;
          if (msg["type"] === "gap") {
            if (o.gaps) yield msg as unknown as Gap;
            continue;
          }
          if (msg["type"] === "lagged") {
            since = String(msg["last_id"] ?? since ?? "") || since;
            sock.close();
            break;
          }
          const ev = msg as unknown as Event;
          since = ev.id;
          yield ev;
        }
      } finally {
        signal?.removeEventListener("abort", onAbort);
        sock.close();
      }
      if (signal?.aborted) return;
    }
    http.nextUrl();
    await sleep(delay * (0.5 + Math.random() / 2), signal);
    delay = Math.min(delay * 2, http.backoffCapMs);
  }
}

export { USER_AGENT };
