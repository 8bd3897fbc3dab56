/**
 * W3C trace context for workers (issue 39): each attempt of a task gets a
 * span id of its own in the task's trace (a child of the context the task
 * was submitted with), the handler gets it as `ctx.traceparent`, and every
 * call made while the attempt runs (the handler's own calls through any
 * Client, the heartbeats, the complete or fail) sends it as the
 * `traceparent` header, so the node's spans for those calls are the
 * attempt's children.
 *
 * The current context lives in an AsyncLocalStorage: it follows the
 * handler's awaits, timers and callbacks, and never leaks into another
 * attempt. An application with an OpenTelemetry SDK can start its own
 * `process <queue>` span from `ctx.traceparent` (propagation.extract).
 */

import { AsyncLocalStorage } from "node:async_hooks";
import { randomBytes } from "node:crypto";

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** The parts of a valid `traceparent`, or undefined. */
export interface TraceParent {
  traceId: string;
  spanId: string;
  flags: string;
}

/** Parses a `traceparent` by the W3C rules (version ff, all-zero ids refused). */
export function parseTraceparent(tp: string | undefined | null): TraceParent | undefined {
  const m = TRACEPARENT.exec((tp ?? "").trim());
  if (!m) return undefined;
  const [, version, traceId, spanId, flags] = m as unknown as [string, string, string, string, string];
  if (version === "ff" || /^0+$/.test(traceId) || /^0+$/.test(spanId)) return undefined;
  return { traceId, spanId, flags };
}

/** A new span's `traceparent` in the trace `tp` names (same flags); undefined if `tp` is not valid. */
export function childTraceparent(tp: string | undefined | null): string | undefined {
  const p = parseTraceparent(tp);
  if (!p) return undefined;
  let span = randomBytes(8).toString("hex");
  while (/^0+$/.test(span) || span === p.spanId) span = randomBytes(8).toString("hex");
  return `00-${p.traceId}-${span}-${p.flags}`;
}

const current = new AsyncLocalStorage<string | undefined>();

/** The `traceparent` calls made here send (set by the worker around an attempt, or by `withTraceparent`). */
export function currentTraceparent(): string | undefined {
  return current.getStore();
}

/**
 * Runs `fn` with every client call made inside it (however deep, across
 * awaits) sending `tp` as its `traceparent`; undefined sends none.
 */
export function withTraceparent<T>(tp: string | undefined, fn: () => T): T {
  return current.run(tp, fn);
}
