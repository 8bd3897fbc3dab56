// The conformance suite's handler (tests/conformance/README.md#the-handler):
// its behaviour comes from the task's payload; every start and abort is
// reported to `note`.

import { Fail, type ClaimedTask, type TaskContext } from "../src/index.js";

export interface HandlerEvent {
  event: "start" | "aborted";
  task: string;
  attempt: number;
  reason?: string | undefined;
}

function aborted(signal: AbortSignal, ms: number): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(resolve, ms);
    signal.addEventListener(
      "abort",
      () => {
        clearTimeout(t);
        resolve();
      },
      { once: true },
    );
  });
}

export function scriptedHandler(note: (e: HandlerEvent) => void) {
  return async (task: ClaimedTask, ctx: TaskContext): Promise<unknown> => {
    const p = (task.payload ?? {}) as Record<string, unknown>;
    note({ event: "start", task: task.id, attempt: task.attempt });
    if (typeof p["fail_until"] === "number" && task.attempt < p["fail_until"]) {
      throw new Fail(`planned failure on attempt ${task.attempt}`);
    }
    const on = p["block_attempts"];
    if (p["block"] === true && (!Array.isArray(on) || on.includes(task.attempt))) {
      await aborted(ctx.signal, typeof p["block_ms"] === "number" ? p["block_ms"] : 30_000);
      if (ctx.signal.aborted) note({ event: "aborted", task: task.id, attempt: task.attempt, reason: ctx.reason });
    }
    if (typeof p["sleep_ms"] === "number") await aborted(ctx.signal, p["sleep_ms"]);
    if (ctx.reason === "cancel_requested" && p["on_cancel"] !== "return") ctx.signal.throwIfAborted();
    return { echo: p["echo"] ?? null, attempt: task.attempt, by: ctx.workerId };
  };
}
