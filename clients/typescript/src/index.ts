/**
 * muster-client: a client and a worker library for muster.
 *
 * - `Client`: every REST operation over one or several node URLs, failing
 *   over on connection errors and 5xx; `follow` (events WebSocket with
 *   resume) and `waitForResult`.
 * - `Worker`: the worker loop (registration, claim, heartbeats with the
 *   fencing token, complete/fail, cancel, adoption, graceful stop).
 * - `MusterError` and its subclasses: a refused call with its problem+json.
 */

export { Client, TERMINAL_STATES, type ClientOptions, type NextClaim } from "./client.js";
export {
  BadRequest,
  ConnectError,
  Conflict,
  MusterError,
  NotFound,
  TooManyRequests,
  Unauthorized,
  Unavailable,
  type Problem,
} from "./errors.js";
export type { FollowOptions } from "./events.js";
export type { RequestOptions, TransportOptions } from "./http.js";
export { childTraceparent, currentTraceparent, parseTraceparent, withTraceparent, type TraceParent } from "./trace.js";
export type * from "./models.js";
export {
  Fail,
  MIN_TTL_MS,
  TaskCancelled,
  TaskContext,
  Worker,
  firstHeartbeat,
  leaseMargin,
  type CancelReason,
  type Handler,
  type WorkerOptions,
  type WorkerStats,
} from "./worker.js";
